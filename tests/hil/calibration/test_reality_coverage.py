"""Do `hil sysid`'s 95 % intervals cover the truth on data it did not generate?

Replicate units: hil/calibration/reality.py (its own equations under LSODA, buffered pH
under an on/off PLC, jacket-held temperature, a drifting online biomass probe with lab
references) with the unmodelled foaming switched off, one 24 h run each at 60 s samples,
different seeds (inputs, sensor noise, lab noise). The model shares mu_x, Y_xs, kla_alpha
and Y_xo with the reality (TRUE_SHARED); the other shared constants are at PenSim's values
in both. The fit has the probe's bias and drift (--bias/--drift) and the lab references.

Coverage of a 95 % interval over n units is Binomial(n, 0.95) when the intervals are honest.
- Default suite: 4 units, each parameter covered in >= 3 of 4. If the true coverage is 95 %
  this fails with probability 1.4 % per parameter; if it were 50 % (the biased intervals
  of the 2-parameter fit this replaces covered 0 of 1) it passes with probability 31 %.
- HIL_SLOW=1: the issue's goal, 20 units, each parameter in >= 18 of 20 (fails with
  probability 7.5 % per parameter at 95 % true coverage; passes with probability 21 %
  at 80 % coverage). The seeds are fixed, so either run is deterministic.
"""

from __future__ import annotations

import os

import pytest

from hil.calibration import logs, sysid
from hil.calibration.reality import TRUE_SHARED, Reality, write_runs
from plants.base import load_plant_module

# several fits of 24 h runs: minutes on a loaded 2-core machine (the default 300 s is per test)
pytestmark = pytest.mark.timeout(1200)

MODULE = load_plant_module("bioreactor")
SPEC = MODULE.SPEC
PARAMS = ["mu_x", "Y_xs", "kla_alpha", "Y_xo"]
OUTPUTS = ["dissolved_oxygen", "biomass", "co2"]


def fit_unit(d, seed: int, hours: float = 24.0, sample_s: float = 60.0, foam: bool = False):
    """One replicate unit: write its run, fit PARAMS with the biomass probe's bias and drift;
    returns the FitResult."""
    r = Reality() if foam else Reality(foam_rate_per_h=0.0)
    paths = write_runs(d, r, runs=1, hours=hours, sample_s=sample_s, first_seed=seed)
    cm = logs.ColumnMap.load(d / "map.toml", SPEC)
    runs = logs.read_runs(paths, SPEC, cm, SPEC.nominal("inputs"))
    x0 = SPEC.nominal("states")
    for k, v in r.x0.items():
        x0[SPEC.index("states", k)] = v
    pb = sysid.SysIdProblem(MODULE, runs, PARAMS, x0=x0, outputs=OUTPUTS,
                            bias_outputs=["biomass"], drift_outputs=["biomass"])
    return pb.fit()


def covered(res) -> dict[str, bool]:
    return {n: bool(lo <= TRUE_SHARED[n] <= hi) for n, (lo, hi) in zip(res.params, res.ci95)}


def _coverage(tmp_path, seeds):
    hits = {n: 0 for n in PARAMS}
    rows = []
    for s in seeds:
        res = fit_unit(tmp_path / f"unit{s}", s)
        c = covered(res)
        for n in PARAMS:
            hits[n] += c[n]
        rows.append({n: (round(float(v), 5), [round(float(a), 5), round(float(b), 5)])
                     for n, v, (a, b) in zip(res.params, res.values, res.ci95)})
    return hits, rows


def test_intervals_cover_the_truth_on_an_independent_reality(tmp_path):
    hits, rows = _coverage(tmp_path, range(100, 104))
    assert all(h >= 3 for h in hits.values()), (hits, rows)


@pytest.mark.skipif(not os.environ.get("HIL_SLOW"), reason="20 replicate fits (~10 min): set HIL_SLOW=1")
def test_intervals_cover_the_truth_in_18_of_20_units(tmp_path):
    hits, rows = _coverage(tmp_path, range(200, 220))
    assert all(h >= 18 for h in hits.values()), (hits, rows)


def test_without_the_probe_offsets_the_drift_is_taken_for_growth(tmp_path):
    """The control: the same unit fitted on the raw probe (no --bias/--drift; the lab
    references still in) gives a biased mu_x whose interval misses the truth -- the cause
    of the no-foam bias this file guards against (mu_x 0.102 [0.1016, 0.1024] before)."""
    r = Reality(foam_rate_per_h=0.0)
    d = tmp_path / "raw"
    paths = write_runs(d, r, runs=1, hours=24.0, sample_s=60.0, first_seed=100)
    runs = logs.read_runs(paths, SPEC, logs.ColumnMap.load(d / "map.toml", SPEC), SPEC.nominal("inputs"))
    x0 = SPEC.nominal("states")
    for k, v in r.x0.items():
        x0[SPEC.index("states", k)] = v
    res = sysid.SysIdProblem(MODULE, runs, PARAMS, x0=x0, outputs=OUTPUTS).fit()
    assert not covered(res)["mu_x"], res.ci95
    # the misfit shows as correlated residuals (white residuals of ~1400 samples: |lag-1| ~ 0.03)
    assert abs(res.rho[SPEC.index("outputs", "biomass")]) > 0.15
