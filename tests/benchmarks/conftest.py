"""Helpers for the benchmark smoke tests: import a benchmark script, run one with --quick."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def load(name: str):
    """Import benchmarks/<name>.py as a module (benchmarks/ on sys.path for its `fair` import)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_quick(name: str, *args: str, timeout: float = 540) -> dict:
    """Run benchmarks/<name>.py --quick; return the JSON of its last stdout line."""
    out = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--quick", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
