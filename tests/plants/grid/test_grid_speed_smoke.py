"""benchmarks/grid_speed.py runs (a few iterations; no timing is asserted)."""

import importlib.util

import numpy as np

from .conftest import REFERENCE, ROOT


def test_benchmark_parts_run():
    spec = importlib.util.spec_from_file_location("grid_speed", ROOT / "benchmarks" / "grid_speed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with np.load(REFERENCE) as d:
        ref = {k: d[k] for k in d.files}
    r = bench.bench_reference118(ref, 5)
    assert r["max_dvm"] < 1e-6 and r["max_dva"] < 1e-6 and r["iterations"] >= 1
    step = bench.bench_grid_step(3)
    assert step["steps"] == 3 and step["median"] > 0
