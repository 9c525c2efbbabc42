"""Runtime.run failing before its loop starts: every started child stops, the image and the
(row-less) recording are released, the runtime says why; never an AttributeError."""

import glob
import os
import socket

import psutil
import pytest

from hil.scenario.config import load_scenario
from hil.runtime import Runtime
from tests.integration.net import free_port as _free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _scenario():
    return load_scenario(os.path.join(ROOT, "configs/bioreactor_plc.toml"),
                         {"modbus": {"port": _free_port()}, "opcua": {"port": _free_port()}})


@pytest.mark.parametrize("where", ["on_started", "raise_priority"])
def test_an_exception_before_the_loop_stops_every_child_and_releases_the_image(tmp_path, where, monkeypatch):
    rec = tmp_path / "rec"
    runtime = Runtime(_scenario(), duration_s=600.0, record_path=str(rec), start_servers=True)
    image_name = runtime.image.name
    seen = {}

    def fail(*_args):
        # the recorder and both servers are up at this point
        seen["children"] = [p.pid for p in psutil.Process().children(recursive=True)
                            if "resource_tracker" not in " ".join(p.cmdline())]  # multiprocessing's own helper
        raise RuntimeError("boom before the loop")

    if where == "on_started":
        kwargs = {"on_started": fail}
    else:
        monkeypatch.setattr(runtime, "_raise_priority", fail)
        kwargs = {}
    with pytest.raises(RuntimeError, match="boom before the loop"):
        runtime.run(**kwargs)
    assert len(seen["children"]) >= 3, seen  # recorder, modbus, opcua
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in seen["children"] if psutil.pid_exists(p)],
                                    timeout=10)
    assert alive == [], [p.cmdline() for p in alive]
    assert runtime.state == "failed"
    assert runtime.image is None and not glob.glob(f"/dev/shm/{image_name}*")
    assert not rec.exists()  # no rows: no recording left
    runtime.close()  # closing again is harmless


def test_a_server_that_cannot_listen_is_named_and_nothing_stays_up(tmp_path):
    """The server's own failure (port taken after any pre-check): a RuntimeError naming host:port,
    raised at once (the loop no longer waits 30 s for a dead child), no AttributeError."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    sc = load_scenario(os.path.join(ROOT, "configs/bioreactor_plc.toml"),
                       {"modbus": {"port": port}, "opcua": {"port": _free_port()}})
    runtime = Runtime(sc, duration_s=600.0, record=False, start_servers=True)
    try:
        with pytest.raises(RuntimeError, match=f"modbus server on 127.0.0.1:{port} exited"):
            runtime.run()
    finally:
        holder.close()
    gone, alive = psutil.wait_procs(psutil.Process().children(recursive=True), timeout=10)
    # multiprocessing's resource tracker lives as long as the test session (and its command line
    # holds the checkout's path, which may contain "hil"): everything else must be gone
    assert [p for p in alive if "resource_tracker" not in " ".join(p.cmdline())] == []
    assert runtime.state == "failed" and runtime.image is None
