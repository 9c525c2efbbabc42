"""The OPC UA server's edges: connection limit, idle connections, and exposure off loopback.

Real sockets to the server in its own process (tests/integration/opcua_helpers.py); no
traffic ever goes to a non-loopback address: the off-loopback refusal is checked before
anything binds.
"""

import asyncio
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from asyncua import Client

from tests.integration import opcua_helpers as H

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


def _closed(s: socket.socket, timeout_s: float) -> bool:
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_connection_limit_and_idle_timeout(tmp_path):
    srv = H.OpcuaServer(H.scenario_data(H.free_port(), opcua={"max_connections": 2, "idle_timeout_s": 2.0}),
                        tmp_path)
    sockets = []
    try:
        srv.publish()
        # two silent TCP connections take both slots; a third is closed and counted as refused
        sockets = [socket.create_connection(("127.0.0.1", srv.section.port), timeout=5) for _ in range(3)]
        assert _closed(sockets[2], 10), "a connection beyond max_connections was kept open"
        # the silent ones are closed once idle_timeout_s passes (bounded wait, not a timing check)
        assert _closed(sockets[0], 20) and _closed(sockets[1], 20), "silent connections were kept open"

        async def busy_client() -> int:
            async with Client(srv.url) as c:
                node = c.get_node(f"ns=2;s={H.node_ids()['status']}Step")
                t_end = time.monotonic() + 5.0  # > 2 idle timeouts, while it keeps reading
                reads = 0
                while time.monotonic() < t_end:
                    assert await node.read_value() == 1
                    reads += 1
                    await asyncio.sleep(0.1)
                return reads

        assert asyncio.run(asyncio.wait_for(busy_client(), 60)) > 10  # never cut off while active
    finally:
        for s in sockets:
            s.close()
        code = srv.stop()
    assert code == 0, srv.log()
    c = srv.final_counters()
    assert (c["connections"], c["refused_connections"], c["idle_closed"]) == (3, 1, 2), c
    assert c["sessions"] == 1 and c["reads"] > 10
    log = srv.log_path.read_text()
    assert "refused a connection from 127.0.0.1:" in log and "max_connections = 2" in log
    assert "idle_timeout_s = 2" in log


def test_off_loopback_start_is_refused_before_binding(tmp_path):
    """A section that skipped the config check (built in code) still cannot serve 0.0.0.0."""
    from adapters.opcua import start_server
    from hil.scenario.config import parse_scenario
    from hil.image import ProcessImage
    from hil.tagmap.opcua import OpcuaSection

    port = H.free_port()
    scenario = parse_scenario(H.scenario_data(port))
    exposed = OpcuaSection.model_validate({"host": "0.0.0.0", "port": port})
    image = ProcessImage.create(H.spec().n_inputs, H.spec().n_outputs)
    try:
        with pytest.raises(RuntimeError) as info:
            asyncio.run(start_server(exposed, H.spec(), scenario, image, 0.01))
    finally:
        image.close()
    msg = str(info.value)
    assert "opcua.users" in msg and "opcua.security.trusted_clients_dir" in msg and "insecure" in msg
    with socket.socket() as s:  # nothing was bound
        s.bind(("127.0.0.1", port))


def test_insecure_off_loopback_warns_loudly(caplog):
    from adapters.opcua import check_exposure
    from hil.tagmap.opcua import OpcuaSection

    with caplog.at_level(logging.WARNING, logger="hil.opcua"):
        check_exposure(OpcuaSection.model_validate({"host": "0.0.0.0", "security": {"insecure": True}}))
    text = caplog.text
    assert "INSECURE OPC UA server on non-loopback host 0.0.0.0" in text
    assert "anonymous sessions may write actuators" in text and "any client certificate is accepted" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hil.opcua"):
        check_exposure(OpcuaSection.model_validate({"host": "127.0.0.1", "security": {"insecure": True}}))
    assert caplog.text == ""


def test_hil_run_refuses_an_exposed_opcua_host_with_exit_2():
    out = subprocess.run(
        [sys.executable, "-m", "hil.cli", "run", "configs/bioreactor_plc.toml", "--json", "--no-record",
         "--set", 'opcua.host="0.0.0.0"', "--set", f"opcua.port={H.free_port()}",
         "--set", f"modbus.port={H.free_port()}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "opcua.users" in out.stderr and "opcua.security.trusted_clients_dir" in out.stderr
    assert out.stdout == ""  # nothing started
