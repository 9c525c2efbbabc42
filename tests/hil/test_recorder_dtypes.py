"""Recording column types: step and wall_ns int64, discrete state (breakers, island labels) in
the smallest integer type holding its bounds; the rest float64. Readers keep working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from hil.recorder import column_dtypes, read_meta, read_recording
from plants.base import load_plant

ROOT = Path(__file__).resolve().parents[2]


def test_column_dtypes_follow_the_discrete_bounds():
    spec = load_plant("grid", {"case": str(ROOT / "configs/grids/case118.m")}).spec
    t = column_dtypes(spec)
    assert t["step"] == t["wall_ns"] == "int64"
    assert t["d.line_7.status"] == "int8" and t["d.bus_12.island_state"] == "int8" and t["d.gen_3.status"] == "int8"
    assert t["d.line_7.overflow_steps"] == "int32"           # bounds 0..1e9
    assert not any(c.startswith(("y.", "meas.", "app.", "cmd.", "x.", "z.")) for c in t)


def test_a_grid_recording_is_typed_on_disk_and_reads_back(tmp_path):
    rec = tmp_path / "rec"
    r = subprocess.run([sys.executable, "-m", "hil.cli", "run", "configs/grid118.toml", "--lockstep", "--duration",
                        "4", "--quiet", "--record", str(rec), "--set", "inputs.line_10.open_cmd.driver=\"profile\"",
                        "--set", "inputs.line_10.open_cmd.profile=[[0.0, 0.0], [2.0, 1.0]]"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    schema = pq.read_schema(sorted(rec.glob("part-*.parquet"))[0])
    assert str(schema.field("step").type) == "int64" and str(schema.field("wall_ns").type) == "int64"
    assert str(schema.field("d.line_10.status").type) == "int8"
    assert str(schema.field("d.bus_12.island_state").type) == "int8"
    assert str(schema.field("y.line_10.closed").type) == "double"
    assert read_meta(rec)["dtypes"]["d.line_10.status"] == "int8"
    df = read_recording(rec)
    assert df["step"].dtype == np.int64 and list(df["step"]) == [0, 1, 2, 3]
    assert df["d.line_10.status"].tolist() == [1, 1, 0, 0]          # opened by the profile at t = 2 s
    assert (df["d.line_10.status"] == df["y.line_10.closed"]).all()   # typed and float views agree
    import pandas as pd

    assert len(pd.read_parquet(rec)) == 4                              # the directory as one dataset
