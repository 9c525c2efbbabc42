"""`hil plot`: a PNG of true vs measured signals of a recording with gaps."""

import subprocess
import sys
from pathlib import Path

from hil.scenario.config import load_scenario
from hil.recorder import read_recording
from hil.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]


def test_plot_of_a_gapped_run_shows_true_and_measured(tmp_path):
    sc = load_scenario(ROOT / "configs/bioreactor_gaps.toml")
    with Runtime(sc, lockstep=True, duration_s=3600.0, record_path=str(tmp_path / "rec")) as rt:
        rt.run()
    df = read_recording(tmp_path / "rec")
    assert (df["meas.ph"] != df["y.ph"]).any()  # the sensor gap acted
    out = subprocess.run([sys.executable, "-m", "hil.cli", "plot", str(tmp_path / "rec"), "--signals",
                          "glucose,dissolved_oxygen,ph,feed_rate", "--setpoint", "ph=5.0", "-o", str(tmp_path / "p.png")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    png = tmp_path / "p.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
