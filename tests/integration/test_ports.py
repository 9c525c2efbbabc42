"""hil.ports: the ports a scenario binds, checked with real sockets, holders named from /proc."""

import os
import socket

import pytest

from hil.config import load_scenario
from hil.errors import ConfigError
from hil.ports import check_ports, port_holders, scenario_bindings
from tests.hil.test_config import ROOT
from tests.integration.net import free_port as _free_port


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_holder_is_this_process(listener):
    holders = port_holders(listener)
    assert [h["pid"] for h in holders] == [os.getpid()]
    assert "python" in holders[0]["cmdline"]


def test_servers_only_in_real_time_and_bus_tcp_endpoints(listener):
    sc = load_scenario(ROOT / "configs/bioreactor_plc.toml")
    assert [b.key for b in scenario_bindings(sc)] == ["modbus.port", "opcua.port"]
    assert scenario_bindings(sc, servers=False) == []
    pol = load_scenario(ROOT / "configs/bioreactor_policy.toml", {"bus": {"transport": "tcp", "tcp_base_port": 6100}})
    ports = sorted(b.port for b in scenario_bindings(pol))
    assert ports == list(range(6100, 6107))  # loop's 3 + the launched safety's 4
    ipc = load_scenario(ROOT / "configs/bioreactor_policy.toml",
                        {"bus": {"endpoints": {"action": f"tcp://127.0.0.1:{listener}"}}})
    with pytest.raises(ConfigError) as info:
        check_ports(ipc, servers=False)
    assert info.value.path == "bus.endpoints.action"
    assert f"127.0.0.1:{listener}" in str(info.value) and f"pid {os.getpid()}" in str(info.value)


def test_every_taken_port_is_named(listener):
    sc = load_scenario(ROOT / "configs/bioreactor_plc.toml",
                       {"modbus": {"port": listener}, "opcua": {"port": _free_port()}})
    with pytest.raises(ConfigError) as info:
        check_ports(sc)
    assert [p for p, _ in info.value.problems] == ["modbus.port"]
    assert "--set modbus.port=N" in str(info.value)
    free = load_scenario(ROOT / "configs/bioreactor_plc.toml",
                         {"modbus": {"port": _free_port()}, "opcua": {"port": _free_port()}})
    assert len(check_ports(free)) == 2


def test_an_address_not_of_this_machine(listener):
    sc = load_scenario(ROOT / "configs/bioreactor_plc.toml",
                       {"modbus": {"host": "192.0.2.1", "port": _free_port()}, "opcua": {"port": _free_port()}})
    with pytest.raises(ConfigError, match="modbus.port: 192.0.2.1:.*not an address of this machine"):
        check_ports(sc)
