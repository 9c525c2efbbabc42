"""Where runs execute: a local pool of warm worker processes (default) or Ray tasks.

Local pool: `workers` processes (default: the number of CPUs), each started once and reused
for many runs, so imports, the Numba cache load and the plant's warm-up are paid once per
worker, not per run, and a policy run's policy process loads its kernel from the worker's
Numba cache instead of compiling it (hil/campaign/warm.py); lockstep policy runs reuse the
worker's policy and safety processes, reset by a signed message (hil/campaign/warm_procs.py). Each worker leads its own process
group (os.setpgrp), holding the helper processes its runs start (recorder, policy, safety): on Ctrl-C (or any error in the
driver) every group gets SIGTERM (a run stops at its next step and cleans up its shared
memory), then SIGKILL after 5 s. A run interrupted that way writes no result, so the next
`hil campaign run` runs it again (completed runs are skipped).

Ray (`--executor ray`): hil/campaign/ray_executor.py (tasks, lost nodes rescheduled).
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Callable

import multiprocessing as mp

_CAMPAIGN = None


def _worker_init(campaign, warm_policy_cache: bool = True, warm_processes: bool = False) -> None:
    global _CAMPAIGN
    os.setpgrp()  # its own group: the driver cleans up the worker and every child of its runs
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    signal.signal(signal.SIGTERM, _terminate)  # unwind (close the image, stop the recorder), then exit
    _CAMPAIGN = campaign
    import pyarrow.parquet  # noqa: F401
    import hil.runtime  # noqa: F401  (warm: imports and the Numba cache once per worker)
    from hil.campaign import worker

    worker.FORK_HELPERS = True  # this process is single-threaded: lockstep runs fork their recorder
    worker.WARM_POLICY_CACHE = warm_policy_cache  # policy runs: the worker's Numba cache (hil/campaign/warm.py)
    worker.WARM_PROCESSES = warm_processes  # lockstep policy runs: kept policy/safety processes (warm_procs.py)


def _terminate(*_args) -> None:
    raise SystemExit(143)


def _worker_run(run, out_dir: str, realtime):
    from hil.campaign.worker import RunInterrupted, execute_run

    try:
        return execute_run(_CAMPAIGN, run, out_dir, realtime=realtime)
    except (RunInterrupted, SystemExit, KeyboardInterrupt):
        os._exit(143)  # stopped by the driver: everything of the run is closed by now; no result


def run_local(campaign, runs, out_dir: Path, workers: int, on_result: Callable[[dict], None],
              realtime: bool | None = None, cold: bool = False, policy_cache: bool = True,
              warm_processes: bool = True) -> None:
    """Execute `runs` on a pool of `workers` warm processes; on_result(result) per finished run.
    cold=True: a fresh worker process per run (imports and the Numba cache paid by every run, the
    policy's kernel compiled by every policy run), the reference benchmarks/campaign_throughput.py
    measures the warm pool against. policy_cache=False: policy runs compile the policy's kernel
    (the warm pool as it was before hil/campaign/warm.py; benchmarks only). warm_processes=False:
    every policy run starts its own policy and safety processes (the warm pool as it was before
    hil/campaign/warm_procs.py; benchmarks only)."""
    ctx = mp.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=max(1, workers), mp_context=ctx, initializer=_worker_init,
                               initargs=(campaign, policy_cache and not cold, warm_processes and not cold), max_tasks_per_child=1 if cold else None)
    pending: dict = {}
    todo = list(runs)
    attempts: dict = {}
    retries = int(getattr(campaign.campaign, "retries", 0))
    try:
        while todo or pending:
            while todo and len(pending) < 2 * max(1, workers):
                run = todo.pop(0)
                attempts[run.run_id] = attempts.get(run.run_id, 0) + 1
                pending[pool.submit(_worker_run, run, str(out_dir), realtime)] = run
            done, _ = wait(set(pending), return_when=FIRST_COMPLETED)
            for fut in done:
                run = pending.pop(fut)
                res = fut.result()
                if retry(res, run, attempts, retries, todo):
                    continue
                on_result(res)
        pool.shutdown(wait=True)
    except BaseException:
        kill_pool(pool)
        raise


def retry(res: dict, run, attempts: dict, retries: int, todo: list) -> bool:
    """An errored run goes back in the queue (front) while it has attempts left; True if it did.
    The result keeps the attempt count."""
    res["attempts"] = attempts.get(run.run_id, 1)
    if res.get("verdict") == "error" and attempts.get(run.run_id, 1) <= retries:
        todo.insert(0, run)
        return True
    return False


def kill_pool(pool: ProcessPoolExecutor, grace_s: float = 5.0) -> None:
    """SIGTERM every worker's process group, SIGKILL what is left after grace_s."""
    procs = list(getattr(pool, "_processes", {}).values())
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    import glob

    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        # shared memory of a worker that had to be killed: its images, lock files and recorder rings
        for path in glob.glob(f"/dev/shm/hil_{p.pid}_*") + glob.glob(f"/dev/shm/hil_rec_{p.pid}_*"):
            try:
                os.unlink(path)
            except OSError:
                pass
    pool.shutdown(wait=False, cancel_futures=True)
