"""adapters/process.py: the loop's PlantSpec reaches a server process that takes one, a server
whose serve_forever has no `spec` parameter still starts (it loads the plant itself), and the
servers start together (both processes exist before either is waited for)."""

from pathlib import Path

import pytest

from adapters import process
from hil.scenario.config import load_scenario
from hil.image import ProcessImage

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)


def test_spec_handed_to_servers_that_take_it(monkeypatch):
    sc = load_scenario(ROOT / "configs" / "bioreactor_plc.toml")
    assert sc.served("modbus") is not None and sc.served("opcua") is not None
    spec = sc.plant.load().spec
    monkeypatch.setattr(process, "SERVERS", {"modbus": "tests.integration.fake_servers.no_spec",
                                             "opcua": "tests.integration.fake_servers.takes_spec"})
    waits = []
    real_wait = process._wait_ready

    def wait(ready, proc, max_s):
        waits.append(proc.name)
        return real_wait(ready, proc, max_s)

    monkeypatch.setattr(process, "_wait_ready", wait)
    spawned = []
    real_start = process.mp.get_context("spawn").Process.start

    def start(self):
        spawned.append((self.name, len(waits)))  # waits begun before this process started
        return real_start(self)

    monkeypatch.setattr(process.mp.get_context("spawn").Process, "start", start)
    image = ProcessImage.create(spec.n_inputs, spec.n_outputs)
    try:
        servers = process.start_servers(sc, image.name, spec=spec)
        counters = process.stop_servers(servers)
    finally:
        image.close()
    assert [name for name, _ in spawned] == ["hil-modbus", "hil-opcua"]
    assert all(n == 0 for _, n in spawned), spawned  # both started before any wait
    assert waits == ["hil-modbus", "hil-opcua"]
    assert counters["modbus"] == {"started": True}
    assert counters["opcua"]["spec_outputs"] == list(spec.names("outputs"))
