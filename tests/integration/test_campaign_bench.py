"""`hil bench modbus|opcua` against hil's own servers on 127.0.0.1: the report, a profile that a
lockstep scenario replays, and the server's own counters showing the requests on the wire."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.integration.net import free_port as _free_port, listening as _listening, wait_for

ROOT = Path(__file__).resolve().parents[2]
HIL = [sys.executable, "-m", "hil.cli"]
pytestmark = pytest.mark.timeout(240)


def test_bench_modbus_and_opcua_against_hil_servers(tmp_path):
    mb, uap = _free_port(), _free_port()
    proc = subprocess.Popen(
        HIL + ["run", "configs/bioreactor_plc.toml", "--duration", "100000", "--json", "--quiet", "--no-record",
               "--set", f"modbus.port={mb}", "--set", f"opcua.port={uap}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: _listening(mb) and _listening(uap), proc, "servers never listened")
        r = subprocess.run(HIL + ["bench", "modbus", f"127.0.0.1:{mb}", "--requests", "60", "--rate", "200",
                                  "--count", "8", "--out", str(tmp_path / "mb"), "--json"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout.strip().splitlines()[-1])
        assert rep["errors"] == {"rtt_1": 0, "read_N": 0}
        assert rep["stats"]["rtt_1"]["n"] == 60 and rep["stats"]["read_N"]["n"] == 60
        assert rep["achieved_rate_hz"] <= 200 * 1.05  # bounded: never faster than asked
        r = subprocess.run(HIL + ["bench", "opcua", f"opc.tcp://127.0.0.1:{uap}/hil", "--requests", "30",
                                  "--rate", "100", "--count", "4", "--subscribe-s", "2", "--publish-ms", "50",
                                  "--out", str(tmp_path / "ua"), "--json"],
                           capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr
        ua_rep = json.loads(r.stdout.strip().splitlines()[-1])
        assert ua_rep["stats"]["rtt_1"]["n"] == 30 and ua_rep["stats"]["read_N"]["n"] == 30
        assert ua_rep["notifications"] > 0 and ua_rep["stats"]["sub_interval"]["n"] > 0
        os.kill(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["modbus"]["reads"] >= 120  # what the server saw: every bench request
    assert summary["opcua"]["reads"] >= 60 and summary["opcua"]["monitored_items"] >= 1
    # the profile loads and a lockstep run replays it as an observation delay
    from hil.gaps.profile import load_profile

    prof = load_profile(tmp_path / "mb" / "profile.json")
    assert set(prof) == {"modbus.rtt_1", "modbus.read_N"} and prof["modbus.rtt_1"].samples.size == 60
    assert set(load_profile(tmp_path / "ua" / "profile.json")) >= {"opcua.rtt_1", "opcua.read_N", "opcua.sub_interval"}
    chan = '{dist = "profile", file = "%s", series = "modbus.rtt_1"}' % (tmp_path / "mb" / "profile.json")
    r = subprocess.run(HIL + ["run", "configs/bioreactor.toml", "--lockstep", "--duration", "60", "--no-record",
                              "--json", "--quiet", "--set", f"gaps.latency.observation.dissolved_oxygen={chan}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
