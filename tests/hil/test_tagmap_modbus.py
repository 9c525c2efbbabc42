"""[modbus] tag map: every invalid entry names its key path; encodings round-trip."""

import copy
import math
import struct
import tomllib
from pathlib import Path

import pytest
from pymodbus.client.mixin import ModbusClientMixin

from hil.scenario.config import parse_scenario
from hil.errors import ConfigError
from hil.tagmap.modbus import compile_map
from tests.integration import modbus_helpers as H

ROOT = Path(__file__).resolve().parents[2]
DT = ModbusClientMixin.DATATYPE
conv_to, conv_from = ModbusClientMixin.convert_to_registers, ModbusClientMixin.convert_from_registers


def _data(*entries, **modbus):
    data = H.scenario_dict(5020)
    if entries:
        data["modbus"]["map"] = [dict(e) for e in entries]
    data["modbus"].update(modbus)
    return data


def _problems(data) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_scenario(data)
    return dict(info.value.problems)


def test_helper_map_is_valid_and_compiles_to_address_lookups():
    sc = parse_scenario(H.scenario_dict(5020))
    cmap = compile_map(sc.modbus, H.SPEC, sc)
    ir = cmap.lookup["input_register"]
    # float64 at 14 takes 14..17; the int32 at 12 takes 12..13
    assert [ir[a][1] for a in range(14, 18)] == [0, 1, 2, 3]
    assert cmap.tags[ir[12][0]].signal == "flow_total" and 18 not in ir
    hr = cmap.lookup["holding_register"]
    inflow = cmap.tags[hr[0][0]]
    assert inflow.writable and inflow.kind == "input" and inflow.index == H.SPEC.index("inputs", "inflow")
    # a sensor in a holding register and a bus-driven input default to read-only
    assert not cmap.tags[hr[100][0]].writable
    assert not cmap.tags[hr[20][0]].writable
    assert cmap.tags[cmap.lookup["input_register"][20][0]].source == "applied"
    pump = cmap.tags[cmap.lookup["coil"][0][0]]
    assert (pump.on_value, pump.off_value, pump.threshold) == (1.0, 0.0, 0.5)


F32 = {"signal": "level", "table": "input_register", "address": 0, "encoding": "float32"}


@pytest.mark.parametrize(
    "entries, path, reason",
    [
        ([F32, {**F32, "address": 1}], "modbus.map[1].address", "input_register 1..2 (level) overlaps modbus.map[0] 0..1"),
        ([{**F32, "address": 65535}], "modbus.map[0].address", "float32 at 65535 needs 2 registers"),
        ([{**F32, "encoding": "float64", "address": 65533}], "modbus.map[0].address", "runs past the last address"),
        ([{**F32, "address": 70000}], "modbus.map[0].address", "less than or equal to 65535"),
        ([{**F32, "table": "holding_register", "writable": True}], "modbus.map[0].writable",
         "'level' is a sensor (plant output); sensors are read-only"),
        ([{**F32, "signal": "inflow", "writable": True}], "modbus.map[0].writable", "input_register is read-only by protocol"),
        ([{**F32, "signal": "valve", "table": "holding_register", "writable": True}], "modbus.map[0].writable",
         "driven by 'bus' (inputs.valve.driver)"),
        ([{**F32, "signal": "inflow", "table": "holding_register", "source": "applied", "writable": True}],
         "modbus.map[0].writable", "applied value is the loop's"),
        ([{**F32, "signal": "levle"}], "modbus.map[0].signal", "has no output or input 'levle'"),
        ([{**F32, "encoding": "int16", "scale": 1000.0}], "modbus.map[0].scale",
         "int16 with scale 1000 and offset 0 cannot represent level's bounds [0.0, 100.0] %"),
        ([{**F32, "signal": "temperature", "encoding": "uint16", "offset": 300.0}], "modbus.map[0].scale",
         "raw -50..100 is outside 0..65535"),
        ([{**F32, "signal": "flow_total", "encoding": "int16"}], "modbus.map[0].scale", "cannot represent flow_total"),
        ([{**F32, "encoding": "bool"}], "modbus.map[0].encoding", "'bool' needs a coil or discrete_input"),
        ([{**F32, "table": "coil", "signal": "pump"}], "modbus.map[0].encoding", "'float32' is not allowed in a coil"),
        ([{**F32, "scale": 0.0}], "modbus.map[0].scale", "must be finite and non-zero"),
        ([{**F32, "word_order": "middle"}], "modbus.map[0].word_order", "'big' or 'little'"),
        ([{**F32, "wordorder": "big"}], "modbus.map[0].wordorder", "unknown key"),
        ([{**F32, "source": "applied"}], "modbus.map[0].source", "'level' is a sensor"),
        ([{**F32, "threshold": 3.0}], "modbus.map[0].threshold", "only for coil/discrete_input"),
        ([{"signal": "pump", "table": "coil", "address": 0, "on_value": 2.0}], "modbus.map[0].on_value",
         "2.0 1 is outside [0.0, 1.0]"),
        ([{"signal": "level", "table": "discrete_input", "address": 0, "on_value": 2.0}], "modbus.map[0].on_value",
         "only for writable coils"),
    ],
)
def test_bad_entries_name_the_key_and_the_reason(entries, path, reason):
    problems = _problems(_data(*entries))
    assert path in problems, problems
    assert reason in problems[path]


