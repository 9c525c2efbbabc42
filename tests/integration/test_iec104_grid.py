"""configs/grid118.toml's IEC 60870-5-104 server in a real `hil run` (real time at 10x, the
Modbus and OPC UA servers switched off): a SCADA client (c104's) sets a unit's set-point with
select-before-operate and the recording shows it applied; an out-of-range set-point, a command
to an unknown IOA and one to a measured value are refused with negative confirmations, counted
in the run summary, and the loop goes on (a later set-point is applied too); a general
interrogation (scapy's IEC 104 layer) returns values the loop recorded."""

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

from hil.recorder import read_recording  # noqa: E402
from tests.integration.iec104_c104 import Wire, command, open_connection  # noqa: E402
from tests.integration.iec104_scapy import ScapyIec104  # noqa: E402
from tests.integration.net import free_port, listening, wait_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "grid118.toml"
CA = 1
pytestmark = pytest.mark.timeout(300)


def _wait(cond, proc, what: str) -> None:
    wait_for(cond, proc, what, poll_s=0.05)


def test_setpoint_with_select_before_operate_is_applied_and_refusals_leave_the_loop_running(tmp_path):
    port = free_port()
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
        cl = c104.Client(tick_rate_ms=50, command_timeout_ms=20_000)
        con = cl.add_connection(ip="127.0.0.1", port=port, init=c104.Init.NONE)
        st = con.add_station(common_address=CA)
        p_set = st.add_point(io_address=15005, type=c104.Type.C_SE_NC_1,
                             command_mode=c104.CommandMode.SELECT_AND_EXECUTE)
        unknown = st.add_point(io_address=15999, type=c104.Type.C_SE_NC_1,
                               command_mode=c104.CommandMode.SELECT_AND_EXECUTE)
        sensor = st.add_point(io_address=1012, type=c104.Type.C_SE_NC_1)       # bus_12.vm: measured
        wire = Wire(con)
        cl.start()
        open_connection(con, 120.0, alive=lambda: proc.poll() is None)
        assert command(p_set, 430.0, wire), wire.received          # select, execute: both confirmed
        for point, value in ((p_set, 1.0e5), (unknown, 1.0), (sensor, 1.0)):
            command(point, value, wire)   # judged on the wire, not by c104's transmit(): see test_iec104_server
            _wait(lambda: wire.negative(point.io_address), proc, f"no negative answer for {point}")
        time.sleep(1.0)                                             # ~10 loop steps at 10x with 430 MW applied
        assert command(p_set, 420.0, wire)
        time.sleep(1.0)
        with ScapyIec104("127.0.0.1", port, timeout_s=30) as sc:   # values of a step the loop recorded
            sc.startdt()
            gi = sc.interrogation(CA)
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
    # ones in order, and nothing of the refused 1e5 MW
    runs = [v for i, v in enumerate(applied) if i == 0 or v != applied[i - 1]]
    assert runs in ([450.0, 430.0, 420.0], [430.0, 420.0])
    assert (df["step"].diff().dropna() == 1).all() and len(df) > 20    # the loop stepped throughout
    counters = summary["iec104"]
    assert counters["commands_accepted"] == 2
    # per refused message: c104's client sends the execute after a refused select too (unknown IOA)
    refused = counters["commands_refused"]
    assert refused["out_of_range"] == 1 and refused["wrong_type"] == 1 and refused["unknown_ioa"] in (1, 2)
    assert set(refused) == {"out_of_range", "wrong_type", "unknown_ioa"}
    # the general interrogation served values the loop published (and recorded): bus voltages, breakers
    for k in range(1, 119):
        name, io = gi[1000 + k]
        assert name == "M_ME_TF_1" and io.iv == 0
        assert io.scaled_value in set(df[f"meas.bus_{k}.vm"].to_numpy().astype(np.float32).tolist()), k
    for k in range(1, 187):
        name, io = gi[4000 + k]
        assert name == "M_DP_TB_1" and io.dpi_value in {1, 2}
