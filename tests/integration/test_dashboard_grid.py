"""The grid's live panels in a real headless browser.

`hil run configs/grid118.toml --dashboard 127.0.0.1:PORT` in real time (1 s steps; the Modbus
server on a free port, OPC UA and IEC 104 off to keep the start short). While the page shows the
run, an operator opens line 100's breaker over Modbus with `mbpoll` (coil 99, as the scenario maps
it; in a lockstep run of the scenario that line carries 41.1 % before its trip, 0 after, and no
other breaker moves). Asserted from the page's own canvases, while the run goes on:
- the bus-voltage heat map has one cell per bus (118), its colour scale the 0.95-1.05 pu band,
  and draws a new row per loop step with every cell coloured (a missing value would be black);
- the line-loading bars have one bar per line (186); line 100's bar is drawn before the command and
  gone two steps after it, while the page keeps updating; the breaker's status reads open.
"""

from __future__ import annotations

import json
import os
import re
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
CONFIG = ROOT / "configs" / "grid118.toml"
UI_TIMEOUT_MS = 120_000
LINE = 100          # opened by the operator's Modbus write: coil LINE - 1 (the scenario's block: coil k)
MBPOLL = shutil.which("mbpoll")

# JavaScript over the page's own state (app.js: `hello` = the layout, `panels` = the drawn panels).
_CANVAS_OF_PANEL = """(idx) => { const all = [...document.querySelectorAll('#panels canvas')];
  return all.indexOf(document.querySelectorAll('#panels .panel')[idx].querySelector('canvas')); }"""
_HEAT_ROWS = """() => {
  const c = document.querySelectorAll('#panels canvas')[%d], g = c.getContext('2d');
  const px = g.getImageData(0, 0, c.width, c.height).data, rows = [];
  for (let y = 0; y < c.height; y++) { let n = 0, dark = 0;
    for (let x = 0; x < c.width; x++) { const i = 4 * (y * c.width + x);
      if (px[i + 3] > 0) { n++; if (px[i] < 40 && px[i + 1] < 40 && px[i + 2] < 40) dark++; } }
    if (n) rows.push([n, dark]); }
  return rows; }"""
_BAR_PIXEL = """([k, n]) => {
  const c = document.querySelectorAll('#panels canvas')[%d], w = c.width / n;
  return c.getContext('2d').getImageData(Math.floor(k * w) + 1, c.height - 2, 1, 1).data[3]; }"""


def _mbpoll(port: int, *args: str) -> str:
    """mbpoll (Debian's Modbus master) once, 0-based addresses; its output, exit 0 asserted."""
    p = subprocess.run([MBPOLL, "-m", "tcp", "-a", "1", "-0", "-1", "-o", "5", "-p", str(port), *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.mark.skipif(MBPOLL is None, reason="mbpoll not installed (apt-get install mbpoll)")
def test_grid_panels_follow_an_operators_breaker_command(tmp_path):
    port, mb = free_port(), free_port()
    settings = {"modbus.port": str(mb), "opcua.enabled": "false", "iec104.enabled": "false",
                "loop.status_interval_s": "0.2", "loop.priority": "0", "loop.cpu": "-1"}
    cmd = [sys.executable, "-m", "hil.cli", "run", str(CONFIG), "--duration", "10min", "--quiet", "--no-record",
           "--dashboard", f"127.0.0.1:{port}"]
    for k, v in settings.items():
        cmd += ["--set", f"{k}={v}"]
    run = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: listening(port), run, "hil run --dashboard: the dashboard listening")
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.set_default_timeout(UI_TIMEOUT_MS)
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_function("document.getElementById('scenario').textContent === 'grid118'")
            layout = page.evaluate("hello.panels.map((p) => ({kind: p.kind, n: p.series.length, "
                                   "names: p.series.map((s) => s.name), band: p.band}))")
            heat = next(i for i, p in enumerate(layout) if p["kind"] == "heatmap")
            bars = next(i for i, p in enumerate(layout) if p["kind"] == "bars")
            assert layout[heat]["n"] == 118 and layout[heat]["band"] == [0.95, 1.05], layout[heat]
            assert layout[bars]["n"] == 186, layout[bars]["n"]
            k = layout[bars]["names"].index(f"line_{LINE}.loading")
            # canvases in page order: one per heat map / bars panel, uPlot's own canvases for lines
            canvas_of, bars_canvas = (page.evaluate(_CANVAS_OF_PANEL, i) for i in (heat, bars))

            page.wait_for_function("lastStep !== null && lastStep >= 2")
            assert page.evaluate(_BAR_PIXEL % bars_canvas, [k, 186]) > 0, "line 100's bar is not drawn before its trip"
            rows_before = page.evaluate(_HEAT_ROWS % canvas_of)
            assert rows_before and all(dark == 0 for _, dark in rows_before), rows_before

            _mbpoll(mb, "-t", "0", "-r", str(LINE - 1), "127.0.0.1", "--", "1")  # coil: open line 100
            step_at_command = page.evaluate("lastStep")
            page.wait_for_function(f"lastStep >= {step_at_command + 2}")
            status = re.findall(r"^\[(\d+)\]:\s+(\S+)", _mbpoll(mb, "-t", "1", "-r", str(LINE - 1), "127.0.0.1"), re.M)
            assert status == [(str(LINE - 1), "0")], status  # discrete input k: breaker closed = 1
            assert page.evaluate(_BAR_PIXEL % bars_canvas, [k, 186]) == 0, "line 100's bar still drawn after its trip"
            rows_after = page.evaluate(_HEAT_ROWS % canvas_of)
            assert len(rows_after) > len(rows_before), (len(rows_before), len(rows_after))  # a row per step
            assert all(n == rows_after[0][0] for n, _ in rows_after)  # every row spans all 118 cells
            browser.close()
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err[-3000:]
