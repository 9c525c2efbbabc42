"""The dashboard's campaign view in a headless browser: `hil dashboard OUT_DIR` on the output
directory of a campaign shows its progress (hil/campaign/runner.py CampaignProgress writes
progress.json after every run) and follows it as runs finish."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hil.campaign.runner import CampaignProgress
from tests.integration.net import free_port, listening, wait_for

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium not installed (apt-get install chromium)")


def test_campaign_progress_in_a_browser(tmp_path):
    (tmp_path / "campaign.json").write_text("{}")
    prog = CampaignProgress(SimpleNamespace(name="bioreactor_faults"), tmp_path, total=5, done=1, passed=1)
    prog.result({"run": {"run_id": "plc.stuck.s1"}, "verdict": "fail", "failed": ["do_band_plc"]})
    port = free_port()
    dash = subprocess.Popen([sys.executable, "-m", "hil.cli", "dashboard", str(tmp_path), "--listen",
                             f"127.0.0.1:{port}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: listening(port), dash, "hil dashboard OUT_DIR listening")
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.set_default_timeout(120_000)
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_function("document.getElementById('camp-text').textContent.startsWith('2 / 5 runs')")
            assert "1 pass, 1 fail" in page.inner_text("#camp-text")
            assert "plc.stuck.s1: fail (do_band_plc)" in page.inner_text("#camp-latest")
            assert page.locator("#operator").is_hidden()  # a campaign has no operator actions
            assert page.inner_text("#scenario") == "campaign bioreactor_faults"
            prog.result({"run": {"run_id": "plc.none.s2"}, "verdict": "pass", "failed": []})
            page.wait_for_function("document.getElementById('camp-text').textContent.startsWith('3 / 5 runs')")
            assert "2 pass, 1 fail" in page.inner_text("#camp-text")
            prog.write("finished")
            page.wait_for_function("document.getElementById('camp-text').textContent.includes('(finished)')")
            assert page.eval_on_selector("#camp-bar", "b => [b.value, b.max]") == [3, 5]
            browser.close()
        _other_sites_get_nothing(port)
    finally:
        dash.terminate()
        dash.wait(30)


def _other_sites_get_nothing(port: int) -> None:
    """A DNS-rebinding name (Host of another site) is refused; a websocket opened by another
    site's page (its Origin) is closed before any frame; the page's own origin gets frames."""
    import asyncio
    import json
    import urllib.error
    import urllib.request

    import websockets
    import websockets.exceptions

    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/layout", headers={"Host": f"evil.example:{port}"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=30)
    assert exc.value.code == 400

    async def first(origin: str):
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws", origin=origin) as ws:
            return json.loads(await asyncio.wait_for(ws.recv(), 30))

    with pytest.raises(websockets.exceptions.WebSocketException):
        asyncio.run(first("http://evil.example"))
    assert asyncio.run(first(f"http://127.0.0.1:{port}"))["type"] == "frame"
