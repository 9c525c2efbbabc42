"""Block tag maps (hil/tagmap/blocks.py): [[modbus.blocks]] expansion and checks,
[[opcua.folders]] resolution, on the test plant's array groups."""

from __future__ import annotations

import pytest

from hil.scenario.config import load_scenario
from hil.errors import ConfigError
from hil.tagmap.modbus import compile_map
from hil.tagmap.opcua import resolve_nodes
from tests.plants.heaters_scenario import write_scenario


def _load(tmp_path, extra: str):
    return load_scenario(write_scenario(tmp_path, extra=extra))


def test_a_block_expands_to_consecutive_views_per_element(tmp_path):
    sc = _load(tmp_path, '\n[modbus]\n[[modbus.blocks]]\ngroup = "node.temp"\ntable = "input_register"\n'
                         'start = 10\n[[modbus.blocks]]\ngroup = "heater.duty"\ntable = "holding_register"\n'
                         'start = 40\nencoding = "uint16"\nscale = 10000.0\nstride = 3\n')
    cmap = compile_map(sc.modbus, sc.plant.load().spec, sc)
    temps = [t for t in cmap.tags if t.table == "input_register"]
    assert [(t.signal, t.address, t.encoding, t.n_words) for t in temps] == [
        ("node_3.temp", 10, "float32", 2), ("node_7.temp", 12, "float32", 2),
        ("node_12.temp", 14, "float32", 2), ("node_20.temp", 16, "float32", 2)]
    duty = [t for t in cmap.tags if t.table == "holding_register"]
    assert [(t.signal, t.address, t.writable) for t in duty] == [
        ("heater_3.duty", 40, False), ("heater_7.duty", 43, True), ("heater_12.duty", 46, True),
        ("heater_20.duty", 49, True)]  # heater_3 is driven "fixed": read-only
    assert cmap.lookup["holding_register"][43] == (duty[1:2] and cmap.tags.index(duty[1]), 0)


@pytest.mark.parametrize("block, key, reason", [
    ('group = "node.tmp"\ntable = "input_register"\nstart = 0', "modbus.blocks[0].group",
     "no array group 'node.tmp' of outputs or inputs (groups: node.temp[4], node.power[4]"),
    ('group = "node.temp"\ntable = "input_register"\nstart = 0\nstride = 1', "modbus.blocks[0].stride",
     "1 is less than the 2 addresses of one float32 value"),
    ('group = "node.temp"\ntable = "input_register"\nstart = 65532', "modbus.blocks[0].start",
     "runs past the last address 65535"),
    ('group = "node.temp"\ntable = "input_register"\nstart = 0\nencoding = "uint16"\nscale = 100.0',
     "modbus.blocks[0].scale", "cannot represent node_3.temp's bounds"),
    ('group = "node.power"\ntable = "holding_register"\nstart = 0\nwritable = true', "modbus.blocks[0].writable",
     "'node_3.power' is a sensor (plant output); sensors are read-only (and 3 more elements of the block)"),
])
def test_block_problems_are_reported_once_at_the_block(tmp_path, block, key, reason):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, f"\n[modbus]\n[[modbus.blocks]]\n{block}\n")
    text = str(e.value)
    assert key in text and reason in text, text
    assert text.count(key) == 1, text  # one problem, not one per element


def test_blocks_overlapping_a_map_entry_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"modbus.blocks\[0\].start: input_register 2..3 \(node_7.temp\) "
                                          r"overlaps modbus.map\[0\]"):
        _load(tmp_path, '\n[modbus]\n[[modbus.map]]\nsignal = "supply.voltage"\ntable = "input_register"\n'
                        'address = 2\n[[modbus.blocks]]\ngroup = "node.temp"\ntable = "input_register"\nstart = 0\n')


def test_an_opcua_folder_holds_the_groups_variables_with_spec_units(tmp_path):
    sc = _load(tmp_path, '\n[opcua]\n[[opcua.folders]]\ngroup = "node.temp"\nname = "Temperatures"\n'
                         '[[opcua.folders]]\ngroup = "heater.duty"\ndata_type = "Float"\n'
                         '[[opcua.nodes]]\nsignal = "node_7.temp"\ndisplay_name = "T7"\n')
    nodes = resolve_nodes(sc.opcua, sc.plant.load().spec, sc)
    temps = [n for n in nodes if n.kind == "sensor" and n.folder]
    # node ids do not depend on the folder; browse paths need no escapes (no '.' in a browse name)
    assert [n.path for n in temps] == [f"Sensors.node_{i}.temp" for i in (3, 7, 12, 20)]
    assert [n.browse_path for n in temps] == [f"Sensors/Temperatures/node_{i}_temp" for i in (3, 7, 12, 20)]
    assert {(n.unit, n.eu_low, n.eu_high, n.data_type) for n in temps} == {("K", 200.0, 1000.0, "Double")}
    assert temps[1].display_name == "T7" and temps[0].display_name == "node_3.temp"
    acts = [n for n in nodes if n.kind == "actuator"]
    assert [(n.path, n.browse_path, n.data_type) for n in acts if n.folder] == [
        (f"Actuators.heater_{i}.duty", f"Actuators/heater_duty/heater_{i}_duty", "Float") for i in (7, 12, 20)]
    applied = [n.path for n in nodes if n.kind == "applied" and n.folder]
    assert applied == [f"Applied.heater_{i}.duty" for i in (3, 7, 12, 20)]
    assert [n.path for n in nodes if n.kind == "sensor" and not n.folder][:1] == ["Sensors.node_3.power"]
    # the same scenario without folders: every node keeps its node id
    flat = resolve_nodes(_load(tmp_path, '\n[opcua]\n').opcua, sc.plant.load().spec, sc)
    assert {(n.kind, n.path) for n in flat} == {(n.kind, n.path) for n in nodes}
    assert all(not set(n.browse_name) & set("/.<>:#!&") for n in flat)


def test_browse_names_replace_the_relative_path_reserved_characters():
    from hil.tagmap.opcua import browse_name_of

    assert browse_name_of("bus_1.vm") == "bus_1_vm" and browse_name_of("a/b<c>:d#e!f&g") == "a_b_c__d_e_f_g"


def test_opcua_folder_problems_name_the_entry(tmp_path):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, '\n[opcua]\n[[opcua.folders]]\ngroup = "node.temp"\n[[opcua.folders]]\ngroup = "node.temp"\n'
                        'name = "T"\n[[opcua.folders]]\ngroup = "node.temperature"\n'
                        '[[opcua.folders]]\ngroup = "node.power"\nwritable = true\n'
                        '[[opcua.folders]]\ngroup = "node.tripped"\ndata_type = "Byte"\nname = "trips"\n')
    text = str(e.value)
    assert "opcua.folders[1].group: 'node_3.temp' is already in opcua.folders[0]" in text
    assert "opcua.folders[2].group: heaters has no array group 'node.temperature'" in text
    assert "opcua.folders[3].writable" in text