def test_every_problem_is_reported_at_once():
    problems = _problems(_data({**F32, "signal": "nope"}, {**F32, "address": 65535},
                               {**F32, "table": "holding_register", "writable": True, "address": 10}))
    assert {"modbus.map[0].signal", "modbus.map[1].address", "modbus.map[2].writable"} <= set(problems)


def test_section_keys_are_checked():
    assert "modbus.port" in _problems(_data(port=70000))
    assert "modbus.unit_id" in _problems(_data(unit_id=300))
    data = _data(F32, device_id=7)
    assert "modbus.device_id" in _problems(data)  # both spellings at once: one is extra
    del data["modbus"]["unit_id"]
    assert parse_scenario(data).modbus.unit_id == 7  # the alias alone is accepted


def test_writable_default_follows_the_driver():
    hr = {"signal": "inflow", "table": "holding_register", "address": 0}
    sc = parse_scenario(_data(hr))
    assert compile_map(sc.modbus, H.SPEC, sc).tags[0].writable
    data = _data(hr)
    data["inputs"]["inflow"] = {"driver": "fixed", "value": 1.0}
    sc = parse_scenario(data)
    assert not compile_map(sc.modbus, H.SPEC, sc).tags[0].writable


# ---------------------------------------------------------------------------- encodings


def _tag(**entry):
    base = {"signal": "flow_total", "table": "input_register", "address": 0}
    sc = parse_scenario(_data({**base, **entry}))
    return compile_map(sc.modbus, H.SPEC, sc).tags[0]


@pytest.mark.parametrize("word_order", ["big", "little"])
@pytest.mark.parametrize("value", [0.0, 1.0, -1234.5678, 3.0e5, 1e-3])
def test_float32_words_match_pymodbus_conversion(word_order, value):
    """pymodbus's client converter is an independent implementation of the word orders."""
    t = _tag(encoding="float32", word_order=word_order)
    regs = t.to_registers(value)
    assert list(regs) == conv_to(value, DT.FLOAT32, word_order=word_order)
    # float32 keeps 24 bits of mantissa: relative error <= 2**-24
    assert t.from_registers(regs) == pytest.approx(value, rel=2 ** -24, abs=0)
    assert conv_from(list(regs), DT.FLOAT32, word_order=word_order) == t.from_registers(regs)


def test_float32_byte_and_word_orders_give_the_four_layouts():
    # 1.5 = 0x3FC00000: ABCD, CDAB, BADC, DCBA
    want = {("big", "big"): (0x3FC0, 0x0000), ("little", "big"): (0x0000, 0x3FC0),
            ("big", "little"): (0xC03F, 0x0000), ("little", "little"): (0x0000, 0xC03F)}
    for (wo, bo), regs in want.items():
        t = _tag(encoding="float32", word_order=wo, byte_order=bo)
        assert t.to_registers(1.5) == regs, (wo, bo)
        assert t.from_registers(regs) == 1.5


def test_float64_round_trips_exactly_in_both_word_orders():
    for wo in ("big", "little"):
        t = _tag(encoding="float64", word_order=wo)
        regs = t.to_registers(-98765.4321)
        assert list(regs) == conv_to(-98765.4321, DT.FLOAT64, word_order=wo)
        assert t.from_registers(regs) == -98765.4321


