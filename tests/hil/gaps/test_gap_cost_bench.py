"""benchmarks/gap_cost.py runs (--quick) and prints its JSON keys; no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_gap_cost_quick_prints_the_keys():
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gap_cost.py"), "--quick",
                          "--steps", "300"], capture_output=True, text=True, timeout=240,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for key in ("step_us_no_gaps", "step_us_all_gaps", "overhead_ratio", "plant_step_us_no_gaps",
                "plant_step_us_all_gaps", "allocated_blocks_delta", "allocated_blocks_per_step",
                "tracemalloc_blocks_delta", "tracemalloc_blocks_per_step"):
        assert key in out
    assert out["step_us_no_gaps"] > 0 and out["step_us_all_gaps"] > 0
    assert out["tracemalloc_blocks_per_step"] == 0  # no growth per step in hil/gaps
