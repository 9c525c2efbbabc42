"""A tiny lockstep campaign end to end: CLI, local pool of 2 workers, resume, replay bit for bit,
JUnit + HTML, exit code; policy faults through the real policy and safety processes; Ray."""

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HIL = [sys.executable, "-m", "hil.cli"]


def _write(tmp_path, body: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(textwrap.dedent(body))
    return p


PLC_CAMPAIGN = f"""
    [campaign]
    name = "tiny"
    seeds = 2
    out = "out"
    [[scenarios]]
    name = "plc"
    file = "{ROOT}/configs/bioreactor_plc.toml"
    controller = "softplc"
    duration_s = 1800.0
    [faults.none]
    kind = "none"
    [faults.agitator_stuck]
    kind = "actuator_stuck"
    signal = "agitation_power"
    value = 0.0
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
    [report]
    signals = ["dissolved_oxygen", "agitation_power"]
"""


def _run(args, cwd, timeout=240):
    return subprocess.run(HIL + args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_tiny_campaign_verdicts_resume_replay_reports(tmp_path):
    camp = _write(tmp_path, PLC_CAMPAIGN)
    r = _run(["campaign", "run", str(camp), "--workers", "2", "--no-progress", "--json"], tmp_path)
    assert r.returncode == 1, r.stderr  # the stuck agitator (0 W) lets DO fall below 60 %: a criterion fails
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["runs"] == 4
    assert set(summary["failed_runs"]) == {"plc.agitator_stuck.s1", "plc.agitator_stuck.s2"}
    assert summary["criteria"]["do_above_60"]["passed"] == 2
    assert summary["criteria"]["rec"]["passed"] == 4
    out = tmp_path / "out"
    res = json.loads((out / "results" / "plc.agitator_stuck.s1.json").read_text())
    start = res["fault"]["start_s"]
    assert 300 <= start <= 600
    # what the plant got: the applied agitation is 0 inside the window and the PLC's own after it
    import pandas as pd  # noqa: F401
    from hil.recorder import read_recording

    df = read_recording(res["summary"]["record_path"])
    inside = df[(df.t_s > start + 1) & (df.t_s <= start + 600)]
    after = df[df.t_s > start + 700]
    assert (inside["app.agitation_power"] == 0.0).all()
    assert (after["app.agitation_power"] > 0.0).all()
    assert res["criteria"]["do_above_60"]["status"] == "fail"
    # reports
    junit = ET.parse(out / "junit.xml").getroot()
    cases = junit.findall(".//testcase")
    assert len(cases) == 4 * 3
    assert len(junit.findall(".//failure")) == 2
    html = (out / "report.html").read_text()
    assert "plc.agitator_stuck.s1" in html and "<svg" in html and "held in 2/4 runs" in html
    # progress.json (the dashboard's campaign view): every run counted, the failures named
    prog = json.loads((out / "progress.json").read_text())
    assert (prog["state"], prog["total"], prog["done"], prog["pass"], prog["fail"]) == ("finished", 4, 4, 2, 2)
    assert {r["run_id"] for r in prog["latest"] if r["verdict"] == "fail"} == set(summary["failed_runs"])
    assert all(r["failed"] == ["do_above_60"] for r in prog["latest"] if r["verdict"] == "fail")
    # resume: nothing runs again
    r2 = _run(["campaign", "run", str(camp), "--no-progress"], tmp_path)
    assert r2.returncode == 1
    assert json.loads((out / "last_execution.json").read_text())["runs_executed"] == 0
    # a missing result runs again, the others are skipped
    (out / "results" / "plc.none.s2.json").unlink()
    _run(["campaign", "run", str(camp), "--no-progress"], tmp_path)
    assert json.loads((out / "last_execution.json").read_text())["runs_executed"] == 1
    # replay: bit for bit the original recording
    r3 = _run(["campaign", "replay", "plc.agitator_stuck.s1", "--out", str(out), "--json"], tmp_path)
    info = json.loads(r3.stdout.strip().splitlines()[-1])
    assert r3.returncode == 0 and info["identical"] and info["digest"] == res["digest"]
    assert info["verdict"] == "fail"


def test_bad_campaign_names_the_key(tmp_path):
    camp = _write(tmp_path, PLC_CAMPAIGN.replace('signal = "agitation_power"', 'signal = "warp"'))
    r = _run(["campaign", "run", str(camp), "--no-progress"], tmp_path)
    assert r.returncode == 2 and "faults.agitator_stuck.signal" in r.stderr


POLICY_CAMPAIGN = f"""
    [campaign]
    name = "pol"
    seeds = [7]
    out = "out"
    [[scenarios]]
    name = "policy"
    file = "{ROOT}/configs/bioreactor_policy.toml"
    duration_s = 240.0
    set = {{ "safety.mode" = "full", "safety.rollout.auto_promote" = false }}
    [faults.nan]
    kind = "policy_nan"
    start_s = 100.0
    duration_s = 30.0
    [faults.safety_crash]
    kind = "safety_crash"
    start_s = 100.0
    duration_s = 10.0
    stop_after_s = 10.0
    [[criteria]]
    name = "fallback"
    kind = "fallback_within"
    periods = 3
    faults = ["nan"]
    [[criteria]]
    name = "loop_fallback"
    kind = "fallback_within"
    periods = 15
    faults = ["safety_crash"]
    [[criteria]]
    name = "wrapper_envelope"
    kind = "safety_envelope"
    on = ["cmd"]
    faults = ["nan"]
"""


def test_policy_and_safety_process_faults(tmp_path):
    camp = _write(tmp_path, POLICY_CAMPAIGN)
    r = _run(["campaign", "run", str(camp), "--workers", "2", "--no-progress", "--json"], tmp_path)
    out = tmp_path / "out"
    nan = json.loads((out / "results" / "policy.nan.s7.json").read_text())
    crash = json.loads((out / "results" / "policy.safety_crash.s7.json").read_text())
    assert nan.get("error") is None and crash.get("error") is None, (nan.get("error"), crash.get("error"))
    # NaN from the model: the policy is silent from t = 100 s, the safety's baseline acts at once,
    # and what the wrapper let through stayed inside its declared envelope
    assert nan["verdict"] == "pass", nan["criteria"]
    assert nan["criteria"]["fallback"]["value"] <= 1
    assert nan["criteria"]["wrapper_envelope"]["status"] == "pass", nan["criteria"]["wrapper_envelope"]
    assert "loop_fallback" not in nan["criteria"] or nan["criteria"]["loop_fallback"]["status"] == "n/a"
    kinds = {e["kind"] for e in nan["interventions"]}
    assert "silent_enter" in kinds
    # the safety process died: the loop's watchdog (2 s) and its ramp reach bus.fallback_action
    # within 15 periods (measured 9 in the shipped campaign)
    assert crash["verdict"] == "pass", crash["criteria"]
    assert 2 <= crash["criteria"]["loop_fallback"]["value"] <= 15, crash["criteria"]
    assert crash["summary"]["stop_reason"] == "stop requested"  # stop_after_s ended it
    assert "injected fault safety_crash" in (out / "runs" / "policy.safety_crash.s7" / "stderr.log").read_text()
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["passed_runs"] == summary["runs"] == 2 and summary["valid"], summary
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.timeout(3000)  # 8 runs of the shipped campaign; loaded, a policy run takes minutes
def test_shipped_canaries_fail_and_a_canary_that_passes_makes_the_campaign_invalid(tmp_path):
    """The shipped campaign's known-bad runs (the wrapper opened, a PLC loop opened, faults twice
    their documented size) each fail a criterion; a canary that is not bad (fault none) passes,
    and then the campaign is INVALID: exit 3, a banner, a JUnit failure."""
    from hil.campaign.expand import expand
    from hil.campaign.schema import load_campaign

    shipped = ROOT / "configs/campaigns/bioreactor_faults.toml"
    c = load_campaign(shipped)
    canary_runs = [r for r in expand(c) if r.canary and r.seed == 1]
    assert {r.scenario for r in canary_runs} == {"plc", "policy"}
    only = [r.run_id for r in canary_runs] + [f"{s}.none.s1" for s in sorted({r.scenario for r in canary_runs})]
    args = ["campaign", "run", str(shipped), "--out", str(tmp_path / "out"), "--workers", "2", "--no-progress",
            "--json"]
    r = _run(args + [x for rid in only for x in ("--only", rid)], tmp_path, timeout=1800)
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    for run in canary_runs:
        res = json.loads((tmp_path / "out" / "results" / f"{run.run_id}.json").read_text())
        assert res.get("error") is None, (run.run_id, res.get("error"))
        assert res["verdict"] == "fail" and res["failed"], (run.run_id, res["criteria"])
    for name, s in summary["canaries"].items():
        assert not s["passed"] and s["caught_by"], (name, s)
    # the wrapper opened: what it let through (cmd) leaves the declared envelope
    wrapper = summary["canaries"]["wrapper_off"]["caught_by"]
    assert "wrapper_envelope" in wrapper, wrapper
    # the canaries on seed 2 were not run: the campaign cannot be called valid (fail closed)
    assert r.returncode == 3 and not summary["valid"] and "did not run" in summary["invalid_reason"], r.stderr[-2000:]

    # a "canary" that is not bad passes every criterion: the campaign is INVALID because of it
    text = shipped.read_text().replace('file = "../', f'file = "{ROOT}/configs/')
    text += '\n[canaries.not_bad]\nscenario = "plc"\ndescription = "no fault at all"\nseeds = [1]\n'
    camp = tmp_path / "with_a_good_canary.toml"
    camp.write_text(text)
    r2 = _run(["campaign", "run", str(camp), "--out", str(tmp_path / "out"), "--workers", "2", "--no-progress",
               "--json", "--only", "plc.none.s1", "--only", "plc.canary.not_bad.s1"], tmp_path, timeout=1200)
    s2 = json.loads(r2.stdout.strip().splitlines()[-1])
    assert s2["canaries"]["not_bad"]["passed"] == ["plc.canary.not_bad.s1"], s2["canaries"]["not_bad"]
    assert r2.returncode == 3 and "plc.canary.not_bad.s1 PASSED" in s2["invalid_reason"]
    assert "CAMPAIGN INVALID" in r2.stderr
    junit = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    failures = [f for f in junit.iter("failure") if f.get("type") == "canary"]
    assert failures, ET.tostring(junit)[:2000]


def test_same_verdicts_on_ray(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'hil[ray]')")
    camp = _write(tmp_path, PLC_CAMPAIGN.replace("seeds = 2", "seeds = 1"))
    only = ["--only", "plc.agitator_stuck.s1"]
    r1 = _run(["campaign", "run", str(camp), "--workers", "1", "--no-progress", "--json", "--out", "local"] + only,
              tmp_path)
    r2 = _run(["campaign", "run", str(camp), "--executor", "ray", "--no-progress", "--json", "--out", "ray"] + only,
              tmp_path, timeout=280)
    assert r2.returncode == r1.returncode == 1, r2.stderr[-2000:]
    for run_id in ("plc.agitator_stuck.s1",):
        a = json.loads((tmp_path / "local" / "results" / f"{run_id}.json").read_text())
        b = json.loads((tmp_path / "ray" / "results" / f"{run_id}.json").read_text())
        assert b.get("executor") == "ray"
        assert {k: v["status"] for k, v in a["criteria"].items()} == {k: v["status"] for k, v in b["criteria"].items()}
        assert a["digest"] == b["digest"]  # the same recording, bit for bit
        assert (tmp_path / "ray" / "runs" / run_id / "rec" / "_meta.json").exists()  # came back to the driver


RT_CAMPAIGN = f"""
    [campaign]
    name = "rt"
    mode = "realtime"
    seeds = [3]
    out = "out"
    [[scenarios]]
    name = "plc"
    file = "{ROOT}/configs/bioreactor_plc.toml"
    controller = "softplc"
    duration_s = 2100.0
    set = {{ "gaps.enabled" = false, "loop.priority" = 0, "loop.cpu" = -1 }}
    [faults.link_drop]
    kind = "link_drop"
    start_s = 750.0
    duration_s = 600.0
    [[criteria]]
    name = "comm_loss"
    kind = "fallback_within"
    periods = 300
    [[criteria]]
    name = "rec"
    kind = "recording_complete"
"""


def test_realtime_link_drop_through_the_proxy(tmp_path):
    """Real time: servers, the SoftPLC process and the proxy; the drop resets the PLC's socket, it
    declares comm loss, recovers when the link is back; the plant saw its writes stop and resume."""
    camp = _write(tmp_path, RT_CAMPAIGN)
    r = _run(["campaign", "run", str(camp), "--no-progress", "--json"], tmp_path)
    res = json.loads((tmp_path / "out" / "results" / "plc.link_drop.s3.json").read_text())
    assert res.get("error") is None, res.get("error")
    info = res["info"]
    plc = info["softplc"][0]
    assert plc["comm_losses"] == 1 and plc["recoveries"] == 1, plc
    assert info["proxy"]["resets"] >= 1 and info["proxy"]["refused"] >= 1
    assert [a["action"] for a in info["actions"]] == ["begin", "end"]
    assert res["criteria"]["comm_loss"]["status"] == "pass", res["criteria"]
    assert res["criteria"]["rec"]["status"] == "pass"
    assert r.returncode == 0, r.stderr[-2000:]
    # what the loop got: no PLC write reaches the image while the link is down, writes resume after
    from hil.recorder import read_recording

    df = read_recording(res["summary"]["record_path"])
    cmd = df["cmd.agitation_power"].to_numpy()
    t = df["t_s"].to_numpy()
    down = cmd[(t > 750 + 60) & (t <= 750 + 600)]
    after = cmd[t > 750 + 600 + 200]
    assert down.size > 300 and (down == down[0]).all()
    assert len(set(after.tolist())) > 3


def test_ctrl_c_stops_every_worker_and_resume_finishes(tmp_path):
    """SIGINT to the driver: every worker and every process its runs started is gone, no shared
    memory is left, interrupted runs have no result; the same command then finishes the campaign."""
    psutil = pytest.importorskip("psutil")
    import signal
    import time

    camp = _write(tmp_path, PLC_CAMPAIGN.replace("duration_s = 1800.0", "duration_s = 86400.0")
                  .replace("seeds = 2", "seeds = 1"))
    proc = subprocess.Popen(HIL + ["campaign", "run", str(camp), "--workers", "2", "--no-progress"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        kids = []
        while time.monotonic() < deadline:  # until the workers run their first runs (recorders up)
            kids = psutil.Process(proc.pid).children(recursive=True)
            if len(kids) >= 4:  # 2 workers (+ the pool's resource tracker) and a recorder
                break
            time.sleep(0.2)
        kids = psutil.Process(proc.pid).children(recursive=True)
        assert len(kids) >= 3, kids
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    time.sleep(0.5)
    alive = [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(k.pid, k.cmdline()) for k in alive]
    pids = {k.pid for k in kids}
    leftover = [p for p in os.listdir("/dev/shm") if any(f"_{pid}_" in p or p.endswith(f"_{pid}") for pid in pids)]
    assert not leftover, leftover
    out = tmp_path / "out"
    done_before = {p.name for p in (out / "results").glob("*.json")} if (out / "results").exists() else set()
    assert len(done_before) < 2
    r = _run(["campaign", "run", str(camp), "--workers", "2", "--no-progress"], tmp_path, timeout=280)
    assert r.returncode == 1  # the stuck agitator fails its criterion, as before
    assert len(list((out / "results").glob("*.json"))) == 2
    assert json.loads((out / "last_execution.json").read_text())["runs_executed"] == 2 - len(done_before)


@pytest.mark.timeout(2400)  # 6 runs of 10 h of the batch; loaded, one takes a minute or two
def test_shipped_plc_faults_at_their_documented_size_are_seen(tmp_path):
    """Issue 20: the five PLC faults the criteria used to miss (a frozen DO reading, the base pump
    capped, an observation delay, actuation jitter, a PLC restart), each at its documented size
    and window, move the process past a threshold of the no-fault twin; the twin passes.
    `--scenario plc` narrows the campaign to that scenario's runs and canaries."""
    shipped = ROOT / "configs/campaigns/bioreactor_faults.toml"
    kinds = ["do_stuck", "base_saturated", "obs_latency_spike", "act_jitter", "plc_restart"]
    only = [x for f in ["none"] + kinds for x in ("--only", f"plc.{f}.s1")]
    r = _run(["campaign", "run", str(shipped), "--out", str(tmp_path / "out"), "--workers", "2", "--no-progress",
              "--json", "--scenario", "plc"] + only, tmp_path, timeout=2300)
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["runs"] == 6 and set(summary["canaries"]) == {"do_loop_open", "do_stuck_5h", "ph_bias_double",
                                                                 "do_drift_double"}, summary["canaries"]
    base = json.loads((tmp_path / "out" / "results" / "plc.none.s1.json").read_text())
    assert base["verdict"] == "pass", base["criteria"]
    for f in kinds:
        res = json.loads((tmp_path / "out" / "results" / f"plc.{f}.s1.json").read_text())
        assert res.get("error") is None and res["seen"] is True, (f, res.get("error"), res["criteria"])
    assert summary["seen"]["plc|do_stuck"] == {"seen": 1, "runs": 1, "rate": 1.0}, summary["seen"]
    # the canaries were left out (--only): not run, so the campaign is not called valid
    assert r.returncode == 3 and not summary["valid"], r.stderr[-2000:]
    r2 = _run(["campaign", "run", str(shipped), "--scenario", "nope", "--out", str(tmp_path / "o2")], tmp_path)
    assert r2.returncode == 2 and "--scenario 'nope'" in r2.stderr, r2.stderr
