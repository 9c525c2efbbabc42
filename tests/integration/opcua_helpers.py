"""Helpers of the OPC UA integration tests: a real server process over a real image.

`OpcuaServer(data, tmp_path)` creates a process image for the bioreactor, starts
`adapters.opcua.serve_forever` in a child process (this file run as a script) on a free
port, waits for it to be ready, and on `stop()` sends SIGTERM (SIGKILL after 10 s) and
removes the image; the server's final counters are then in `final_counters()`. The test process owns the image: it plays the loop (`publish`) and
reads what clients wrote (`read_inputs`).

`run_node(request)` runs tests/node/client.js (node-opcua) and returns its JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from tests.integration.net import free_port

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / "node"
NODE_CLIENT = NODE_DIR / "client.js"
SCENARIO = "hiltest"


def node_available() -> str | None:
    """None if node-opcua can run, else the reason to skip."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (NODE_DIR / "node_modules" / "node-opcua").is_dir():
        return "node-opcua is not installed: run `npm ci --prefix tests/node` (CI does)"
    return None


def scenario_data(port: int, opcua: dict | None = None, inputs: dict | None = None, loop: dict | None = None) -> dict:
    """A bioreactor scenario (names from plants/bioreactor.py SPEC) with an [opcua] section."""
    section = {"port": port}
    section.update(opcua or {})
    return {
        "scenario": {"name": SCENARIO},
        "plant": {"model": "bioreactor"},
        "loop": loop or {"step_s": 1.0, "time_scale": 1000.0, "duration_s": 60.0},
        "inputs": inputs or {},
        "opcua": section,
    }


def spec():
    from plants.base import load_plant_module

    return load_plant_module("bioreactor").SPEC


class OpcuaServer:
    """A running `serve_forever` child over an image this process owns."""

    def __init__(self, data: dict, workdir: Path, ready_timeout_s: float | None = None):
        from hil.scenario.config import parse_scenario
        from hil.image import ProcessImage

        self.data = data
        self.scenario = parse_scenario(data)
        self.section = self.scenario.opcua
        self.spec = spec()
        self.image = ProcessImage.create(self.spec.n_inputs, self.spec.n_outputs)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "scenario.json"
        cfg.write_text(json.dumps(data))
        self.log_path = self.workdir / "server.log"
        self._log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "serve", str(cfg), self.image.name],
                cwd=self.workdir, stdout=subprocess.PIPE, stderr=self._log, text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            self._wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, max_s: float | None) -> None:
        """READY on its stdout, waited for as long as the server lives and makes progress
        (hil/readiness.py): a loaded machine is slow, not wrong; a dead server fails at once."""
        from hil import readiness

        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        why = readiness.wait_ready(lambda: bool(got), [self.proc.pid], lambda: self.proc.poll() is None,
                                   wait=lambda s: (reader.join(s), bool(got))[1], poll_s=0.1,
                                   max_s=readiness.MAX_S if max_s is None else max_s)
        if why is not None or not got[0].startswith("READY"):
            raise RuntimeError(f"OPC UA server did not start ({why or got[0].strip()!r}): {self.log()}")

    @property
    def url(self) -> str:
        return self.section.endpoint_url()

    def final_counters(self) -> dict:
        """The server's final counters (adapters.opcua.final_counters), written when it stopped."""
        return json.loads((self.workdir / "summary.json").read_text())

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-4000:]

    def input_index(self, name: str) -> int:
        return self.spec.index("inputs", name)

    def publish(self, outputs=None, applied=None, step: int = 1, sim_time_s: float = 1.0) -> None:
        out = self.spec.nominal("outputs") if outputs is None else outputs
        app = self.spec.nominal("inputs") if applied is None else applied
        self.image.publish(out, app, step, sim_time_s)

    def stop(self) -> int | None:
        code = None
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(5)
        elif proc is not None:
            code = proc.returncode
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        self._log.close()
        self.image.close()
        return code


def node_ids(scenario: str = SCENARIO) -> dict:
    """String NodeId parts: {'sensor': '<scenario>.Sensors.', ...} (namespace index added by callers)."""
    return {k: f"{scenario}.{f}." for k, f in (("sensor", "Sensors"), ("actuator", "Actuators"),
                                                ("applied", "Applied"), ("status", "Status"))}


def run_node(request: dict, timeout_s: float = 60.0) -> dict:
    """Run the node-opcua client with `request`; its JSON result (raises if it is not JSON)."""
    out = subprocess.run(["node", str(NODE_CLIENT), json.dumps(request)], capture_output=True, text=True,
                         timeout=timeout_s, cwd=NODE_DIR)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"node client printed no JSON (exit {out.returncode}): {out.stderr[-3000:]}")
    return json.loads(lines[-1])


class _Ready:
    def set(self) -> None:
        print("READY", flush=True)


def _serve(cfg_path: str, image_name: str) -> None:
    import logging

    from adapters.opcua import serve_forever
    from hil.scenario.config import parse_scenario

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    scenario = parse_scenario(json.loads(Path(cfg_path).read_text()))
    serve_forever(scenario, image_name, ready=_Ready(), summary_path=str(Path(cfg_path).with_name("summary.json")))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        _serve(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: opcua_helpers.py serve SCENARIO_JSON IMAGE_NAME")
