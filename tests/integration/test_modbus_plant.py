"""An actuator written with mbpoll moves the plant; the served values follow it."""

import re
import shutil
import subprocess

import pytest

from tests.integration import modbus_helpers as H

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("mbpoll") is None, reason="mbpoll not installed")]


def _mbpoll(port, *args, values=()):
    cmd = ["mbpoll", "-m", "tcp", "-a", "1", "-0", "-1", "-p", str(port), *args, "127.0.0.1"]
    cmd += ["--", *map(str, values)] if values else []
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    assert p.returncode == 0, p.stdout + p.stderr
    return {int(a): v for a, v in re.findall(r"^\[(\d+)\]:\s+(\S+)", p.stdout, re.M)}


def test_mbpoll_write_moves_the_plant_and_reads_follow():
    with H.rig(time_scale=4.0) as r:
        level0 = float(_mbpoll(r.port, "-t", "3:float", "-B", "-r", "0")[0])
        assert level0 == pytest.approx(0.0, abs=0.5)
        _mbpoll(r.port, "-t", "4:float", "-B", "-r", "0", values=[8.0])  # inflow 8 L/min -> level 40 %
        seq = r.image.counters()["input_writes"]
        H.wait_until(lambda: r.image.counters()["input_writes_applied"] >= seq, timeout_s=5)
        assert float(_mbpoll(r.port, "-t", "3:float", "-B", "-r", "20")[20]) == 8.0  # applied inflow
        H.wait_until(lambda: float(_mbpoll(r.port, "-t", "3:float", "-B", "-r", "0")[0]) > 38.0, timeout_s=15)
        # the scaled int16 view of the same sensor agrees (x100)
        assert int(_mbpoll(r.port, "-t", "3", "-r", "10")[10]) > 3800
        _mbpoll(r.port, "-t", "0", "-r", "0", values=[1])  # pump on -> pump_running discrete input
        H.wait_until(lambda: _mbpoll(r.port, "-t", "1", "-r", "1")[1] == "1", timeout_s=5)