def test_scaled_int16_rounds_to_the_resolution_and_keeps_the_sign():
    t = _tag(signal="trim", table="holding_register", encoding="int16", scale=10000.0)
    assert t.to_registers(-0.5) == (0x10000 - 5000,)
    assert t.from_registers([0x10000 - 5000]) == -0.5
    # resolution 1e-4: error at most half of it
    for v in (-1.0, -0.33333, 0.0, 0.123456, 1.0):
        assert abs(t.from_registers(t.to_registers(v)) - v) <= 0.5e-4 + 1e-15


def test_offset_and_scale_convention():
    # raw = (value - offset) * scale: 301.25 K with offset 273.15, scale 10 -> 281 (28.1 degC)
    t = _tag(signal="temperature", encoding="int16", offset=273.15, scale=10.0)
    assert t.to_registers(301.25) == (281,)
    assert t.from_registers([281]) == pytest.approx(301.25, abs=0.05)


def test_int32_and_uint32_with_word_orders():
    t = _tag(encoding="int32", scale=100.0)
    assert list(t.to_registers(-1234.56)) == conv_to(-123456, DT.INT32)
    assert t.from_registers(t.to_registers(-1234.56)) == pytest.approx(-1234.56, abs=0.005)
    t = _tag(signal="temperature", encoding="uint32", scale=1e6, word_order="little")
    regs = t.to_registers(373.15)
    assert list(regs) == conv_to(373150000, DT.UINT32, word_order="little")
    assert t.from_registers(regs) == pytest.approx(373.15, abs=1e-6)


def test_out_of_range_reads_saturate_and_non_finite_reads_give_the_sentinel():
    t = _tag(signal="level", encoding="int16", scale=100.0)  # 0..100 % -> 0..10000
    assert t.to_registers(500.0) == (0x7FFF,)
    assert t.to_registers(math.nan) == (0x8000,)  # -32768
    assert t.from_registers([0x8000]) == -327.68  # the server decodes it as a number ...
    assert math.isnan(t.from_registers([0x8000], sentinel_nan=True))  # ... a master as "invalid"
    full = _tag(signal="trim", encoding="int16", scale=32767.5)  # [-1, 1] -> -32767.5..32767.5
    assert full.from_registers([0x8000], sentinel_nan=True) == -32768 / 32767.5  # in range: a value
    u = _tag(signal="level", encoding="uint16", scale=100.0)
    assert u.to_registers(-5.0) == (0,)
    assert u.to_registers(math.inf) == (0xFFFF,)
    f = _tag(signal="level", encoding="float32")
    assert math.isnan(f.from_registers(f.to_registers(math.nan)))


def test_bits_use_threshold_and_on_off_values():
    t = _tag(signal="level", table="discrete_input", threshold=80.0)
    assert t.to_bit(80.0) and not t.to_bit(79.9) and not t.to_bit(math.nan)
    c = _tag(signal="inflow", table="coil", on_value=12.0, off_value=2.0)
    assert c.writable and (c.from_bit(True), c.from_bit(False)) == (12.0, 2.0)


def test_float32_write_tolerance_covers_the_encoding_round_off():
    t = _tag(signal="level", encoding="float32")
    high32 = struct.unpack(">f", struct.pack(">f", 100.0 + 1e-5))[0]
    assert high32 > 100.0 and high32 - 100.0 <= t.tolerance
    assert 1.0 > t.tolerance  # but a real overshoot is not tolerated


# ---------------------------------------------------------------------------- the real plant

