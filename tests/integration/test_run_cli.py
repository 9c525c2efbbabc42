"""`hil run` as a user runs it: JSON summary, and a recording that survives SIGKILL."""

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from tests.integration.net import free_port as _free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
HIL = [sys.executable, "-m", "hil.cli"]


def test_run_prints_json_summary_last(tmp_path):
    out = subprocess.run(
        HIL + ["run", "configs/bioreactor.toml", "--duration", "10", "--json", "--record", str(tmp_path / "rec")],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("steps", "sim_time_s", "wall_time_s", "overruns", "lateness_us", "record_path"):
        assert key in summary
    assert summary["steps"] == 10 and summary["sim_time_s"] == 10.0
    assert set(summary["lateness_us"]) >= {"p50", "p99", "p999", "max"}
    df = pd.read_parquet(summary["record_path"])  # pandas reads the directory as it is
    assert len(df) == 10


def test_bad_config_exits_2_and_names_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "configs/bioreactor.toml").read_text().replace("step_s = 1.0", "step_s = -1.0"))
    out = subprocess.run(HIL + ["run", str(bad), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "loop.step_s" in out.stderr and "greater than 0" in out.stderr
    assert out.stdout == ""  # nothing started, no summary


def _start_long_run(tmp_path) -> tuple[subprocess.Popen, Path]:
    rec = tmp_path / "rec"
    proc = subprocess.Popen(
        HIL + ["run", "configs/bioreactor.toml", "--duration", "100000", "--quiet", "--record", str(rec),
               "--set", "loop.time_scale=500"],  # 2 ms period
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    wait_for(lambda: len(list(rec.glob("part-*.parquet"))) >= 3, proc, "recorder wrote no parts", poll_s=0.1)
    return proc, rec


def _last_row_age_s(rec: Path, killed_ns: int) -> float:
    df = pd.read_parquet(rec)  # must be readable as left on disk
    return (killed_ns - df["wall_ns"].max()) * 1e-9, df


@pytest.mark.parametrize("whole_group", [False, True], ids=["loop-only", "loop-and-recorder"])
def test_sigkill_loses_at_most_about_a_second(tmp_path, whole_group):
    proc, rec = _start_long_run(tmp_path)
    try:
        time.sleep(1.5)
        killed_ns = time.monotonic_ns()
        if whole_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        time.sleep(2.0)  # an orphaned recorder drains the ring and exits
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    age_s, df = _last_row_age_s(rec, killed_ns)
    assert df["step"].is_monotonic_increasing and df["step"].diff().dropna().eq(1).all()
    leftovers = glob.glob(f"/dev/shm/hil_{proc.pid}_*") + glob.glob(f"/dev/shm/hil_rec_{proc.pid}_*")
    if whole_group:
        # flush interval 1 s: whole parts only, the last one at most ~1 s (+ write time) old
        assert age_s < 1.6, age_s
        for path in leftovers:  # nobody survived to free the shared memory: do it here
            os.unlink(path)
    else:
        # the recorder outlives the loop, writes what the ring still held, frees the memory
        assert age_s < 0.1, age_s
        assert leftovers == [], leftovers


def test_servers_do_not_outlive_a_killed_loop(tmp_path):
    """SIGKILL of the loop: its Modbus and OPC UA server processes stop, nothing serves stale data."""
    import psutil

    mb, ua = _free_port(), _free_port()
    proc = subprocess.Popen(
        HIL + ["run", "configs/bioreactor_plc.toml", "--duration", "100000", "--quiet", "--no-record",
               "--set", f"modbus.port={mb}", "--set", f"opcua.port={ua}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        def servers_listen() -> bool:
            return {mb, ua} <= {c.laddr.port for c in psutil.net_connections("tcp") if c.status == "LISTEN"}

        wait_for(servers_listen, proc, "servers never listened")
        children = psutil.Process(proc.pid).children()
        assert children
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert alive == [], [p.cmdline() for p in alive]
        listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == "LISTEN"}
        assert not ({mb, ua} & listening)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for path in glob.glob(f"/dev/shm/hil_{proc.pid}_*"):
            os.unlink(path)


# ---- a port already in use (issue 9): checked before anything starts ----

def _session_processes(sid: int) -> list:
    """Processes still alive in session `sid` (the hil run and everything it started)."""
    import psutil

    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.info)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return left


def _run_in_session(args: list[str], timeout: float = 90, prefix: list[str] | None = None):
    proc = subprocess.Popen((prefix or HIL) + args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"hil run did not exit within {timeout} s: {err[-2000:]}")
    return proc, out, err


def _leftovers(proc, rec: Path) -> dict:
    deadline = time.monotonic() + 10  # children still exiting get a bounded grace
    while (left := _session_processes(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    shm = glob.glob(f"/dev/shm/hil_{proc.pid}_*") + glob.glob(f"/dev/shm/hil_rec_{proc.pid}_*")
    return {"processes": left, "shm": shm, "recording": rec.exists()}


def test_port_in_use_exits_2_at_once_naming_port_and_holder(tmp_path):
    """A real listening socket on the Modbus port: exit 2 before anything starts, the message names
    127.0.0.1:PORT and the holder's pid; no process, image or recording left behind."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    rec = tmp_path / "rec"
    try:
        proc, out, err = _run_in_session(
            ["run", "configs/bioreactor_plc.toml", "--duration", "600", "--json", "--record", str(rec),
             "--set", f"modbus.port={port}", "--set", f"opcua.port={_free_port()}"])
    finally:
        holder.close()
    assert proc.returncode == 2, err
    assert f"127.0.0.1:{port}" in err and "modbus.port" in err and "already in use" in err, err
    assert f"pid {os.getpid()}" in err, err  # this test process holds it
    assert "AttributeError" not in err and "Traceback" not in err, err
    assert out == ""  # nothing ran, no summary
    assert _leftovers(proc, rec) == {"processes": [], "shm": [], "recording": False}


def test_two_servers_on_one_port_is_a_config_error(tmp_path):
    port = _free_port()
    out = subprocess.run(HIL + ["run", "configs/bioreactor_plc.toml", "--duration", "60", "--no-record",
                                "--set", f"modbus.port={port}", "--set", f"opcua.port={port}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert out.returncode == 2
    assert "opcua.port" in out.stderr and "also modbus.port" in out.stderr, out.stderr


# A port taken between the pre-check and the server's bind (or any other reason a server does not
# come up): the pre-check is switched off in this wrapper, so the Modbus child itself fails to listen.
_NO_PRECHECK = [sys.executable, "-c",
                "import sys, hil.scenario.ports as p; p.check_ports = lambda *a, **k: []; "
                "from hil.cli import main; sys.argv[0] = 'hil'; main()"]


def test_a_server_failing_after_the_precheck_is_a_clear_error_and_leaves_nothing(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    rec = tmp_path / "rec"
    try:
        proc, out, err = _run_in_session(
            ["run", "configs/bioreactor_plc.toml", "--duration", "600", "--record", str(rec),
             "--set", f"modbus.port={port}", "--set", f"opcua.port={_free_port()}"], prefix=_NO_PRECHECK)
    finally:
        holder.close()
    assert proc.returncode == 2, err
    assert "could not start" in err and f"modbus server on 127.0.0.1:{port}" in err, err
    assert "AttributeError" not in err and "Traceback" not in err, err
    assert _leftovers(proc, rec) == {"processes": [], "shm": [], "recording": False}


# ---- durations with units, --wall (issue 9) ----

def _hil(args, cwd=ROOT, prefix=None, timeout=120):
    return subprocess.run((prefix or HIL) + args, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_wall_duration_runs_wall_times_scale_steps_and_says_both():
    out = _hil(["run", "configs/bioreactor.toml", "--wall", "250ms", "--json", "--no-record"])  # 60x
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 15 and summary["sim_time_s"] == 15.0
    assert "15 s simulated = 250 ms wall at 60x" in out.stderr, out.stderr
    out = _hil(["run", "configs/bioreactor.toml", "--duration", "2min", "--lockstep", "--json", "--no-record"])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["steps"] == 120
    assert "2 min simulated (120 steps of 1 s), lockstep" in out.stderr


@pytest.mark.parametrize("args, says", [
    (["--duration", "0.5"], "--duration: 0.5 is 500 ms simulated, shorter than one loop step"),
    (["--wall", "10ms"], "--wall: 10ms is 600 ms simulated, shorter than one loop step"),
    (["--wall", "1s", "--lockstep"], "--wall: lockstep runs have no wall clock"),
    (["--duration", "1h", "--wall", "1s"], "not both"),
    (["--duration", "2 fortnights"], "unknown unit 'fortnights'"),
])
def test_durations_that_cannot_run_exit_2(args, says):
    out = _hil(["run", "configs/bioreactor.toml", "--no-record", "--json"] + args)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert out.stdout == ""


# ---- paths: the scenario's against its directory, the command line's against the cwd ----

def test_recording_lands_beside_the_scenario_and_the_banner_says_where(tmp_path):
    scen = tmp_path / "scen"
    scen.mkdir()
    text = (ROOT / "configs/bioreactor.toml").read_text()
    (scen / "s.toml").write_text(text.replace('path = "../runs/{scenario}-{timestamp}"', 'path = "rec/{scenario}"'))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = _hil(["run", str(scen / "s.toml"), "--lockstep", "--duration", "5", "--json"], cwd=cwd)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(summary["record_path"]) == scen / "rec/bioreactor"
    assert f"recording: {scen / 'rec/bioreactor'}" in out.stderr  # absolute, at start
    assert len(pd.read_parquet(scen / "rec/bioreactor")) == 5 and not (cwd / "rec").exists()
    out = _hil(["run", str(scen / "s.toml"), "--lockstep", "--duration", "5", "--json", "--record", "mine"], cwd=cwd)
    assert out.returncode == 0 and len(pd.read_parquet(cwd / "mine")) == 5
    assert f"recording: {cwd / 'mine'}" in out.stderr


# ---- scheduling: loop.priority = "auto" (the default) ----

def _fifo_permitted() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import os; os.sched_setscheduler(0, os.SCHED_FIFO, "
                            "os.sched_param(80))"], capture_output=True)
    return probe.returncode == 0


_NO_SYS_NICE = ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice"]


def _realtime_run(prefix=None):
    out = _hil(["run", "configs/bioreactor.toml", "--wall", "1s", "--json", "--no-record",
                "--set", "loop.time_scale=600", "--set", "loop.status_interval_s=0.2"], prefix=prefix)
    assert out.returncode == 0, out.stderr
    return out, json.loads(out.stdout.strip().splitlines()[-1])


def test_auto_scheduling_is_shown_at_start_in_the_status_line_and_the_summary():
    out, summary = _realtime_run()
    sched = summary["scheduling"]
    assert sched["requested"] == {"priority": "auto", "cpu": "auto"}
    if _fifo_permitted():
        assert (sched["policy"], sched["priority"], sched["mlock"]) == ("SCHED_FIFO", 80, True)
        if (os.cpu_count() or 1) > 1:
            assert len(sched["cpus"]) == 1
        assert "scheduling: SCHED_FIFO 80 on CPU" in out.stderr
        assert f"FIFO 80 cpu {sched['cpus'][0]}" in out.stderr  # the status line's tag
        assert summary["warnings"] == []
    else:
        assert sched["policy"] == "SCHED_OTHER"


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not installed")
def test_auto_without_the_privilege_falls_back_with_one_warning():
    out, summary = _realtime_run(prefix=_NO_SYS_NICE + HIL)
    sched = summary["scheduling"]
    assert sched["policy"] == "SCHED_OTHER" and sched["mlock"] is False
    assert len(sched["cpus"]) == len(os.sched_getaffinity(0))  # not pinned
    warnings = [w for w in summary["warnings"] if "SCHED_FIFO" in w]
    assert len(warnings) == 1 and "loop.priority = auto" in warnings[0]
    assert out.stderr.count("SCHED_FIFO not permitted") == 2  # once at start, once in the summary


def test_explicit_priority_0_is_normal_without_warning():
    out = _hil(["run", "configs/bioreactor.toml", "--wall", "200ms", "--json", "--no-record",
                "--set", "loop.priority=0", "--set", "loop.cpu=-1"])
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["scheduling"]["policy"] == "SCHED_OTHER" and summary["warnings"] == []


# ---- hil demo: --wall with units, the same port check ----

def test_demo_wall_takes_units_and_refuses_less_than_a_step(tmp_path):
    out = _hil(["demo", "--wall", "1ms", "--out", str(tmp_path / "d")])  # 0.3 s simulated at 300x
    assert out.returncode == 2 and "--wall: 1ms is 300 ms simulated, shorter than one loop step" in out.stderr, \
        out.stderr
    assert not (tmp_path / "d").exists()


def test_demo_with_a_port_in_use_exits_2_before_starting(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        proc, out, err = _run_in_session(["demo", "--wall", "30s", "--out", str(tmp_path / "d"),
                                          "--set", f"opcua.port={port}", "--set", f"modbus.port={_free_port()}"])
    finally:
        holder.close()
    assert proc.returncode == 2 and f"opcua.port: 127.0.0.1:{port}" in err and f"pid {os.getpid()}" in err, err
    assert _leftovers(proc, tmp_path / "d") == {"processes": [], "shm": [], "recording": False}
