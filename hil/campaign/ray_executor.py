"""Campaign runs as Ray tasks (`hil campaign run --executor ray [--address ADDR]`, the `ray` extra).

Each run is a task declaring num_cpus = 1 (lockstep) or a whole dedicated CPU in real time
(`resources={"hil_rt_cpu": 1}`: start the nodes with `--resources '{"hil_rt_cpu": N}'`, N = cores
set aside for real-time loops). The task runs the run in a directory local to its node; the
result comes back to the driver with the task's return value and the run directory (recording,
decision log) as a zip, unless [campaign].storage names a directory every node writes to.
The runner never grows its own cluster: without --address it joins (or starts) a local Ray
instance.

Lost runs. A node that dies (or a task's worker process killed, or a finished task's result
object lost with its node) is no error of the run: the driver reschedules the run (Ray places
it on a node that is alive), up to LOST_MAX times per run, without using the run's own
[campaign].retries (those are for runs that ran and errored). Ray's own task retries stay off
(max_retries = 0) so that every reschedule is the driver's, seen and recorded: the result's
"rescheduled" lists each lost attempt (the error's type and the node it names), "ray_node_id"
is the node the kept attempt ran on.

Idempotent writing. Only the driver writes the driver's copy: the run directory is unpacked
beside its place and swapped in, then the result (the resume marker) is written atomically,
once per run. With [campaign].storage a task still runs in a directory of its own node and
publishes the run directory into the storage by the same swap, then the result: an attempt on
a node that Ray declared dead but that is still running writes whole directories and whole
result files, which are the same run's (the same seed gives the same digest), never a mix.

Warm workers. A Ray worker process runs many tasks; the first lockstep policy run in it starts a
policy and safety pair that later runs reuse, reset by a signed message, as in the local pool
(`warm_ray_worker`; each result's "warm" says how the run got its processes).

Shared memory. A task first frees what dead hil processes of its machine left in /dev/shm
(sweep_dead_shm): a worker killed with its node takes its recorder with it, so nobody else
frees its process image and recorder ring.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import uuid
import zipfile
from pathlib import Path
from typing import Callable

LOST_MAX = 3  # reschedules of one run after its node, worker or result was lost

_NODE_ID = re.compile(r"node ID: ([0-9a-f]{16,})", re.IGNORECASE)


def _zip_dir(path: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(path.rglob("*")):
            if f.is_file():
                z.write(f, f.relative_to(path))
    return buf.getvalue()


def swap_in(src: Path, dest: Path) -> None:
    """Move the finished directory `src` to `dest`, replacing whatever was there (an earlier
    attempt's run, a stale directory of an interrupted campaign) in one rename: a reader sees
    the old directory, then the new one, never a mix of files of two attempts."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(dest, old)
    except FileNotFoundError:
        old = None
    os.rename(src, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _staging(dest: Path) -> Path:
    """A fresh directory beside `dest` (same filesystem: the swap is a rename)."""
    p = dest.with_name(f".{dest.name}.part-{uuid.uuid4().hex[:8]}")
    p.mkdir(parents=True)
    return p


def sweep_dead_shm(shm_dir: str = "/dev/shm") -> list[str]:
    """Remove this user's process images and recorder rings (`hil_<pid>_*`, `hil_rec_<pid>_*`)
    whose creating process is dead. A worker killed with its node (Ray kills the worker's children
    with it, so no orphaned recorder frees them) leaves both; the next task on the machine frees
    them. Returns the paths removed."""
    from hil.processes import process_alive

    removed = []
    for path in Path(shm_dir).glob("hil_*"):
        m = re.fullmatch(r"hil_(?:rec_)?(\d+)_\d+(?:\.lock)?", path.name)
        if m is None:
            continue
        try:
            if path.lstat().st_uid != os.getuid() or process_alive(int(m.group(1))):
                continue
            path.unlink()
            removed.append(str(path))
        except OSError:
            continue
    return removed


def warm_ray_worker(campaign, realtime) -> None:
    """Make this Ray worker process warm as a local pool worker is (hil/campaign/executors.py):
    lockstep policy runs reuse the worker's policy and safety processes, reset per run by a
    signed message (hil/campaign/warm_procs.py), and a fresh pair loads the policy's kernel from
    the worker's Numba cache (hil/campaign/warm.py). Ray reuses a worker process for the tasks of
    one job, so the kept pair outlives the task that spawned it. Helpers are not forked: a Ray
    worker runs threads of its own. The pair ends with the worker: parked, it sees its socket
    pair close; mid-run, it sees its parent gone (--parent-pid); at a clean exit the keeper's
    atexit hook stops it. Real-time runs start their own processes, as in the local pool."""
    from hil.campaign import worker

    rt = campaign.campaign.mode == "realtime" if realtime is None else realtime
    worker.WARM_POLICY_CACHE = True
    worker.WARM_PROCESSES = not rt


def _ray_task(campaign, run, storage: str, realtime):
    import tempfile

    import ray

    from hil.campaign.worker import execute_run, run_paths, write_result

    sweep_dead_shm()
    from hil.campaign.warm_procs import sweep_dead_keeper_dirs

    sweep_dead_keeper_dirs()  # bus directories of kept processes whose worker was killed
    warm_ray_worker(campaign, realtime)
    node_id = ray.get_runtime_context().get_node_id()
    with tempfile.TemporaryDirectory(prefix="hil-ray-") as tmp:
        result = execute_run(campaign, run, tmp, realtime=realtime)
        result["ray_node_id"] = node_id
        run_dir, _ = run_paths(Path(tmp), run.run_id)
        if not storage:
            return result, _zip_dir(run_dir)
        dest, result_path = run_paths(Path(storage), run.run_id)
        stage = _staging(dest)
        shutil.copytree(run_dir, stage, dirs_exist_ok=True)
        _relocate(result, run_dir, dest)
        swap_in(stage, dest)
        write_result(result_path, result)  # last: the run's resume marker
        return result, None


def _relocate(result: dict, old: Path, new: Path) -> None:
    """Paths in the result that pointed into the task's own directory, pointed at `new`."""
    summary = result.get("summary") or {}
    rp = summary.get("record_path")
    if rp and str(rp).startswith(str(old)):
        summary["record_path"] = str(new) + str(rp)[len(str(old)):]


def lost_node(exc: BaseException) -> tuple[bool, str | None]:
    """(the attempt was lost with its node, worker or result object; the node ID the error names)."""
    from ray import exceptions as rx

    lost = isinstance(exc, (rx.NodeDiedError, rx.WorkerCrashedError, rx.ObjectLostError, rx.LocalRayletDiedError,
                            rx.OutOfMemoryError))
    m = _NODE_ID.search(str(exc))
    return lost, (m.group(1) if m else None)


def run_ray(campaign, runs, out_dir: Path, address: str | None, on_result: Callable[[dict], None],
            realtime: bool | None = None) -> None:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--executor ray needs Ray: pip install 'hil[ray]'") from None
    from hil.campaign.executors import retry
    from hil.campaign.worker import run_paths, write_result

    owns = not ray.is_initialized()
    if owns:
        root = str(Path(__file__).resolve().parents[2])
        kw = {} if address else {"_node_ip_address": "127.0.0.1"}  # a local instance stays on loopback
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": root}}, **kw)
    rt = campaign.campaign.mode == "realtime" if realtime is None else realtime
    opts = {"num_cpus": 1, "max_retries": 0}  # reschedules are the driver's (module docstring)
    if rt:
        opts["resources"] = {"hil_rt_cpu": 1}
    task = ray.remote(**opts)(_ray_task)
    storage = str(campaign.resolve(campaign.campaign.storage)) if campaign.campaign.storage else ""
    camp_ref = ray.put(campaign)
    refs = {task.remote(camp_ref, r, storage, realtime): r for r in runs}
    attempts = {r.run_id: 1 for r in runs}
    lost: dict[str, list[dict]] = {}
    written: set[str] = set()
    retries = int(getattr(campaign.campaign, "retries", 0))
    try:
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                run = refs.pop(ref)
                try:
                    result, zipped = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    was_lost, node = lost_node(exc)
                    if was_lost and len(lost.get(run.run_id, [])) < LOST_MAX:
                        lost.setdefault(run.run_id, []).append({"error": type(exc).__name__, "node_id": node})
                        refs[task.remote(camp_ref, run, storage, realtime)] = run
                        continue
                    # not a lost node (the task itself failed outside execute_run), or lost too often
                    result, zipped = {"run": run.as_dict(), "error": f"{type(exc).__name__}: {exc}"[:2000],
                                      "criteria": {}, "verdict": "error"}, None
                if lost.get(run.run_id):
                    result["rescheduled"] = lost[run.run_id]
                if retry(result, run, attempts, retries, []):
                    attempts[run.run_id] += 1
                    refs[task.remote(camp_ref, run, storage, realtime)] = run
                    continue
                if run.run_id in written:  # never two results for one run
                    continue
                run_dir, result_path = run_paths(out_dir, run.run_id)
                if zipped is not None:
                    stage = _staging(run_dir)
                    with zipfile.ZipFile(io.BytesIO(zipped)) as z:
                        z.extractall(stage)
                    swap_in(stage, run_dir)
                    rp = (result.get("summary") or {}).get("record_path")
                    if rp:
                        result["summary"]["record_path"] = str(run_dir / "rec")
                result["executor"] = "ray"
                write_result(result_path, result)
                written.add(run.run_id)
                on_result(result)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise
    finally:
        if owns:
            ray.shutdown()