BIOREACTOR_MODBUS = """
[modbus]
host = "127.0.0.1"
port = 5020
unit_id = 1

# sensors: float32 input registers 0.., big-endian words (ABCD)
[[modbus.map]]
signal = "glucose"
table = "input_register"
address = 0
encoding = "float32"
[[modbus.map]]
signal = "dissolved_oxygen"
table = "input_register"
address = 2
encoding = "float32"
[[modbus.map]]
signal = "ph"
table = "input_register"
address = 4
encoding = "float32"
[[modbus.map]]
signal = "temperature"
table = "input_register"
address = 6
encoding = "float32"
[[modbus.map]]
signal = "biomass"
table = "input_register"
address = 8
encoding = "float32"
[[modbus.map]]
signal = "volume"
table = "input_register"
address = 10
encoding = "float32"
[[modbus.map]]
signal = "co2"
table = "input_register"
address = 12
encoding = "float32"
[[modbus.map]]
signal = "penicillin"
table = "input_register"
address = 14
encoding = "float32"
# the same sensors as scaled int16 for 16-bit-only masters: pH x100, T in 0.1 degC
[[modbus.map]]
signal = "ph"
table = "input_register"
address = 100
encoding = "int16"
scale = 100.0
[[modbus.map]]
signal = "temperature"
table = "input_register"
address = 101
encoding = "int16"
offset = 273.15
scale = 10.0
[[modbus.map]]
signal = "dissolved_oxygen"
table = "input_register"
address = 102
encoding = "uint16"
scale = 100.0

# actuators: float32 holding registers 0.. (writable when driver = "plc")
[[modbus.map]]
signal = "feed_rate"
table = "holding_register"
address = 0
encoding = "float32"
[[modbus.map]]
signal = "base_flow"
table = "holding_register"
address = 2
encoding = "float32"
[[modbus.map]]
signal = "acid_flow"
table = "holding_register"
address = 4
encoding = "float32"
[[modbus.map]]
signal = "aeration_rate"
table = "holding_register"
address = 6
encoding = "float32"
[[modbus.map]]
signal = "agitation_power"
table = "holding_register"
address = 8
encoding = "float32"
[[modbus.map]]
signal = "coolant_flow"
table = "holding_register"
address = 10
encoding = "float32"
[[modbus.map]]
signal = "heating_flow"
table = "holding_register"
address = 12
encoding = "float32"
# applied values (after actuator gaps) for SCADA, read-only
[[modbus.map]]
signal = "feed_rate"
table = "input_register"
address = 200
encoding = "float32"
source = "applied"
[[modbus.map]]
signal = "agitation_power"
table = "input_register"
address = 202
encoding = "float32"
source = "applied"
"""

BIOREACTOR_SOFTPLC = """
[softplc]
scan_ms = 100
comm_loss_scans = 3
timeout_ms = 100
recovery_hold_scans = 1
pid_clock = "sim"            # gains below are per simulated second (the demo runs 60x)
record = "runs/softplc-scan.csv"

[[softplc.loops]]            # DO by agitation: kLa ~ P^0.4, tau ~ 30 s at nominal
name = "do"
measurement = "dissolved_oxygen"
output = "agitation_power"
setpoint = 40.0
kp = 1.0
ki = 0.02
out_min = 5.0
out_max = 100.0

[[softplc.loops]]            # glucose by feed: slow (hours), small gains
name = "glucose"
measurement = "glucose"
output = "feed_rate"
setpoint = 0.5
kp = 0.05
ki = 3e-5
out_min = 0.0
out_max = 0.2

[[softplc.loops]]
name = "ph"
measurement = "ph"
output = "base_flow"
setpoint = 5.0
kp = 0.005
ki = 1e-5
out_min = 0.0
out_max = 0.01

[[softplc.loops]]            # cooling: more coolant when too warm
name = "temperature"
measurement = "temperature"
output = "coolant_flow"
setpoint = 298.0
kp = 50.0
ki = 0.08
out_min = 0.0
out_max = 1000.0
reverse = true

[softplc.outputs]
aeration_rate = 8.6

[softplc.safe_outputs]
feed_rate = 0.0
base_flow = 0.0
agitation_power = 30.0
coolant_flow = 100.0
"""


def test_bioreactor_example_sections_validate_against_the_real_spec():
    data = tomllib.loads((ROOT / "configs/bioreactor.toml").read_text())
    data = copy.deepcopy(data)
    data.update(tomllib.loads(BIOREACTOR_MODBUS + BIOREACTOR_SOFTPLC))
    # the PLC drives these, so they must be plc inputs in the scenario
    for name in ("feed_rate", "agitation_power", "coolant_flow", "aeration_rate"):
        data.get("inputs", {}).pop(name, None)
    sc = parse_scenario(data)
    from plants.bioreactor import SPEC

    cmap = compile_map(sc.modbus, SPEC, sc)
    assert {t.signal for t in cmap.tags if t.kind == "output"} == set(SPEC.names("outputs")) - {"heat"}
    assert {t.signal for t in cmap.tags if t.writable} == set(SPEC.names("inputs"))


# ---------------------------------------------------------------------------- views and engineering ranges

U16 = {"signal": "inflow", "table": "holding_register", "address": 0, "encoding": "uint16", "scale": 5000.0}


