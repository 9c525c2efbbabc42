"""hil.scenario.ports: the ports a scenario binds, checked with real sockets, holders named from /proc."""

import os
import socket

import pytest

from hil.scenario.config import load_scenario
from hil.errors import ConfigError
from hil.scenario.ports import check_ports, port_holders, scenario_bindings
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


# ---- free ports chosen at run time (hil/scenario/ports.py bind_free, free_port, with_free_ports) ----

def test_bind_free_holds_its_port_until_closed():
    import errno
    import socket

    from hil.scenario.ports import bind_free

    held = bind_free()
    port = held.getsockname()[1]
    with socket.socket() as other:
        with pytest.raises(OSError) as exc:
            other.bind(("127.0.0.1", port))
        assert exc.value.errno == errno.EADDRINUSE
    held.close()


def test_with_free_ports_retries_a_port_taken_since_it_was_chosen():
    import errno

    from hil.scenario.ports import with_free_ports

    seen: list[list[int]] = []

    def attempt(ports):
        seen.append(ports)
        if len(seen) < 3:  # as if another process took them between the choice and the bind
            raise OSError(errno.EADDRINUSE, "in use")
        return ports

    ports = with_free_ports(attempt, 2)
    assert len(seen) == 3 and ports == seen[-1] and len(set(ports)) == 2
    # other errors are not retried, and the last busy one propagates
    with pytest.raises(PermissionError):
        with_free_ports(lambda p: (_ for _ in ()).throw(PermissionError(errno.EACCES, "no")), 1)
    with pytest.raises(OSError):
        with_free_ports(lambda p: (_ for _ in ()).throw(OSError(errno.EADDRINUSE, "busy")), 1, attempts=2)


def test_link_proxy_listens_on_the_socket_it_is_handed():
    """The campaign's link proxy gets a bound socket (no window for another process to take
    the port) and forwards to its target."""
    import socket
    import threading

    from hil.campaign.proxy import LinkProxy
    from hil.scenario.ports import bind_free

    with socket.socket() as target:
        target.bind(("127.0.0.1", 0))
        target.listen()
        tport = target.getsockname()[1]

        def echo():
            conn, _ = target.accept()
            with conn:
                conn.sendall(conn.recv(64).upper())

        th = threading.Thread(target=echo, daemon=True)
        th.start()
        proxy = LinkProxy(bind_free(), "127.0.0.1", tport)
        try:
            with socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=10.0) as c:
                c.sendall(b"ping")
                c.settimeout(10.0)
                assert c.recv(64) == b"PING"
        finally:
            proxy.stop()
        th.join(5.0)
