"""The live dashboard in a real headless browser (Debian's chromium driven by Playwright with the
system executable; no `playwright install`).

`hil run configs/bioreactor_policy.toml --dashboard 127.0.0.1:PORT` in real time (loop, policy
and safety processes, the dashboard process beside them), operator password from the
environment. Asserted: the page loads with the bioreactor's panels; simulated time and steps
advance while the run goes on; a wrong password is refused and shows no operator actions; after
login, a demotion and an alarm acknowledgement reach the safety process (its decision log has
them, with the dashboard as their origin) and the page's decision-log card shows the demotion;
an action without a session is refused (401); `hil dashboard RUN_DIR` attaches to the same run
by its recording directory; stopping the run stops its dashboard process.

HIL_DASHBOARD_SCREENSHOT=path saves a screenshot of the page (docs/img/dashboard.png).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.net import free_port, listening, wait_for

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "bioreactor_policy.toml"
PASSWORD = "correct horse battery staple"
UI_TIMEOUT_MS = 120_000  # bounds for a loaded machine; each wait ends as soon as the page shows it

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium not installed (apt-get install chromium)")


def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _log_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _descendant_dashboards(loop_pid: int) -> list[int]:
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if "dashboard" in cmd and "--pid" in cmd and str(loop_pid) in cmd:
            out.append(p.info["pid"])
    return out


@pytest.mark.timeout(900)
def test_dashboard_in_a_browser_during_a_real_time_run(tmp_path):
    port, port2 = free_port(), free_port()
    ipc = tempfile.mkdtemp(prefix="hd", dir="/tmp")  # short: sun_path is 108 bytes
    log = tmp_path / "decisions.jsonl"
    rec = tmp_path / "rec"
    settings = {"bus.ipc_dir": json.dumps(ipc), "safety.decision_log": json.dumps(str(log)),
                "safety.status_path": json.dumps(str(tmp_path / "safety-status.json")),
                "safety.mode": '"limited"', "safety.rollout.auto_promote": "false",
                "loop.status_interval_s": "0.2", "loop.priority": "0", "loop.cpu": "-1",
                # 5x real time and no "policy lost" demotion: on a loaded machine the policy may miss
                # deadlines, and the mode must only change by the dashboard's request
                "loop.time_scale": "5.0", "safety.policy_lost_after_s": "1e6"}
    cmd = [sys.executable, "-m", "hil.cli", "run", str(CONFIG), "--duration", "6h", "--quiet",
           "--record", str(rec), "--dashboard", f"127.0.0.1:{port}"]
    for k, v in settings.items():
        cmd += ["--set", f"{k}={v}"]
    env = {**os.environ, "HIL_DASHBOARD_PASSWORD": PASSWORD}
    run = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    attached = None
    try:
        wait_for(lambda: listening(port), run, "hil run --dashboard: the dashboard listening")
        url = f"http://127.0.0.1:{port}/"
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(UI_TIMEOUT_MS)
            page.goto(url)
            page.wait_for_function("document.getElementById('scenario').textContent === 'bioreactor_policy'")
            titles = page.locator(".panel h3").all_inner_texts()
            assert titles[:3] == ["Dissolved oxygen", "Glucose and feed", "pH"]
            assert page.locator(".panel").first.locator("canvas").count() >= 1  # uPlot drew the DO panel

            # values update while the run goes on
            page.wait_for_function("+document.getElementById('frames').textContent >= 3")
            t1, s1 = float(page.inner_text("#t_sim")), int(page.inner_text("#step"))
            page.wait_for_function(f"+document.getElementById('t_sim').textContent > {t1}")
            assert int(page.inner_text("#step")) > s1
            assert page.inner_text("#state").startswith("running")
            page.wait_for_function("document.getElementById('mode').textContent === 'limited'")

            # wrong password: refused, no operator actions
            page.fill("#login-password", "wrong password")
            page.click("#login-button")
            page.wait_for_function("document.getElementById('login-msg').textContent.includes('wrong password')")
            assert page.locator("#actions").is_hidden()

            # no session: the action API refuses
            code, body = _post(url + "api/action", {"op": "demote", "to": "shadow"})
            assert code == 401 and "log in" in body["error"]

            # right password: demote and acknowledge reach the safety process
            page.fill("#login-password", PASSWORD)
            page.click("#login-button")
            page.wait_for_selector("#actions", state="visible")
            page.select_option("#demote-to", "advisory")
            page.click("#op-demote")
            page.wait_for_function("document.getElementById('login-msg').textContent.startsWith('demote')")
            assert page.inner_text("#login-msg") == "demote: done mode advisory"
            page.wait_for_function("document.getElementById('mode').textContent === 'advisory'")
            page.wait_for_function("document.getElementById('events').textContent.includes('demoted: dashboard')")
            page.click("#op-acknowledge")
            page.wait_for_function("document.getElementById('login-msg').textContent.includes('acknowledged')")
            if os.environ.get("HIL_DASHBOARD_SCREENSHOT"):
                page.wait_for_function(f"+document.getElementById('t_sim').textContent > {float(page.inner_text('#t_sim')) + 60}")
                page.screenshot(path=os.environ["HIL_DASHBOARD_SCREENSHOT"], full_page=True)
            browser.close()

        recs = _log_records(log)
        demoted = [r for r in recs if r.get("event") == "mode" and r.get("mode") == "advisory"]
        assert demoted and "dashboard" in demoted[-1]["reason"]
        wait_for(lambda: any(r.get("event") == "acknowledge" for r in _log_records(log)), run,
                 "the acknowledgement in the decision log")
        ack = [r for r in _log_records(log) if r.get("event") == "acknowledge"]
        assert ack[-1]["by"] == "dashboard operator"

        # a second dashboard attaches to the same run by its recording directory
        attached = subprocess.Popen([sys.executable, "-m", "hil.cli", "dashboard", str(rec), "--listen",
                                     f"127.0.0.1:{port2}"], cwd=ROOT, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        wait_for(lambda: listening(port2), attached, "hil dashboard RUN_DIR listening")
        with urllib.request.urlopen(f"http://127.0.0.1:{port2}/api/layout", timeout=30) as r:
            hello = json.loads(r.read())
        assert hello["pid"] == run.pid and hello["record_path"] == str(rec.resolve())
        assert hello["auth_enabled"] is False  # no password given to it: read-only
        code, body = _post(f"http://127.0.0.1:{port2}/api/login", {"password": PASSWORD})
        assert code == 403 and "disabled" in body["error"]
    finally:
        if attached is not None:
            attached.terminate()
            attached.wait(30)
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
        shutil.rmtree(ipc, ignore_errors=True)
    assert run.returncode == 0, err[-3000:]
    assert "stopped" in err
    assert _descendant_dashboards(run.pid) == []  # its dashboard process was stopped with the run
