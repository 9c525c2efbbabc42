"""The live dashboard of a run with the in-loop shield, in a real headless browser.

`hil run configs/panda_policy.toml --dashboard 127.0.0.1:PORT` in real time ([safety]
placement = "loop": the loop's compiled shield decides every step on the policy's proposals,
the safety process supervises). Asserted: the arm's panels load, and the page shows what the
shield did (steps by source, the supervisor letting the policy act) and the source of the
applied action now, from the loop's own status, while the run goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.net import free_port, listening, wait_for

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "panda_policy.toml"
UI_TIMEOUT_MS = 120_000

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium not installed (apt-get install chromium)")


def test_dashboard_shows_the_in_loop_shield(tmp_path):
    port = free_port()
    ipc = tempfile.mkdtemp(prefix="hd", dir="/tmp")  # short: sun_path is 108 bytes
    settings = {"bus.ipc_dir": json.dumps(ipc), "safety.decision_log": json.dumps(str(tmp_path / "d.jsonl")),
                "loop.status_interval_s": "0.2", "loop.priority": "0", "loop.cpu": "-1",
                "loop.time_scale": "0.25"}  # a quarter of real time: a loaded machine keeps up
    cmd = [sys.executable, "-m", "hil.cli", "run", str(CONFIG), "--duration", "10min", "--quiet", "--no-record",
           "--dashboard", f"127.0.0.1:{port}"]
    for k, v in settings.items():
        cmd += ["--set", f"{k}={v}"]
    run = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: listening(port), run, "hil run --dashboard: the dashboard listening")
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(UI_TIMEOUT_MS)
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_function("document.getElementById('scenario').textContent === 'panda_policy'")
            page.wait_for_function("document.getElementById('sources').textContent.includes('shield in the loop')")
            page.wait_for_function("document.getElementById('sources').textContent.includes('policy may act')")
            text = page.inner_text("#sources")
            assert "steps by source: " in text and ("policy " in text or "projected " in text), text
            first = page.inner_text("#sources")
            page.wait_for_function(f"document.getElementById('sources').textContent !== {json.dumps(first)}")
            assert page.inner_text("#source") in ("policy", "projected")
            browser.close()
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
        shutil.rmtree(ipc, ignore_errors=True)
    assert run.returncode == 0, err[-3000:]
