"""configs/grid118.toml's IEC 60870-5-104 server in a real `hil run` (real time at 10x, the
Modbus and OPC UA servers switched off): a SCADA client (frames from scapy's IEC 104 layer)
sets a unit's set-point with select-before-operate and the recording shows it applied; an
out-of-range set-point, a command to an unknown IOA and one to a measured value are refused
with negative confirmations, counted in the run summary, and the loop goes on (a later
set-point is applied too); a general interrogation by c104's client returns values the loop
recorded."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

c104 = pytest.importorskip("c104")
pytest.importorskip("scapy.contrib.scada.iec104")

from hil.scenario.config import load_scenario  # noqa: E402
from hil.recorder import read_recording  # noqa: E402
from tests.integration.iec104_c104 import open_connection  # noqa: E402
from tests.integration.iec104_scapy import NEGATIVE, POSITIVE, ScapyIec104  # noqa: E402
from tests.integration.net import free_port, listening, wait_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "grid118.toml"
CA = 1
pytestmark = pytest.mark.timeout(300)


def _wait(cond, proc, what: str) -> None:
    wait_for(cond, proc, what, poll_s=0.05)


def _applied(pid: int, index: int, value: float) -> bool:
    """The run's loop has applied `value` to input `index` (read from its process image, which
    hil names after the creating process: /dev/shm/hil_<pid>_*)."""
    import glob
    import os

    from hil.image import ProcessImage

    for path in glob.glob(f"/dev/shm/hil_{pid}_*"):
        try:
            img = ProcessImage.attach(os.path.basename(path))
        except (OSError, ValueError):
            continue
        try:
            return img.snapshot().applied[index] == value
        finally:
            img.close()
    return False


def test_setpoint_with_select_before_operate_is_applied_and_refusals_leave_the_loop_running(tmp_path):
    port = free_port()
    i5 = load_scenario(CONFIG).plant.load().spec.index("inputs", "gen_5.p_set")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hil.cli", "run", str(CONFIG), "--json", "--quiet", "--wall", "200",
         "--record", str(tmp_path / "rec"), "--set", f"iec104.port={port}", "--set", "modbus.enabled=false",
         "--set", "opcua.enabled=false", "--set", "loop.time_scale=10.0", "--set", "loop.priority=0",
         "--set", "loop.cpu=-1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    cl = None
    try:
        wait_for(lambda: listening(port), proc, "the IEC 104 server never listened", poll_s=0.2)
        with ScapyIec104("127.0.0.1", port, timeout_s=30) as sc:
            sc.startdt()
            # handshake: the loop has published (objects valid, IV cleared)
            _wait(lambda: sc.interrogation(CA)[1][1].iv == 0, proc, "the loop never published")
            # commands from scapy's frames: their answers are read off the wire one by one (c104's
            # client can report them wrongly on loopback: tests/integration/iec104_c104.py)
            assert sc.setpoint(CA, 15005, 430.0, select=True).ack == POSITIVE
            assert sc.setpoint(CA, 15005, 430.0, select=False).ack == POSITIVE
            assert sc.setpoint(CA, 15005, 1.0e5, select=True).ack == POSITIVE     # the select is c104's
            assert sc.setpoint(CA, 15005, 1.0e5, select=False).ack == NEGATIVE    # out of range
            assert sc.setpoint(CA, 15999, 1.0, select=True).ack == NEGATIVE       # unknown IOA
            assert sc.setpoint(CA, 1012, 1.0, select=True).ack == NEGATIVE        # bus_12.vm, a measured value
            _wait(lambda: _applied(proc.pid, i5, 430.0), proc, "430 MW never applied")
            assert sc.setpoint(CA, 15005, 420.0, select=True).ack == POSITIVE
            assert sc.setpoint(CA, 15005, 420.0, select=False).ack == POSITIVE
        _wait(lambda: _applied(proc.pid, i5, 420.0), proc, "420 MW never applied")
        # c104's client interrogates: values of a step the loop recorded
        cl = c104.Client(tick_rate_ms=50, command_timeout_ms=20_000)
        con = cl.add_connection(ip="127.0.0.1", port=port, init=c104.Init.NONE)
        st = con.add_station(common_address=CA)

        def on_new_point(client: c104.Client, station: c104.Station, io_address: int, point_type: c104.Type) -> None:
            station.add_point(io_address=io_address, type=point_type)

        cl.on_new_point(callable=on_new_point)
        cl.start()
        open_connection(con, 120.0, alive=lambda: proc.poll() is None)
        assert con.interrogation(common_address=CA)
        gi = {p.io_address: (p.type, p.value, p.quality) for p in st.points}
        cl.stop()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if cl is not None:
            cl.stop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    df = read_recording(summary["record_path"])
    applied = df["app.gen_5.p_set"].to_numpy()
    # the case's set-point (unless the command came before the first step), then the two accepted
    # ones in order (each applied in a step before the next was sent), and nothing of the refused 1e5 MW
    runs = [v for i, v in enumerate(applied) if i == 0 or v != applied[i - 1]]
    assert runs in ([450.0, 430.0, 420.0], [430.0, 420.0])
    assert (df["step"].diff().dropna() == 1).all()     # the loop stepped throughout, no step missing
    counters = summary["iec104"]
    assert counters["commands_accepted"] == 2
    assert counters["commands_refused"] == {"out_of_range": 1, "unknown_ioa": 1, "wrong_type": 1}
    # the general interrogation served values the loop published (and recorded): bus voltages, breakers
    assert len(gi) == 1202 - 186 - 54 * 2 - 118      # every monitor object (commands are not interrogated)
    for k in range(1, 119):
        ptype, value, quality = gi[1000 + k]
        assert ptype == c104.Type.M_ME_TF_1 and quality.is_good()
        assert np.float32(value) in set(df[f"meas.bus_{k}.vm"].to_numpy().astype(np.float32).tolist()), k
    for k in range(1, 187):
        ptype, value, quality = gi[4000 + k]
        assert ptype == c104.Type.M_DP_TB_1 and value in (c104.Double.ON, c104.Double.OFF)
