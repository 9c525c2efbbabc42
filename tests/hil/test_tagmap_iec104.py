"""The [iec104] section (hil/tagmap/iec104.py): the automatic layout, the map, and bad
configuration reported with the key path and the reason."""

import copy
from pathlib import Path

import pytest

from hil.scenario.config import load_scenario, parse_scenario
from hil.errors import ConfigError
from hil.tagmap.iec104 import AUTO_COMMAND_START, AUTO_MONITOR_START, compile_points

ROOT = Path(__file__).resolve().parents[2]
BASE = {
    "scenario": {"name": "g14"},
    "plant": {"model": "grid", "case": str(ROOT / "configs/grids/case14.m")},
    "loop": {"step_s": 1.0, "duration_s": 10.0},
    "inputs": {"load.scale": {"driver": "fixed", "value": 1.0}},
}


def _sc(iec104: dict, **extra):
    data = copy.deepcopy(BASE)
    data["iec104"] = iec104
    data.update(extra)
    return parse_scenario(data)


def _problems(iec104: dict, **extra) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as e:
        _sc(iec104, **extra)
    return e.value.problems


def test_automatic_layout_serves_every_output_and_every_plc_input():
    sc = _sc({})
    spec = sc.plant.load().spec
    points = compile_points(sc.iec104, spec, sc)
    outputs, inputs = spec.names("outputs"), spec.names("inputs")
    monitor = [p for p in points if not p.is_command]
    commands = [p for p in points if p.is_command]
    assert [p.signal for p in monitor] == list(outputs)
    assert [p.ioa for p in monitor] == [AUTO_MONITOR_START + i for i in range(len(outputs))]
    kinds = {p.signal: p.type for p in monitor}
    assert kinds["line_1.closed"] == "double_point" and kinds["grid.blackout"] == "double_point"
    assert kinds["bus_1.vm"] == "measured" and kinds["grid.frequency"] == "measured"
    # load.scale is driven "fixed": not a command object; every other input is a set-point
    plc = [(j, n) for j, n in enumerate(inputs) if not n.endswith(".scale") or not n.startswith("load_")]
    assert [p.signal for p in commands] == [n for _, n in plc]
    assert [p.ioa for p in commands] == [AUTO_COMMAND_START + j for j, _ in plc]
    assert all(p.type == "setpoint" for p in commands)
    assert sc.iec104.host == "127.0.0.1" and sc.iec104.port == 2404 and sc.iec104.common_address == 1


def test_grid118_map_ioas_follow_the_element_ids():
    sc = load_scenario(ROOT / "configs/grid118.toml")
    spec = sc.plant.load().spec
    by_ioa = {p.ioa: p for p in compile_points(sc.iec104, spec, sc)}
    assert by_ioa[1].signal == "grid.frequency" and by_ioa[1].deadband == 0.01
    assert by_ioa[1012].signal == "bus_12.vm" and by_ioa[1012].type_id == "M_ME_TF_1"
    assert by_ioa[4010].signal == "line_10.closed" and by_ioa[4010].type_id == "M_DP_TB_1"
    assert (by_ioa[14010].signal, by_ioa[14010].off_signal) == ("line_10.close_cmd", "line_10.open_cmd")
    assert by_ioa[15030].signal == "gen_30.p_set" and by_ioa[15030].type_id == "C_SE_NC_1"
    q = spec.quantity("inputs", "gen_30.p_set")
    assert (by_ioa[15030].low, by_ioa[15030].high) == (q.low, q.high)
    assert by_ioa[16005].type_id == "C_SC_TA_1"
    assert len(by_ioa) == 6 + 118 + 186 * 4 + 54 * 4 + 118   # scalars, buses, lines, units, load shedding


@pytest.mark.parametrize("entry, extra, key, words", [
    ({"signal": "bus.nope", "ioa": 1}, {}, "iec104.points[0].signal", "no output, input or array group"),
    ({"signal": "bus.vm", "ioa": 1, "type": "setpoint"}, {}, "iec104.points[0].type", "sensor"),
    ({"signal": "gen.p_set", "ioa": 1, "type": "measured"}, {}, "iec104.points[0].type", "input"),
    ({"signal": "line.close_cmd", "ioa": 1, "type": "double_command"}, {}, "iec104.points[0].off_signal",
     "needs the input written on OFF"),
    ({"signal": "line.close_cmd", "ioa": 1, "type": "double_command", "off_signal": "gen.on"}, {},
     "iec104.points[0].off_signal", "pair element by element"),
    ({"signal": "bus.vm", "ioa": 1, "report_ms": 150}, {}, "iec104.points[0].report_ms", "multiple of"),
    ({"signal": "bus.vm", "ioa": 16777210}, {}, "iec104.points[0].ioa", "run past the last IOA"),
    ({"signal": "gen.p_set", "ioa": 1, "deadband": 1.0}, {}, "iec104.points[0].deadband", "monitor points"),
    ({"signal": "line.closed", "ioa": 1, "type": "double_point", "threshold": 2.0}, {},
     "iec104.points[0].threshold", "not within"),
    ({"signal": "gen_2.p_set", "ioa": 1}, {"inputs": {"gen_2.p_set": {"driver": "fixed", "value": 10.0}}},
     "iec104.points[0].signal", "driven by 'fixed'"),
])
def test_bad_entries_name_the_key_and_the_reason(entry, extra, key, words):
    problems = _problems({"points": [entry]}, **extra)
    assert any(k == key and words in r for k, r in problems), problems


