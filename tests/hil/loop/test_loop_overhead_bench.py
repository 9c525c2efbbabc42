"""benchmarks/loop_overhead.py runs (--quick) and prints its JSON keys; no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_loop_overhead_quick_prints_the_keys():
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "loop_overhead.py"), "--quick", "--steps", "200"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for key in ("loop_step_us", "plant_step_us", "overhead_us", "goal_us", "spread", "steps", "repeats"):
        assert key in out
    assert out["loop_step_us"] > 0 and out["plant_step_us"] > 0 and out["repeats"] >= 3
    assert abs(out["overhead_us"] - (out["loop_step_us"] - out["plant_step_us"])) <= 2e-4  # rounded to 1e-4
