"""hil/run_dirs.py: an unusable default run directory moves the run to a fresh private one,
recorded in this user's index so that operator commands find it; released at the end."""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from hil.errors import ConfigError
from hil.run_dirs import index_path, locate, pin_run_dir, release
from tests.hil.safety.helpers import scenario


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Its own temporary directory (the default run directory's parent) and its own index."""
    tmp = Path(tempfile.mkdtemp(prefix="rd"))  # short: ipc paths are limited to 100 bytes
    run = tmp_path / "xdg"
    run.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def _squat(path: str) -> None:
    """Another user's directory at `path` (root: chown to nobody; else a mode wider than 0711)."""
    os.mkdir(path, 0o755)
    os.chmod(path, 0o755)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)


def test_a_squatted_default_moves_the_run_and_the_index_finds_it(private_tmp):
    sc = scenario()
    default = sc.bus.resolved_ipc_dir(sc.name)
    assert pin_run_dir(sc) == (sc, None)  # usable default: nothing moves
    _squat(default)
    pinned, reason = pin_run_dir(sc)
    d = pinned.bus.ipc_dir
    assert d and d != default and os.path.dirname(d) == str(private_tmp)
    st = os.lstat(d)
    assert st.st_uid == os.geteuid() and (st.st_mode & 0o777) == 0o700
    assert default in reason and d in reason and index_path() in reason
    assert index_path().startswith(os.environ["XDG_RUNTIME_DIR"])
    assert (os.stat(index_path()).st_mode & 0o777) == 0o600
    entry = json.loads(open(index_path()).read())[sc.name]
    assert entry["dir"] == d and entry["pid"] == os.getpid() and entry["default"] == default
    # every endpoint of the run is in the fresh directory; the squatter's gets nothing
    assert all(pinned.bus.endpoint(n, sc.name).startswith(f"ipc://{d}/")
               for n in ("action", "control", "obs_safety", "proposal"))
    # an operator command loading the scenario afresh finds the run
    assert locate(scenario()).bus.endpoint("control", sc.name) == f"ipc://{d}/control"
    release(sc.name, d)
    assert not os.path.exists(d) and sc.name not in json.loads(open(index_path()).read())
    assert locate(scenario()).bus.ipc_dir == ""
    assert os.listdir(default) == [] and os.lstat(default).st_mode & 0o777 == 0o755  # untouched


def test_entries_of_dead_runs_are_ignored_and_pruned(private_tmp):
    sc = scenario()
    p = subprocess.Popen(["true"])
    p.wait()
    os.makedirs(os.path.dirname(index_path()), mode=0o700, exist_ok=True)
    with open(index_path(), "w") as f:
        json.dump({sc.name: {"dir": str(private_tmp / "gone"), "pid": p.pid}}, f)
    assert locate(scenario()).bus.ipc_dir == ""
    assert json.loads(open(index_path()).read()) == {}


def test_a_damaged_index_is_not_an_error(private_tmp):
    _squat(scenario().bus.resolved_ipc_dir(scenario().name))
    os.makedirs(os.path.dirname(index_path()), mode=0o700, exist_ok=True)
    with open(index_path(), "w") as f:
        f.write("{not json")
    pinned, reason = pin_run_dir(scenario())
    assert reason and locate(scenario()).bus.ipc_dir == pinned.bus.ipc_dir
    release(pinned.name, pinned.bus.ipc_dir)


def test_an_explicit_run_directory_is_never_moved(private_tmp):
    d = private_tmp / "mine"
    _squat(str(d))
    with pytest.raises(ConfigError, match="bus.ipc_dir"):
        scenario({"bus": {"ipc_dir": str(d)}})
    os.chmod(d, 0o700)
    if os.geteuid() == 0:
        os.chown(d, 0, 0)
    sc = scenario({"bus": {"ipc_dir": str(d)}})
    assert pin_run_dir(sc) == (sc, None) and locate(sc) is sc