def test_overlapping_ioas_name_both_entries():
    problems = _problems({"points": [{"signal": "bus.vm", "ioa": 1}, {"signal": "grid.frequency", "ioa": 14}]})
    assert problems == [("iec104.points[1].ioa",
                         "IOA 14 (grid.frequency) is already taken by iec104.points[0] (bus_14.vm)")]


@pytest.mark.parametrize("section, key, words", [
    ({"host": "0.0.0.0"}, "iec104.host", "expose = true"),
    ({"common_address": 0}, "iec104.common_address", "greater than or equal to 1"),
    ({"common_address": 65535}, "iec104.common_address", "less than or equal to 65534"),
    ({"port": 0}, "iec104.port", ""),
    ({"command_mode": "sbo"}, "iec104.command_mode", "select_and_execute"),
    ({"deadband": -1.0}, "iec104.deadband", ""),
    ({"points": [{"signal": "bus.vm", "ioa": 0}]}, "iec104.points[0].ioa", ""),
    ({"unknown": 1}, "iec104.unknown", "unknown key"),
])
def test_bad_section_keys(section, key, words):
    problems = _problems(section)
    assert any(k == key and words in r for k, r in problems), problems


def test_exposed_host_is_allowed_when_said_so():
    assert _sc({"host": "0.0.0.0", "expose": True}).iec104.host == "0.0.0.0"


def test_a_group_skips_elements_driven_otherwise():
    sc = _sc({"points": [{"signal": "gen.p_set", "ioa": 100}]},
             inputs={"gen_2.p_set": {"driver": "profile", "profile": [[0.0, 10.0]]}})
    points = compile_points(sc.iec104, sc.plant.load().spec, sc)
    assert [p.ioa for p in points] == [100, 102, 103, 104]      # IOA 101 (gen_2) stays free


def test_hil_tags_exports_the_objects(tmp_path):
    """`hil tags --protocol iec104`: one row per object, IOA, type id, deadband, the station in the header."""
    import json

    from click.testing import CliRunner

    from hil.commands.tags import command

    path = tmp_path / "g14.toml"
    path.write_text(f'''[scenario]
name = "g14"
[plant]
model = "grid"
case = "{ROOT / "configs/grids/case14.m"}"
[loop]
step_s = 1.0
duration_s = 10.0
[iec104]
common_address = 9
[[iec104.points]]
signal = "line.closed"
ioa = 4001
type = "double_point"
[[iec104.points]]
signal = "line.close_cmd"
off_signal = "line.open_cmd"
type = "double_command"
ioa = 14001
[[iec104.points]]
signal = "bus.vm"
ioa = 1001
deadband = 0.002
''')
    res = CliRunner().invoke(command, [str(path), "--format", "json", "--protocol", "iec104"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["iec104"]["common_address"] == 9 and doc["iec104"]["command_mode"] == "select_and_execute"
    rows = {r["ioa"]: r for r in doc["tags"]}
    assert len(rows) == 20 + 20 + 14 and all(r["protocol"] == "iec104" for r in rows.values())
    assert (rows[1012]["signal"], rows[1012]["type"], rows[1012]["deadband"],
        rows[1012]["writable"]) == ("bus_12.vm", "M_ME_TF_1", 0.002, False)
    assert (rows[4003]["type"], rows[4003]["kind"]) == ("M_DP_TB_1", "sensor")
    assert (rows[14003]["type"], rows[14003]["signal"], rows[14003]["off_signal"], rows[14003]["writable"]) == (
        "C_DC_TA_1", "line_3.close_cmd", "line_3.open_cmd", True)
    csv = CliRunner().invoke(command, [str(path), "--protocol", "iec104"]).output.splitlines()
    assert csv[0].endswith(",ioa,deadband,off_signal") and len(csv) == 1 + 54
