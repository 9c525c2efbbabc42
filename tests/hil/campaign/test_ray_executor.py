"""The Ray executor's pieces that need no cluster: which errors mean a lost node (rescheduled) and
which node they name, the directory swap that keeps a run directory whole, the sweep of shared
memory left by dead processes. The cluster itself: tests/integration/test_campaign_ray.py."""

import os
import subprocess

import pytest

from hil.campaign.ray_executor import swap_in, sweep_dead_shm


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_swap_in_replaces_a_stale_directory_whole(tmp_path):
    dest = tmp_path / "runs" / "r1"
    (dest / "rec").mkdir(parents=True)
    (dest / "rec" / "part-000000.parquet").write_text("old attempt")
    (dest / "softplc-1.csv").write_text("only the old attempt had this")
    new = tmp_path / "runs" / ".r1.part"
    (new / "rec").mkdir(parents=True)
    (new / "rec" / "part-000000.parquet").write_text("new attempt")
    swap_in(new, dest)
    assert (dest / "rec" / "part-000000.parquet").read_text() == "new attempt"
    assert not (dest / "softplc-1.csv").exists()  # nothing of the old attempt mixed in
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["r1"]  # old copy removed, staging gone


def test_swap_in_to_a_new_place(tmp_path):
    new = tmp_path / "stage"
    new.mkdir()
    (new / "a").write_text("x")
    swap_in(new, tmp_path / "runs" / "r2")
    assert (tmp_path / "runs" / "r2" / "a").read_text() == "x" and not new.exists()


def test_sweep_removes_what_dead_processes_left_and_keeps_the_living(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    names = {f"hil_{dead}_123": True, f"hil_rec_{dead}_456": True, f"hil_{dead}_789.lock": True,
             f"hil_{alive}_123": False, f"hil_rec_{alive}_456": False, "hil_notapid_1": False, "other_1": False}
    for n in names:
        (tmp_path / n).write_bytes(b"\0")
    removed = sweep_dead_shm(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == sorted(n for n, gone in names.items() if gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, gone in names.items() if not gone)


def test_sweep_removes_keeper_dirs_of_dead_workers_only(tmp_path):
    from hil.campaign.warm_procs import sweep_dead_keeper_dirs

    dead, alive = _dead_pid(), os.getpid()
    dirs = {f"hilw-{dead}-ab_c1": True, f"hilw-{alive}-xyz": False, "hilw-abc": False, f"hilw-{dead}": False,
            "hil-other": False}
    for n in dirs:
        (tmp_path / n / "policy").mkdir(parents=True)
        (tmp_path / n / "policy" / "obs.sock").write_bytes(b"")
    (tmp_path / f"hilw-{dead}-file").write_bytes(b"")  # a file of that name is no keeper's directory
    removed = sweep_dead_keeper_dirs(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == [f"hilw-{dead}-ab_c1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([n for n, gone in dirs.items() if not gone]
                                                                + [f"hilw-{dead}-file"])


def test_lost_node_errors_are_told_from_run_failures():
    rx = pytest.importorskip("ray.exceptions", reason="ray is not installed (pip install 'hil[ray]')")
    from hil.campaign.ray_executor import lost_node

    nid = "ae5d001b41d9335e568735c284cabdb7036c37ade42a3b41a6009ec4"
    msg = (f"Task failed because the node it was running on is dead or unavailable. Node IP: 192.0.2.2, "
           f"node ID: {nid}. This can happen if the node was preempted")
    assert lost_node(rx.NodeDiedError(msg)) == (True, nid)
    assert lost_node(rx.WorkerCrashedError()) == (True, None)
    assert lost_node(rx.ObjectLostError("0" * 56, "", ""))[0] is True
    # a task that failed by itself (outside execute_run), or could not be placed: not rescheduled
    assert lost_node(rx.TaskUnschedulableError("no node has hil_rt_cpu"))[0] is False
    assert lost_node(rx.RayError("other"))[0] is False
