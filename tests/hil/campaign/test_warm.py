"""hil/campaign/warm.py: the worker's Numba cache of the policy kernel is built by a process of
its own, copied fresh into each run's policy directory, and is what a policy process loads."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hil.campaign import warm

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def fresh_store(monkeypatch):
    monkeypatch.setattr(warm, "_store", None)
    yield
    if warm._store is not None:
        import shutil

        shutil.rmtree(warm._store, ignore_errors=True)


@pytest.mark.timeout(300)
def test_each_run_gets_its_own_copy_and_the_kernel_loads_from_it(tmp_path, fresh_store):
    from hil.confine import policy_dir

    store = warm.policy_cache()
    assert store is not None and any(store.rglob("*.nbi")) and any(store.rglob("*.nbc"))
    assert warm.policy_cache() is store  # built once per worker
    runs = []
    for name in ("run1", "run2"):
        ipc = tmp_path / name
        ipc.mkdir(mode=0o700)
        assert warm.seed_policy_cache(ipc, None)
        runs.append(Path(policy_dir(str(ipc))) / warm.CACHE_SUBDIR)
    # each run its own copy: what one run's policy writes into it is not the other's (nor the store's)
    (runs[0] / "written_by_run1").write_text("x")
    assert not (runs[1] / "written_by_run1").exists() and not (store / "written_by_run1").exists()
    # a fresh interpreter with NUMBA_CACHE_DIR at a run's copy loads the kernel instead of compiling
    # it: Numba's cache statistics count one hit and no miss
    probe = warm._BUILD + "\nfrom hil.policy.ensemble import _members_kernel as k\n" \
                          "print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))\n"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(runs[1]), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1", "0"], r.stdout
    # and without the copy it compiles (the probe can tell)
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "empty")
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0 and r.stdout.split() == ["0", "1"], (r.stdout, r.stderr[-2000:])
