"""Another local user holds a scenario's default run directory: `hil run` moves to a fresh
private one (and says so), `hil safety status SCENARIO` still finds the run through this
user's run index, and the end of the run removes both the directory and the index entry."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HIL = [sys.executable, "-m", "hil.cli"]

pytestmark = pytest.mark.timeout(240)


def test_a_squatted_default_run_directory_moves_the_run_and_status_finds_it(tmp_path):
    # the policy scenario under a name of its own: its default run directory is this test's alone
    name = f"sq{os.getpid()}"
    text = (ROOT / "configs/bioreactor_policy.toml").read_text()
    for old, new in (('name = "bioreactor_policy"', f'name = "{name}"'),
                     ('"../policies/bioreactor"', f'"{ROOT / "policies/bioreactor"}"'),
                     ('"../runs/{scenario}-{timestamp}-safety.jsonl"', f'"{tmp_path / "decisions.jsonl"}"')):
        assert old in text
        text = text.replace(old, new)
    config = tmp_path / f"{name}.toml"
    config.write_text(text)
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg)}
    user = subprocess.run([sys.executable, "-c", "import getpass; print(getpass.getuser())"],
                          capture_output=True, text=True).stdout.strip()
    default = os.path.join(tempfile.gettempdir(), f"hil-{user}-{name}")
    shutil.rmtree(default, ignore_errors=True)
    os.mkdir(default, 0o755)
    os.chmod(default, 0o755)
    if os.geteuid() == 0:
        os.chown(default, 65534, 65534)  # another user's directory
    index = xdg / "hil" / "runs.json"
    proc = subprocess.Popen(
        HIL + ["run", str(config), "--duration", "100000", "--quiet", "--no-record"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        status = None
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and status is None:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            if index.exists():
                out = subprocess.run(HIL + ["safety", "status", str(config), "--json", "--timeout", "2"], cwd=ROOT,
                                     env=env, capture_output=True, text=True, timeout=60)
                if out.returncode == 0:
                    status = json.loads(out.stdout.strip().splitlines()[-1])
                    break
            time.sleep(0.5)
        assert status is not None, "hil safety status never found the run"
        assert status["mode"]
        entry = json.loads(index.read_text())[name]
        moved = entry["dir"]
        assert entry["pid"] == proc.pid and entry["default"] == default
        assert moved != default and os.path.isdir(moved) and os.lstat(moved).st_uid == os.geteuid()
        assert os.path.exists(os.path.join(moved, "control"))  # the safety's control socket is there
        assert os.listdir(default) == []  # nothing of the run in the other user's directory
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
        leftover = os.path.exists(moved) if status is not None else None
        shutil.rmtree(default, ignore_errors=True)
    assert proc.returncode == 0, err[-3000:]
    assert f"run directory {default} unusable" in err and moved in err, err[-3000:]
    assert leftover is False and json.loads(index.read_text()) == {}
