"""`hil grid n1 SCENARIO` and `hil grid ratings`: the shipped N-1-secure operating point is secure,
the stressed one of the redispatch demo is not and lists its insecure outages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# grid118.toml (ratings 1.25 x base flow): outages that AC confirms overload a line (every one of
# them flagged by the DC screen, tests/plants/grid/test_n1.py)
STRESSED_INSECURE = [3, 5, 7, 8, 9, 10, 11, 21, 23, 31, 32, 33, 36, 37, 38, 41, 47, 50, 51, 66, 67, 93, 94, 96, 97,
                     98, 99, 107, 108, 116, 118, 121, 125, 135, 136, 137, 138, 139, 141, 163, 164, 167, 183, 185]


def _hil(*args):
    return subprocess.run([sys.executable, "-m", "hil.cli", "grid", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_secure_point_exits_0_with_a_table_and_a_plot(tmp_path):
    png = tmp_path / "n1.png"
    r = _hil("n1", "configs/grid118_secure.toml", "--plot", str(png))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "N-1 secure" in r.stdout and "radial" in r.stdout   # line 184 feeds bus 117 alone
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_stressed_point_exits_3_and_lists_the_insecure_outages():
    r = _hil("n1", "configs/grid118.toml", "--json")
    assert r.returncode == 3, r.stderr
    d = json.loads(r.stdout)
    assert d["secure"] is False
    assert d["insecure_lines"] == STRESSED_INSECURE
    by_line = {o["line"]: o for o in d["outages"]}
    o = by_line[8]                          # 8-5, the 338 MW transformer
    assert o["verdict"] == "overload" and o["ac_max_loading"] > 1.0 and o["overloaded_lines"]
    assert by_line[2]["verdict"] == "screened" and by_line[2]["ac_max_loading"] is None
    assert d["confirmed"] < len(d["outages"])


def test_not_a_grid_scenario_is_a_config_error():
    r = _hil("n1", "configs/bioreactor.toml")
    assert r.returncode == 2 and "plant.model" in r.stderr


def test_ratings_reproduce_the_shipped_csv(tmp_path):
    """configs/grids/case118_n1_ratings.csv is what `hil grid ratings` writes (the documented rule)."""
    out = tmp_path / "r.csv"
    r = _hil("ratings", "configs/grid118_secure.toml", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_text() == (ROOT / "configs" / "grids" / "case118_n1_ratings.csv").read_text()
