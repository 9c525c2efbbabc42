"""A campaign on a local 2-node Ray cluster (ray.cluster_utils.Cluster), one node killed while it
runs a task: its runs are rescheduled on the node left, every run has exactly one result, the
verdicts and recording digests are those of the local pool, and no process is left running.
Its policy runs reuse each Ray worker's kept policy and safety processes (reset per run,
hil/campaign/warm_procs.py) as the local pool's workers do: the same digests either way, and
the kept processes end with their node or the cluster."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HIL = [sys.executable, "-m", "hil.cli"]
pytestmark = pytest.mark.timeout(900)

SEEDS = 6
FAULTS = ("none", "agitator_stuck", "ph_bias")

# 30 cheap runs: lockstep, no servers; 18 PLC runs of 30 min of batch (1800 steps), 12 policy runs (policy
# and safety processes over the bus, kept per worker; no fault and the pH bias) of 10 min (600 steps)
CAMPAIGN = f"""
    [campaign]
    name = "ray_kill"
    seeds = {SEEDS}
    out = "out"
    [[scenarios]]
    name = "plc"
    file = "{ROOT}/configs/bioreactor_plc.toml"
    controller = "softplc"
    duration_s = 1800.0
    [[scenarios]]
    name = "policy"
    file = "{ROOT}/configs/bioreactor_policy.toml"
    duration_s = 600.0
    set = {{ "safety.mode" = "full", "safety.rollout.auto_promote" = false }}
    [faults.none]
    kind = "none"
    [faults.agitator_stuck]
    kind = "actuator_stuck"
    scenarios = ["plc"]
    signal = "agitation_power"
    value = 0.0
    start_s = [300.0, 600.0]
    duration_s = 600.0
    [faults.ph_bias]
    kind = "sensor_bias"
    signal = "ph"
    bias = 0.3
    start_s = [300.0, 600.0]
    duration_s = 600.0
    [[criteria]]
    name = "done"
    kind = "run_completed"
    [[criteria]]
    name = "rec"
    kind = "recording_complete"
    [[criteria]]
    name = "do_above_60"
    kind = "bounds"
    signal = "y.dissolved_oxygen"
    low = 60.0
    window = "after_start"
