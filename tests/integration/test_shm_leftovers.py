"""A SIGKILLed `hil run --no-record` leaves nothing in /dev/shm: the image's writers lock its
own file (no `hil_<pid>_*.lock` beside it), and lock files older versions left are swept by
the next run when their creator is dead."""

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HIL = [sys.executable, "-m", "hil.cli"]
pytestmark = pytest.mark.timeout(180)


def _files_of(pid: int) -> list[str]:
    return glob.glob(f"/dev/shm/hil_{pid}_*")


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_sigkilled_run_leaves_no_lock_file_and_the_next_run_sweeps_old_ones():
    proc = subprocess.Popen(
        HIL + ["run", "configs/bioreactor.toml", "--duration", "100000", "--quiet", "--no-record",
               "--set", "loop.time_scale=100"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    legacy = [f"/dev/shm/hil_{_dead_pid()}_123456789.lock", f"/dev/shm/hil_{os.getpid()}_123456789.lock"]
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not _files_of(proc.pid):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(0.1)
        files = _files_of(proc.pid)
        assert files, "the run made no process image"
        assert not [f for f in files if f.endswith(".lock")], files
        time.sleep(1.0)  # running: the loop has taken the writers' lock (input repairs) by now
        assert not [f for f in _files_of(proc.pid) if f.endswith(".lock")]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # the image block itself goes with the run's resource tracker (it outlives the loop)
        deadline = time.monotonic() + 30
        while _files_of(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _files_of(proc.pid) == []
        # lock files as hil left them before: the next run removes the dead creator's only
        for path in legacy:
            Path(path).touch(mode=0o600)
        out = subprocess.run(HIL + ["run", "configs/bioreactor.toml", "--lockstep", "--duration", "10", "--quiet",
                                    "--no-record"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        assert not os.path.exists(legacy[0])
        assert os.path.exists(legacy[1])  # this test's process is alive: not stale
        assert _files_of(proc.pid) == []
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for path in legacy + _files_of(proc.pid):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