def test_a_scaled_view_must_cover_the_bounds_unless_narrowed():
    # 0..20 L/min x 5000 = 0..100000 raw: beyond uint16
    problems = _problems(_data(U16))
    assert "cannot represent inflow's bounds [0.0, 20.0] L/min: raw 0..100000 is outside 0..65535" in \
        problems["modbus.map[0].scale"]
    assert "narrow this view with eng_low/eng_high" in problems["modbus.map[0].scale"]
    sc = parse_scenario(_data({**U16, "eng_low": 2.0, "eng_high": 10.0}))
    tag = compile_map(sc.modbus, H.SPEC, sc).tags[0]
    assert (tag.low, tag.high) == (2.0, 10.0) and tag.writable
    assert tag.to_registers(10.0) == (50000,) and tag.from_registers([50000]) == 10.0


@pytest.mark.parametrize(
    "extra, path, reason",
    [
        ({"eng_low": 0.0}, "modbus.map[0].eng_high", "eng_low and eng_high go together"),
        ({"eng_high": 5.0}, "modbus.map[0].eng_low", "eng_low and eng_high go together"),
        ({"eng_low": 5.0, "eng_high": 5.0}, "modbus.map[0].eng_high", "must be above eng_low 5"),
        ({"eng_low": -1.0, "eng_high": 5.0}, "modbus.map[0].eng_low",
         "-1 L/min is outside the physical bounds [0, 20] L/min of 'inflow'"),
        ({"eng_low": 0.0, "eng_high": 25.0}, "modbus.map[0].eng_high", "outside the physical bounds"),
        ({"eng_low": 0.0, "eng_high": 15.0}, "modbus.map[0].scale",
         "cannot represent inflow's engineering range [0.0, 15.0] L/min: raw 0..75000"),
    ],
)
def test_engineering_range_errors_name_the_key(extra, path, reason):
    problems = _problems(_data({**U16, **extra}))
    assert path in problems, problems
    assert reason in problems[path]


def test_engineering_range_is_for_register_views_only():
    coil = {"signal": "pump", "table": "coil", "address": 0, "eng_low": 0.0, "eng_high": 1.0}
    assert "not bool" in _problems(_data(coil))["modbus.map[0].eng_low"]


def test_writes_outside_a_narrowed_view_are_refused_by_the_datastore():
    import numpy as np
    from pymodbus.constants import ExcCodes

    from adapters.modbus_datastore import ImageDatastore
    from hil.image import ProcessImage

    sc = parse_scenario(_data({**U16, "eng_low": 2.0, "eng_high": 10.0}))
    image = ProcessImage.create(H.SPEC.n_inputs, H.SPEC.n_outputs)
    try:
        ds = ImageDatastore(compile_map(sc.modbus, H.SPEC, sc), image)
        i = H.SPEC.index("inputs", "inflow")
        assert ds.write(6, 0, [25000]) is None and image.read_inputs()[i] == 5.0
        assert ds.write(6, 0, [55000]) == ExcCodes.ILLEGAL_VALUE  # 11 L/min: physical, but not this view's
        assert ds.write(6, 0, [9000]) == ExcCodes.ILLEGAL_VALUE  # 1.8 L/min: below eng_low
        assert ds.write(6, 0, [10000]) is None and image.read_inputs()[i] == 2.0  # the bound itself
        np.testing.assert_equal(image.read_inputs()[i], 2.0)
    finally:
        image.close()


def test_views_sharing_a_signal_are_described():
    from hil.tagmap.modbus import describe_shared_views

    sc = parse_scenario(H.scenario_dict(5020))
    lines = describe_shared_views(compile_map(sc.modbus, H.SPEC, sc))
    # writable views first: the helper map writes inflow and coolant through two views each
    assert lines[0].startswith("coolant is written through 2 views, the last write wins: "
                               "holding_register 2 float32 [0, 50] (modbus.map[10]); "
                               "holding_register 6 float32 [0, 50] (modbus.map[13])")
    assert lines[1].startswith("inflow is written through 2 views, the last write wins: ")
    assert "holding_register 4 uint16 x100 [0, 20] (modbus.map[11])" in lines[1]
    assert any(ln.startswith("level (measured) is served by 3 views: ") for ln in lines)
    assert not any(ln.startswith("trim") or ln.startswith("pump") for ln in lines)  # single views