"""

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _results(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))}


def _running_task(psutil, raylet_pid: int) -> bool:
    """A Ray worker of this node is executing a campaign run (its process title while it does)."""
    try:
        kids = psutil.Process(raylet_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return False
    for k in kids:
        try:
            if "_ray_task" in " ".join(k.cmdline()):
                return True
        except psutil.Error:
            continue
    return False


def _tree(psutil, pid: int) -> set[int]:
    try:
        p = psutil.Process(pid)
        return {pid} | {c.pid for c in p.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _gone(psutil, pids: set[int]) -> set[int]:
    """The pids of `pids` still running (zombies of already-reaped parents count as gone)."""
    left = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.add(pid)
        except psutil.NoSuchProcess:
            pass
    return left


def test_two_node_cluster_one_node_killed_mid_campaign(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'hil[ray]')")
    psutil = pytest.importorskip("psutil")
    from ray.cluster_utils import Cluster

    camp = tmp_path / "c.toml"
    camp.write_text(textwrap.dedent(CAMPAIGN))
    expected = {f"{sc}.{f}.s{s}" for sc in ("plc", "policy") for f in FAULTS for s in range(1, SEEDS + 1)
                if sc == "plc" or f != "agitator_stuck"}

    # the reference: the local pool
    local = subprocess.run(HIL + ["campaign", "run", str(camp), "--workers", "2", "--no-progress", "--json",
                                  "--out", "local"], cwd=tmp_path, capture_output=True, text=True, timeout=400, env=ENV)
    ref = _results(tmp_path / "local")
    assert set(ref) == expected, local.stderr[-2000:]
    assert all(r["verdict"] != "error" for r in ref.values()), [r.get("error") for r in ref.values()]

    seen: set[int] = set()  # every process of the cluster and the driver, for the final check
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    driver = None
    try:
        head = cluster.head_node
        victim = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        victim_raylet = victim.all_processes["raylet"][0].process.pid
        node_pids = [pi.process.pid for n in (head, victim) for infos in n.all_processes.values() for pi in infos]
        driver = subprocess.Popen(
            HIL + ["campaign", "run", str(camp), "--executor", "ray", "--address", cluster.address, "--no-progress",
                   "--json", "--out", "ray"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=ENV, start_new_session=True)
        # kill the victim mid-campaign: some runs done, and one of its workers inside a run
        killed_after = None
        t_end = time.monotonic() + 500.0
        while driver.poll() is None and time.monotonic() < t_end:
            for pid in node_pids + [driver.pid]:
                seen |= _tree(psutil, pid)
            if killed_after is None:
                n_done = len(list((tmp_path / "ray" / "results").glob("*.json")))
                if n_done >= 6 and _running_task(psutil, victim_raylet):
                    killed_after = n_done
                    cluster.remove_node(victim, allow_graceful=False)
            time.sleep(0.05)
        assert killed_after is not None and killed_after < len(expected), "the campaign ended before the kill"
        stdout, stderr = driver.communicate(timeout=500)
    finally:
        if driver is not None and driver.poll() is None:
            os.killpg(driver.pid, 9)
            driver.communicate()
        cluster.shutdown()

    assert driver.returncode == local.returncode, stderr[-3000:]
    got = _results(tmp_path / "ray")
    assert set(got) == expected  # nothing lost
    progress = json.loads((tmp_path / "ray" / "progress.json").read_text())
    assert progress["state"] == "finished" and progress["done"] == len(expected)  # each run reported once
    # the killed node's run(s) went to the node left, counted as reschedules, not as run errors
    moved = {k: r for k, r in got.items() if r.get("rescheduled")}
    assert moved, "no run was rescheduled after its node was killed"
    for r in moved.values():
        assert [x["node_id"] for x in r["rescheduled"]] == [victim.node_id]
        assert r["ray_node_id"] == head.node_id
    for run_id, r in got.items():
        assert r["executor"] == "ray" and r["attempts"] == 1 and r["verdict"] != "error", (run_id, r.get("error"))
        a = ref[run_id]
        assert r["verdict"] == a["verdict"], run_id
        assert {k: v["status"] for k, v in r["criteria"].items()} == {k: v["status"] for k, v in a["criteria"].items()}
        assert r["digest"] == a["digest"], run_id  # the same recording, bit for bit
        assert (tmp_path / "ray" / "runs" / run_id / "rec" / "_meta.json").exists()
    assert {r["ray_node_id"] for r in got.values()} == {head.node_id, victim.node_id}  # both nodes ran runs
    assert not list((tmp_path / "ray" / "runs").glob(".*"))  # no staging or replaced directory left

    # the policy runs on Ray ran on kept processes: each Ray worker started one pair on its first
    # policy run, every other policy run reset that pair
    pol = [r for k, r in got.items() if k.startswith("policy.")]
    how = [r["warm"]["processes"]["processes"] for r in pol]
    workers = {(r["ray_node_id"], r["worker_pid"]) for r in pol}
    assert set(how) <= {"reset", "spawned"}, how
    assert how.count("spawned") == len(workers) and how.count("reset") == len(pol) - len(workers), (how, workers)
    kept = {pid for r in pol for pid in r["warm"]["processes"]["pids"]}
    assert kept and kept <= seen, (kept, seen)  # the kept processes were in the nodes' process trees

    # nothing left running: every process seen (raylets, workers, recorders, the driver)
    deadline = time.monotonic() + 60.0
    while _gone(psutil, seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _gone(psutil, seen)
    assert not left, [(p, psutil.Process(p).cmdline()[:3]) for p in left if psutil.pid_exists(p)]
    shm = [p for p in os.listdir("/dev/shm") if p.startswith("hil_") and any(f"_{pid}_" in p for pid in seen)]
    assert not shm, shm
