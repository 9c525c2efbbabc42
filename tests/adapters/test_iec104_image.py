"""adapters/iec104_image.py: deadband bookkeeping of monitor objects against a written-out
reference, and commands checked before they touch a real process image."""

import math

import numpy as np
import pytest

from adapters.iec104_image import Commands, Monitor
from hil.image import ProcessImage
from hil.tagmap.iec104 import Point


def _measured(ioa, index, deadband):
    return Point(ioa, "measured", f"y{index}", index, "1", -10.0, 10.0, deadband=deadband)


def _reference(values, deadband):
    """Per step: (reported?, value) for one object, written out from the rule: report when the
    value is a number and was not at the last report, or the reverse, or moved by > deadband."""
    out, last = [], math.nan
    for v in values:
        if math.isnan(v) != math.isnan(last) or (not math.isnan(v) and abs(v - last) > deadband):
            out.append(True)
            last = v
        else:
            out.append(False)
    return out


def test_measured_values_follow_the_deadband_reference():
    rng = np.random.default_rng(7)
    series = np.cumsum(rng.normal(0.0, 0.02, size=(400, 3)), axis=0)
    series[50:53, 1] = np.nan                                     # a dropout: IV and back
    deadbands = [0.0, 0.05, 0.2]
    m = Monitor([_measured(10 + k, k, d) for k, d in enumerate(deadbands)])
    got = []
    for row in series:
        values, changed, spont = m.update(row)
        np.testing.assert_array_equal(values, row)
        got.append(spont.copy())
        # the object always serves the latest value (GI), whatever was reported
        np.testing.assert_array_equal(m.current, row)
    got = np.array(got)
    for k, d in enumerate(deadbands):
        assert got[:, k].tolist() == _reference(series[:, k].tolist(), d), k
    assert got[:, 0].all()                      # deadband 0: every change
    assert 0 < got[:, 2].sum() < got[:, 1].sum() < 400


def test_changed_is_any_change_even_below_the_deadband():
    m = Monitor([_measured(1, 0, 1.0)])
    m.update(np.array([0.0]))
    _, changed, spont = m.update(np.array([0.5]))
    assert changed[0] and not spont[0]
    _, changed, spont = m.update(np.array([0.5]))
    assert not changed[0] and not spont[0]


def test_double_points_report_state_changes_only():
    p = Point(4, "double_point", "closed", 0, "1", 0.0, 1.0, threshold=0.5)
    m = Monitor([p])
    seq = [1.0, 1.0, 0.9, 0.2, 0.0, math.nan, 1.0]
    states, reports = [], []
    for v in seq:
        values, _, spont = m.update(np.array([v]))
        states.append(values[0])
        reports.append(bool(spont[0]))
    assert states[:5] == [1.0, 1.0, 1.0, 0.0, 0.0] and math.isnan(states[5]) and states[6] == 1.0
    assert reports == [True, False, False, True, False, True, True]


@pytest.fixture()
def image():
    img = ProcessImage.create(4, 2)
    yield img
    img.close()


POINTS = [
    Point(100, "setpoint", "u0", 0, "MW", 0.0, 50.0),
    Point(101, "single_command", "u1", 1, "1", 0.0, 1.0),
    Point(102, "double_command", "u2", 2, "1", 0.0, 1.0, off_signal="u3", off_index=3, off_low=0.0, off_high=1.0),
    _measured(1, 0, 0.0),
]


def test_no_command_before_the_first_publish(image):
    cmds = Commands(POINTS, image)
    assert cmds.apply(100, 10.0) == "not_started"
    assert image.read_inputs().tolist() == [0.0] * 4
    image.publish(np.zeros(2), np.zeros(4), 0, 0.0)
    assert cmds.apply(100, 10.0) is None
    assert image.read_inputs()[0] == 10.0


def test_commands_write_or_are_refused_without_touching_the_image(image):
    image.publish(np.zeros(2), np.zeros(4), 0, 0.0)
    cmds = Commands(POINTS, image)
    writes = image.counters()["input_writes"]
    for ioa, value, reason in ((100, 50.0001, "out_of_range"), (100, -1.0, "out_of_range"),
                               (100, math.nan, "not_a_number"), (100, math.inf, "not_a_number"),
                               (1, 1.0, "unknown_ioa"), (999, 1.0, "unknown_ioa"),
                               (102, "INTERMEDIATE", "invalid_state")):
        assert cmds.apply(ioa, value) == reason, (ioa, value)
    assert image.counters()["input_writes"] == writes and image.read_inputs().tolist() == [0.0] * 4
    assert cmds.apply(100, 50.0) is None                      # a bound itself is in range
    assert cmds.apply(101, True) is None
    assert image.read_inputs().tolist() == [50.0, 1.0, 0.0, 0.0]
    assert cmds.apply(102, "OFF") is None
    assert image.read_inputs().tolist() == [50.0, 1.0, 0.0, 1.0]
    assert cmds.apply(102, "ON") is None
    assert image.read_inputs().tolist() == [50.0, 1.0, 1.0, 0.0]
    assert cmds.apply(101, False) is None
    assert image.read_inputs()[1] == 0.0
    cmds.count_refused("wrong_type")
    c = cmds.counters()
    assert c["commands_accepted"] == 5
    assert c["commands_refused"] == {"invalid_state": 1, "not_a_number": 2, "out_of_range": 2, "unknown_ioa": 2,
                                     "wrong_type": 1}


def test_pulse_commands_are_released_once_the_loop_has_read_them(image):
    image.publish(np.zeros(2), np.zeros(4), 0, 0.0)
    cmds = Commands(POINTS, image)
    assert cmds.apply(102, "OFF", pulse=True) is None          # double command: u3 (OFF input) pulsed
    assert cmds.apply(101, True, pulse=True) is None           # single command ON pulsed
    assert cmds.apply(100, 20.0, pulse=True) is None           # a set-point is never a pulse
    assert image.read_inputs().tolist() == [20.0, 1.0, 0.0, 1.0]
    assert cmds.release_pulses() == 0                          # the loop has not read them: held
    assert image.read_inputs().tolist() == [20.0, 1.0, 0.0, 1.0]
    dst = np.empty(4)
    assert image.read_inputs_into(dst, mark_applied=True)      # the loop's read
    assert cmds.release_pulses() == 2
    assert image.read_inputs().tolist() == [20.0, 0.0, 0.0, 0.0]
    assert cmds.counters()["pulses_released"] == 2
    # an input another writer changed after the pulse is left as that writer set it
    assert cmds.apply(101, True, pulse=True) is None
    assert image.read_inputs_into(dst, mark_applied=True)
    image.write_inputs([1], [0.5])                             # another writer (Modbus, OPC UA)
    assert cmds.release_pulses() == 1 and image.read_inputs()[1] == 0.5
    # without a pulse qualifier a command holds
    assert cmds.apply(101, True) is None and image.read_inputs_into(dst, mark_applied=True)
    assert cmds.release_pulses() == 0 and image.read_inputs()[1] == 1.0
