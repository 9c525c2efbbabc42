"""benchmarks/step_warmup.py runs and reports both sides with their spread (here the same
checkout on both sides: the comparison machinery, not a speed, is what is checked)."""

import json
import subprocess
import sys

from tests.benchmarks.conftest import BENCH, ROOT


def test_step_warmup_reports_both_sides():
    out = subprocess.run([sys.executable, str(BENCH / "step_warmup.py"), "--before", str(ROOT),
                          "--configs", "configs/bioreactor.toml", "--repeats", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    cfg = res["configs"]["configs/bioreactor.toml"]
    for side in ("before", "after"):
        assert len(cfg[side]["runs"]) == 3 and cfg[side]["median"] > 0
    assert cfg["ratio_before_over_after"] > 0 and len(res["load_average"]) == 3
