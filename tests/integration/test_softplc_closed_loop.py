"""SoftPLC in closed loop with a plant over a real Modbus server, and through a server crash.

Processes: a publisher stepping the `mbtank` plant (4x faster than real time) and the
Modbus server, each in its own process over the process image; the SoftPLC runs in the
test process (a thread) so its state can be watched.
"""

import threading
import time

import pandas as pd
import pytest
from click.testing import CliRunner

from adapters.modbus_log import read_request_log
from hil.softplc import SoftPlc, run_softplc
from tests.integration import modbus_helpers as H

pytestmark = pytest.mark.timeout(120)
IDX = {n: H.SPEC.index("inputs", n) for n in H.SPEC.names("inputs")}
OUT = {n: H.SPEC.index("outputs", n) for n in H.SPEC.names("outputs")}
LEVEL = {"name": "level", "measurement": "level", "output": "inflow", "setpoint": 50.0, "kp": 0.2, "ki": 0.8}
TEMP = {"name": "temp", "measurement": "temperature", "output": "coolant", "setpoint": 310.0, "kp": 0.5,
        "ki": 0.8, "reverse": True}
PLC = {"scan_ms": 50, "comm_loss_scans": 3, "timeout_ms": 200, "reconnect_min_ms": 50,
       "reconnect_max_ms": 200, "recovery_hold_scans": 6, "loops": [LEVEL, TEMP],
       "outputs": {"pump": 1.0}, "safe_outputs": {"inflow": 0.0, "coolant": 25.0}}


def test_pid_loops_drive_the_plant_to_setpoint_over_modbus(tmp_path):
    log_path = tmp_path / "requests.jsonl"
    with H.rig(softplc=PLC, server=False, time_scale=4.0) as r:
        r.start_server(log_path=str(log_path))
        stats = run_softplc(r.sc, duration_s=5.0, record_path=str(tmp_path / "scan.parquet"))
        y = r.image.snapshot().outputs
        u = r.image.read_inputs()
        r.stop_server()
    # steady state: level = 5 * inflow, temperature = 330 - 2 * coolant (see modbus_helpers)
    assert abs(y[OUT["level"]] - 50.0) < 1.0 and abs(y[OUT["temperature"]] - 310.0) < 1.0, y
    assert u[IDX["inflow"]] == pytest.approx(10.0, abs=0.5) and u[IDX["coolant"]] == pytest.approx(10.0, abs=0.5)
    assert u[IDX["pump"]] == 1.0  # the fixed output
    # 100 deadlines in 5 s: every one either scanned or counted as an overrun, never extra
    assert stats["scans"] + stats["overruns"] in range(99, 102)
    assert stats["comm_errors"] == 0 and stats["good_scans"] == stats["scans"]
    scan = pd.read_parquet(stats["record_path"])
    assert len(scan) == stats["scans"] and scan["pv.level"].iloc[-1] == pytest.approx(50.0, abs=1.0)
    # on the wire: block reads of the input registers, every write an FC16/FC15, one connection
    req = read_request_log(log_path)
    assert set(req[req["wrote"]]["fc"]) == {15, 16}
    assert set(req[~req["wrote"]]["fc"]) <= {1, 3, 4}
    assert (req["fc"] == 4).sum() == stats["good_scans"]  # level+temperature: one FC4 per scan
    assert req["peer"].nunique() == 1 and (req["exc"] == 0).all()


def test_comm_loss_goes_safe_and_recovery_resumes(tmp_path):
    with H.rig(softplc=PLC, time_scale=4.0) as r:
        plc = SoftPlc(r.sc)
        stop = threading.Event()
        th = threading.Thread(target=plc.run, kwargs={"stop": stop}, daemon=True)
        th.start()
        try:
            H.wait_until(lambda: plc.stats.good_scans >= 20)
            r.stop_server(graceful=False)  # SIGKILL: the link dies mid-anything
            H.wait_until(lambda: plc.state == "comm_loss", timeout_s=5)
            assert plc.stats.comm_losses == 1 and plc.stats.comm_errors >= 3
            writes0 = r.image.counters()["input_writes"]
            time.sleep(0.5)  # the PLC keeps scanning and reconnecting, but nothing reaches the plant
            assert r.image.counters()["input_writes"] == writes0
            assert plc.stats.connect_failures >= 2
            scans_down = plc.stats.scans

            r.start_server()  # same port
            seen_safe = H.wait_until(
                lambda: (lambda u: u[IDX["inflow"]] == 0.0 and u[IDX["coolant"]] == 25.0)(r.image.read_inputs()),
                timeout_s=5, interval_s=0.005)
            assert seen_safe and plc.stats.recoveries == 1
            H.wait_until(lambda: plc.state == "run", timeout_s=5)
            # resumes control from the safe outputs: level goes back towards 50 %
            H.wait_until(lambda: abs(r.image.snapshot().outputs[OUT["level"]] - 50.0) < 3.0, timeout_s=15)
            assert plc.stats.scans > scans_down
        finally:
            stop.set()
            th.join(10)
    assert plc.stats.comm_losses == 1
    log = plc.scan_log()
    states = list(dict.fromkeys(log["state"]))  # order of first appearance
    assert states == ["run", "comm_loss", "recover"]
    rec = log[log["state"] == "recover"]
    assert (rec["out.level"] == 0.0).all() and (rec["out.temp"] == 25.0).all()


def test_softplc_without_a_server_reports_comm_loss_and_writes_nothing():
    with H.rig(softplc={**PLC, "comm_loss_scans": 2}, server=False, publisher=False) as r:
        stats = run_softplc(r.sc, duration_s=0.6)
        assert r.image.counters()["input_writes"] == 0
    assert stats["good_scans"] == 0 and stats["comm_losses"] == 1 and stats["state"] == "comm_loss"
    assert stats["connect_failures"] >= 2


def test_hil_softplc_command(tmp_path):
    from hil.cli import main

    with H.rig(softplc=PLC, time_scale=4.0) as r:
        cfg = tmp_path / "mbtank.toml"
        cfg.write_text(H.to_toml(H.scenario_dict(r.port, softplc=PLC)))
        res = CliRunner().invoke(main, ["softplc", str(cfg), "--duration", "1", "--json", "--quiet",
                                        "--record", str(tmp_path / "scan.csv")])
    assert res.exit_code == 0, res.output
    import json

    stats = json.loads(res.output.strip().splitlines()[-1])
    assert stats["good_scans"] >= 15 and stats["comm_errors"] == 0
    assert len(pd.read_csv(tmp_path / "scan.csv")) == stats["scans"]
    bad = CliRunner().invoke(main, ["softplc", str(tmp_path / "missing.toml")])
    assert bad.exit_code == 2
