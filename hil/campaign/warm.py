"""What a campaign worker keeps warm across runs beyond its own imports: the policy process's
Numba cache.

The policy process runs confined with NUMBA_CACHE_DIR in its own run's directory
(`<bus.ipc_dir>/policy/numba-cache`, hil/safety/launch.py), which a campaign creates fresh for
every run: every policy run compiled the ensemble's kernel (hil/policy/ensemble.py
`_members_kernel`) from scratch. Measured here: a fresh interpreter's first call takes 3.7 s
compiling, 0.9 s loading from a cache; within a policy run of the shipped campaign the CPU time
of its child processes went from 6.42 to 5.89 s (median of 5 alternating runs each, load 5-7,
`benchmarks/campaign_throughput.py --ab-policy-cache 5`): the rest is their start-up, which
only processes kept alive across runs would save. A worker now builds that cache once, in a process of its own that runs hil's code
only (dummy weights of the ensemble's array kinds: no policy file is read, no policy code runs),
and gives every policy run a fresh copy of it before the policy starts. Nothing flows back: what
a policy process writes into its copy (it may be a hostile policy) is deleted with its run, so
no run sees another run's state. Compiled or loaded from the cache, the kernel is the same
machine code: a run's recording is identical either way (tests/integration/
test_campaign_warm.py).

A policy process whose calls have other array types than the cache holds compiles as before
(a cache miss costs what every run cost so far, nothing more).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE_SUBDIR = "numba-cache"  # the name hil/safety/launch.py gives NUMBA_CACHE_DIR in the policy's directory

# run by a fresh interpreter with NUMBA_CACHE_DIR set: compiles the ensemble's one-observation
# kernel for the array kinds MLPEnsemble passes it (float64 C arrays, int64 index arrays)
_BUILD = """
import numpy as np
from hil.policy.ensemble import MLPEnsemble
M, f, h, a = 2, 3, 4, 2
e = MLPEnsemble(x_mean=np.zeros(f), x_std=np.ones(f), y_mean=np.zeros(a), y_std=np.ones(a),
                W0=np.zeros((M, f, a)), W1=np.zeros((M, f, h)), b1=np.zeros((M, h)), W2=np.zeros((M, h, a)),
                b2=np.zeros((M, a)), residual_index=np.array([0, -1]))
e.act_members(np.ones(f))
"""

_store: Path | None = None  # this process's built cache (None: not built yet)


def policy_cache(timeout_s: float = 600.0) -> Path | None:
    """This worker's Numba cache of the policy's kernels, built on first use (None if the build
    failed: runs then compile as before; the reason goes to stderr). timeout_s bounds a build that
    hangs; a loaded machine takes seconds."""
    global _store
    if _store is not None:
        return _store
    d = Path(tempfile.mkdtemp(prefix="hil-policy-numba-"))
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "NUMBA_CACHE_DIR": str(d),
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    r = subprocess.run([sys.executable, "-c", _BUILD], env=env, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0 or not any(d.rglob("*.nbi")):
        print(f"hil campaign: the policy's Numba cache was not built (runs compile it): {r.stderr[-500:]}",
              file=sys.stderr)
        shutil.rmtree(d, ignore_errors=True)
        return None
    import atexit

    atexit.register(shutil.rmtree, d, True)
    _store = d
    return d


def seed_policy_cache(ipc_dir: str | os.PathLike, policy_section, replace: bool = False) -> bool:
    """Copy this worker's cache to where the run's policy process will look for it
    (`<ipc_dir>/policy/numba-cache`), owned by the uid the policy runs as; True if seeded.
    Call before the Runtime starts the policy (hil/confine.prepare_policy_dir keeps the directory).
    replace: a copy already there (an earlier policy process's, hil/campaign/warm_procs.py) is
    deleted first, so a fresh process never reads what another one wrote."""
    from hil.confine import policy_confinement, policy_dir

    store = policy_cache()
    if store is None:
        return False
    pdir = Path(policy_dir(str(ipc_dir)))
    pdir.mkdir(mode=0o700, exist_ok=True)
    dest = pdir / CACHE_SUBDIR
    if replace and dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(store, dest)
    conf = policy_confinement(policy_section)
    if conf.kind == "uid":  # its own uid: the cache must be its own to read and to update
        for p in [pdir, dest, *dest.rglob("*")]:
            os.chown(p, conf.uid, conf.gid, follow_symlinks=False)
    return True
