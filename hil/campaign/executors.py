"""Where runs execute: a local pool of warm worker processes (default) or Ray tasks.

Local pool: `workers` processes (default: the number of CPUs), each started once and reused
for many runs, so imports, the Numba cache load and the plant's warm-up are paid once per
worker, not per run. Each worker leads its own process group (os.setpgrp), holding the
helper processes its runs start (recorder, policy, safety): on Ctrl-C (or any error in the
driver) every group gets SIGTERM (a run stops at its next step and cleans up its shared
memory), then SIGKILL after 5 s. A run interrupted that way writes no result, so the next
`hil campaign run` runs it again (completed runs are skipped).

Ray (`--executor ray [--address ADDR]`, the `ray` extra): each run is a task declaring
num_cpus = 1 (lockstep) or a whole dedicated CPU (`resources={"hil_rt_cpu": 1}` in real time:
start the nodes with `--resources '{"hil_rt_cpu": N}'`, N = cores set aside for real-time loops).
Results come back to the driver with the task's return value; the run directory (recording,
decision log) comes back as a zip unless [campaign].storage names a directory every node
writes to directly. The runner never grows its own cluster: without --address it joins (or
starts) a local Ray instance.
"""

from __future__ import annotations

import io
import os
import signal
import time
import zipfile
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Callable

import multiprocessing as mp

_CAMPAIGN = None


def _worker_init(campaign) -> None:
    global _CAMPAIGN
    os.setpgrp()  # its own group: the driver cleans up the worker and every child of its runs
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    signal.signal(signal.SIGTERM, _terminate)  # unwind (close the image, stop the recorder), then exit
    _CAMPAIGN = campaign
    import pyarrow.parquet  # noqa: F401
    import hil.runtime  # noqa: F401  (warm: imports and the Numba cache once per worker)
    from hil.campaign import worker

    worker.FORK_HELPERS = True  # this process is single-threaded: lockstep runs fork their recorder


def _terminate(*_args) -> None:
    raise SystemExit(143)


def _worker_run(run, out_dir: str, realtime):
    from hil.campaign.worker import RunInterrupted, execute_run

    try:
        return execute_run(_CAMPAIGN, run, out_dir, realtime=realtime)
    except (RunInterrupted, SystemExit, KeyboardInterrupt):
        os._exit(143)  # stopped by the driver: everything of the run is closed by now; no result


def run_local(campaign, runs, out_dir: Path, workers: int, on_result: Callable[[dict], None],
              realtime: bool | None = None, cold: bool = False) -> None:
    """Execute `runs` on a pool of `workers` warm processes; on_result(result) per finished run.
    cold=True: a fresh worker process per run (imports and the Numba cache paid by every run), the
    reference benchmarks/campaign_throughput.py measures the warm pool against."""
    ctx = mp.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=max(1, workers), mp_context=ctx, initializer=_worker_init,
                               initargs=(campaign,), max_tasks_per_child=1 if cold else None)
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


# ---------------------------------------------------------------- Ray


def _zip_dir(path: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(path.rglob("*")):
            if f.is_file():
                z.write(f, f.relative_to(path))
    return buf.getvalue()


def _ray_task(campaign, run, storage: str, realtime):
    import tempfile

    from hil.campaign.worker import execute_run, run_paths

    if storage:
        return execute_run(campaign, run, storage, realtime=realtime), None
    with tempfile.TemporaryDirectory(prefix="hil-ray-") as tmp:
        result = execute_run(campaign, run, tmp, realtime=realtime)
        run_dir, _ = run_paths(Path(tmp), run.run_id)
        return result, _zip_dir(run_dir)


def run_ray(campaign, runs, out_dir: Path, address: str | None, on_result: Callable[[dict], None],
            realtime: bool | None = None) -> None:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--executor ray needs Ray: pip install 'hil[ray]'") from None
    from hil.campaign.worker import run_paths, write_result

    owns = not ray.is_initialized()
    if owns:
        root = str(Path(__file__).resolve().parents[2])
        kw = {} if address else {"_node_ip_address": "127.0.0.1"}  # a local instance stays on loopback
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": root}}, **kw)
    rt = campaign.campaign.mode == "realtime" if realtime is None else realtime
    opts = {"num_cpus": 1, "max_retries": 0}
    if rt:
        opts["resources"] = {"hil_rt_cpu": 1}
    task = ray.remote(**opts)(_ray_task)
    storage = str(campaign.resolve(campaign.campaign.storage)) if campaign.campaign.storage else ""
    camp_ref = ray.put(campaign)
    refs = {task.remote(camp_ref, r, storage, realtime): r for r in runs}
    attempts = {r.run_id: 1 for r in runs}
    retries = int(getattr(campaign.campaign, "retries", 0))
    try:
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                run = refs.pop(ref)
                try:
                    result, zipped = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    # the task or its node died (not the run's own error: execute_run catches those)
                    result, zipped = {"run": run.as_dict(), "error": f"{type(exc).__name__}: {exc}"[:2000],
                                      "criteria": {}, "verdict": "error"}, None
                again: list = []
                if retry(result, run, attempts, retries, again):
                    attempts[run.run_id] += 1
                    refs[task.remote(camp_ref, run, storage, realtime)] = run
                    continue
                run_dir, result_path = run_paths(out_dir, run.run_id)
                if zipped is not None:
                    run_dir.mkdir(parents=True, exist_ok=True)
                    with zipfile.ZipFile(io.BytesIO(zipped)) as z:
                        z.extractall(run_dir)
                if result.get("summary", {}).get("record_path") and zipped is not None:
                    result["summary"]["record_path"] = str(run_dir / "rec")
                result["executor"] = "ray"
                write_result(result_path, result)
                on_result(result)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise
    finally:
        if owns:
            ray.shutdown()
