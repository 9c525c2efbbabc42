"""Per-element names of array signals resolve in the bus and safety sections, written as
quoted dotted keys or as nested TOML tables (one name, two spellings)."""

from __future__ import annotations

import tomllib

import pytest

from hil.scenario.config import load_scenario
from hil.errors import ConfigError
from hil.safety.config import signal_index
from tests.plants.heaters_scenario import write_scenario

POLICY = """
[inputs.heater_12.duty]
driver = "bus"
value = 0.2

[inputs.heater_20.duty]
driver = "bus"
value = 0.1

[bus]
transport = "tcp"
fallback_action = { heater_12 = { duty = 0.0 }, "heater_20.duty" = 0.0 }

[policy]
entry = "tests.nowhere:policy"
inputs = ["heater_12.duty", "heater_20.duty"]
features = ["node_12.temp", "node.temp[3]"]
launch = false

[safety]
mode = "shadow"

[safety.projection]
box.heater_12.duty = [0.0, 0.8]
box."heater_20.duty" = [0.0, 0.5]
rate = { "heater_12.duty" = 0.1, heater_20 = { duty = 0.1 } }

[[safety.projection.linear]]
name = "hot"
w = { "heater_12.duty" = 1.0, "heater_20.duty" = 1.0 }
b0 = 1.5
b = { "node_20.temp" = 0.0 }

[safety.fallback]
fixed = { heater_20 = { duty = 0.0 } }

[[safety.fallback.loops]]
input = "heater_12.duty"
measurement = "node_12.temp"
setpoint = 320.0
kp = 0.01
bias = 0.1
out_min = 0.0
out_max = 0.8

[[safety.monitor.rules]]
name = "node20_hot"
signal = "node_20.temp"
op = ">"
limit = 360.0
for_s = 5.0
action = "alarm"
"""


def test_bus_and_safety_resolve_per_element_names(tmp_path):
    sc = load_scenario(write_scenario(tmp_path, extra=POLICY))
    assert sc.bus.fallback_action == {"heater_12.duty": 0.0, "heater_20.duty": 0.0}
    assert sc.safety.projection.box == {"heater_12.duty": (0.0, 0.8), "heater_20.duty": (0.0, 0.5)}
    assert sc.safety.projection.rate == {"heater_12.duty": 0.1, "heater_20.duty": 0.1}
    assert sc.safety.fallback.fixed == {"heater_20.duty": 0.0}
    spec = sc.plant.load().spec
    assert signal_index(spec, "node.temp[3]") == signal_index(spec, "node_20.temp") == ("y", 3)
    assert signal_index(spec, "u.heater_12.duty") == ("u", 2)


def test_an_unknown_element_in_the_safety_box_names_the_key(tmp_path):
    text = POLICY.replace('box."heater_20.duty"', 'box."heater_21.duty"')
    with pytest.raises(ConfigError, match=r"safety.projection.box.heater_21.duty"):
        load_scenario(write_scenario(tmp_path, extra=text))


def test_nested_and_dotted_spellings_merge_into_one_entry(tmp_path):
    from hil.scenario.config import flatten_names, InputSection

    data = tomllib.loads('[inputs."gen_3.p"]\ndriver = "plc"\n[inputs.gen_3.p]\nvalue = 0.5\n')
    assert flatten_names(data["inputs"], frozenset(InputSection.model_fields)) == \
        {"gen_3.p": {"driver": "plc", "value": 0.5}}
    # a typo inside an entry stays an unknown key, it does not become a name
    assert flatten_names({"glucose": {"nosie_std": 0.1}}, frozenset({"noise_std"})) == {"glucose": {"nosie_std": 0.1}}


def test_the_inputs_table_knows_every_field_of_an_input_entry():
    from hil.scenario.config import SIGNAL_TABLES, InputSection

    assert SIGNAL_TABLES[("inputs",)] == frozenset(InputSection.model_fields)


def test_an_input_group_declares_every_element_and_an_element_entry_wins(tmp_path):
    extra = '\n[inputs."heater.duty"]\ndriver = "bus"\nvalue = 0.3\n[inputs."heater.duty[1]"]\nvalue = 0.6\n' \
            '[bus]\ntransport = "tcp"\n[policy]\nentry = "tests.nowhere:policy"\nlaunch = false\nfeatures = ["node.temp", "u.heater.duty", "supply.voltage"]\n'
    extra += '[safety.projection]\nbox = { "heater.duty" = [0.0, 0.9], heater_12 = { duty = [0.0, 0.5] } }\n' \
             '[safety.fallback]\nfixed = { "heater.duty" = 0.0 }\n'
    path = write_scenario(tmp_path, extra=extra)
    text = path.read_text()
    # the base scenario's own heater_3 / heater_7 entries come first: drop them for this case
    text = text.replace('[inputs.heater_3.duty]\ndriver = "fixed"\nvalue = 1.0\n', "")
    text = text.replace('[inputs.heater_7.duty]\nvalue = 1.0                   # plc-driven (the default), starts at full duty\n', "")
    path.write_text(text)
    sc = load_scenario(path)
    assert {n: (i.driver, i.value) for n, i in sc.inputs.items() if n != "reset"} == {
        "heater_3.duty": ("bus", 0.3), "heater_7.duty": ("bus", 0.6), "heater_12.duty": ("bus", 0.3),
        "heater_20.duty": ("bus", 0.3)}
    assert sc.safety.projection.box == {"heater_3.duty": (0.0, 0.9), "heater_7.duty": (0.0, 0.9),
                                        "heater_12.duty": (0.0, 0.5), "heater_20.duty": (0.0, 0.9)}
    assert sc.safety.fallback.fixed == {f"heater_{i}.duty": 0.0 for i in (3, 7, 12, 20)}
    assert sc.policy.features == [f"node_{i}.temp" for i in (3, 7, 12, 20)] + \
        [f"u.heater_{i}.duty" for i in (3, 7, 12, 20)] + ["supply.voltage"]


def test_a_modbus_map_entry_by_group_position_takes_the_elements_driver(tmp_path):
    from hil.tagmap.modbus import compile_map

    extra = '\n[modbus]\nport = 5999\n[[modbus.map]]\nsignal = "heater.duty[0]"\ntable = "holding_register"\n' \
            'address = 0\n[[modbus.map]]\nsignal = "heater.duty[1]"\ntable = "holding_register"\naddress = 2\n'
    sc = load_scenario(write_scenario(tmp_path, extra=extra))
    cmap = compile_map(sc.modbus, sc.plant.load().spec, sc)
    tags = {t.signal: t for t in cmap.tags}
    assert not tags["heater_3.duty"].writable  # driver "fixed" in the scenario
    assert tags["heater_7.duty"].writable  # driver "plc"
