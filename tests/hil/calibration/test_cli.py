"""Logs in through a column map, `hil sysid` end to end, `hil audit` flags the unmodelled
effect; bad files name column and row."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from hil.calibration.logs import ColumnMap, LogError, read_run
from hil.cli import main
from tests.hil.calibration import truth

MAP = """
[time]
column = "time_h"
unit = "h"
[columns]
DO_pct = "dissolved_oxygen"
feed_mLph = { to = "feed_rate", unit = "mL/h", lag_s = 600.0 }
air_Lmin = { to = "aeration_rate", unit = "L/min" }
glc = "glucose"
X_gL = "biomass"
CO2 = "co2"
temp_C = { to = "temperature", role = "state", unit = "degC" }
antifoam_mL = { role = "extra" }
"""

SCENARIO = """
[scenario]
name = "calib"
[plant]
model = "bioreactor"
initial_state = { biomass = 1.0 }
[loop]
step_s = 1.0
duration_s = 60.0
"""


def _write_csv(run, path, rng):
    t_h = run.t_s / 3600.0
    keep = rng.random(t_h.size) > 0.03  # irregular: 3 % of the rows missing
    keep[0] = keep[-1] = True
    df = pd.DataFrame({
        "time_h": t_h, "DO_pct": run.Y[:, 1], "feed_mLph": run.U[:, 0] * 1e3,
        "air_Lmin": run.U[:, 3] / 60.0, "glc": run.Y[:, 0], "X_gL": run.Y[:, 4], "CO2": run.Y[:, 6],
        "temp_C": 298.0 - 273.15, "antifoam_mL": rng.poisson(0.1, t_h.size).astype(float),
        "operator_note": "ok"})
    df[keep].to_csv(path, index=False)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    d = tmp_path_factory.mktemp("proj")
    rng = np.random.default_rng(7)
    runs = truth.runs(4, hours=8.0)
    for i, r in enumerate(runs):
        _write_csv(r, d / f"run{i}.csv", rng)
    (d / "map.toml").write_text(MAP)
    (d / "scenario.toml").write_text(SCENARIO)
    return d


def test_column_map_converts_units_and_keeps_extras(project):
    spec = truth.SPEC
    cm = ColumnMap.load(project / "map.toml", spec)
    run = read_run(project / "run0.csv", spec, cm)
    raw = pd.read_csv(project / "run0.csv")
    assert run.t_s[1] == pytest.approx(raw.time_h[1] * 3600.0)
    assert run.U[5, spec.index("inputs", "aeration_rate")] == pytest.approx(raw.air_Lmin[5] * 60.0)
    assert np.all(run.X_presc[:, spec.index("states", "temperature")] == pytest.approx(298.0))
    assert "antifoam_mL" in run.extras and "operator_note" not in run.extras
    # the feed passes through the known 600 s pump lag: the first sample is the command,
    # later ones lag behind a step
    feed = run.U[:, 0]
    assert feed[0] == pytest.approx(raw.feed_mLph[0] * 1e-3)


def test_bad_cell_names_column_and_row(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("time,glucose,feed_rate\n0,15,0.04\n60,abc,0.04\n120,14.9,0.04\n")
    with pytest.raises(LogError) as e:
        read_run(p, truth.SPEC)
    assert "column 'glucose', row 2" in str(e.value) and "'abc'" in str(e.value)
    p.write_text("time,glucose\n0,15\n60,14\n30,14.9\n")
    with pytest.raises(LogError, match=r"column 'time', row 3: .*does not increase"):
        read_run(p, truth.SPEC)
    p.write_text("time,glucose\n0,15\n60,14\n")
    with pytest.raises(LogError, match=r"columns.DO_pct.*no column 'DO_pct'"):
        read_run(p, truth.SPEC, ColumnMap.from_dict({"columns": {"DO_pct": "dissolved_oxygen"}}, truth.SPEC))
    with pytest.raises(LogError, match=r"columns.x.unit: no conversion from 'furlong'"):
        ColumnMap.from_dict({"columns": {"x": {"to": "glucose", "unit": "furlong"}}}, truth.SPEC)


def test_sysid_cli_then_audit_flags_unmodelled_effect(project):
    d = project
    out = d / "fitted.toml"
    r = CliRunner().invoke(main, [
        "sysid", "--scenario", str(d / "scenario.toml"), "--map", str(d / "map.toml"),
        "--data", str(d / "run0.csv"), "--data", str(d / "run1.csv"), "--data", str(d / "run2.csv"),
        "--params", "mu_x,Y_xs", "--outputs", "dissolved_oxygen,glucose,biomass,co2",
        "--bias", "glucose", "--residual-states", "co2",
        "--residual-features", "x.co2,u.aeration_rate", "--holdout", str(d / "run3.csv"),
        "--world-model", "--horizon", "40", "--unit", "BR-07", "--out", str(out)])
    assert r.exit_code == 0, (r.output, r.exc_info)
    doc = tomllib.loads(out.read_text())
    est = doc["sysid"]["estimates"]
    # co2 carries the unmodelled stripping and is fitted here: mu_x is pulled off the truth
    # (why the audit below must say amber), but stays near it
    assert est["mu_x"]["value"] == pytest.approx(truth.TRUE_PARAMS["mu_x"], rel=0.1)
    assert doc["plant"]["parameters"]["mu_x"] == est["mu_x"]["value"]
    assert set(doc["gaps"]["randomize"]["plant"]) == {"mu_x", "Y_xs"}
    assert doc["gaps"]["sensors"]["dissolved_oxygen"]["quant_step"] == pytest.approx(0.1)
    res = doc["sysid"]["residual_model"]
    assert res["rmse_with"]["co2"] < res["rmse_without"]["co2"]
    assert (d / res["file"]).exists()
    for f in doc["sysid"]["residual_plots"] + [doc["sysid"]["world_model"]["plot"]]:
        assert (d / f).stat().st_size > 1000
    assert doc["sysid"]["world_model"]["diverging_regions"]
    # the fitted [gaps] section is valid scenario input
    from hil.gaps.config import GapsSection

    GapsSection.model_validate(doc["gaps"])

    (d / "manifest.toml").write_text(
        '[project]\nunit = "BR-07"\nscenario = "scenario.toml"\nfits = ["fitted.toml"]\n')
    r = CliRunner().invoke(main, ["audit", str(d / "manifest.toml"), "--json",
                                  "--md", str(d / "audit.md"), "--html", str(d / "audit.html")])
    assert r.exit_code == 0, r.output
    cells = {c["gap"]: c for c in json.loads(r.output)}
    assert cells["visual"]["status"] == "n/a"
    assert cells["dynamics"]["status"] == "amber"
    assert "co2" in cells["dynamics"]["next_step"]
    assert any("world model diverges" in e for e in cells["dynamics"]["evidence"])
    assert any("residual model on co2" in e for e in cells["dynamics"]["evidence"])
    assert cells["sensor/noise"]["status"] == "amber"  # fitted, not injected in the scenario
    assert cells["latency"]["status"] == "red"
    assert "| dynamics | amber |" in (d / "audit.md").read_text()


def test_audit_without_evidence_is_red(tmp_path):
    (tmp_path / "scenario.toml").write_text(SCENARIO)
    r = CliRunner().invoke(main, ["audit", str(tmp_path), "--json"])
    cells = {c["gap"]: c["status"] for c in json.loads(r.output)}
    assert cells == {"visual": "n/a", "dynamics": "red", "sensor/noise": "red",
                     "contact/actuator": "red", "latency": "red", "safety wrapper": "red"}


def test_unlogged_inputs_fixed_or_profile(project):
    cm = ColumnMap.from_dict({"time": {"column": "time_h", "unit": "h"},
                              "columns": {"glc": "glucose"},
                              "inputs": {"aeration_rate": {"profile": [[0.0, 8.0], [3600.0, 12.0]]},
                                         "agitation_power": {"value": 40.0}}}, truth.SPEC)
    run = read_run(project / "run0.csv", truth.SPEC, cm)
    air = run.U[:, truth.SPEC.index("inputs", "aeration_rate")]
    assert np.all(air[run.t_s < 3600.0] == 8.0) and np.all(air[run.t_s >= 3600.0] == 12.0)
    assert np.all(run.U[:, truth.SPEC.index("inputs", "agitation_power")] == 40.0)
    with pytest.raises(LogError, match="inputs.agitation_power: give exactly one of value or profile"):
        ColumnMap.from_dict({"inputs": {"agitation_power": {"value": 1.0, "profile": [[0, 1]]}}}, truth.SPEC)


def test_hil_recording_is_valid_input_and_fits(tmp_path):
    """A hil run (what a HIL session against a real PLC records) calibrates like a unit log."""
    from hil.calibration.sysid import SysIdProblem
    from hil.scenario.config import parse_scenario
    from hil.runtime import Runtime
    from tests.hil.test_config import _with

    sc = parse_scenario(_with(loop__step_s=30.0, plant__parameters={"mu_x": 0.1},
                              plant__initial_state={"biomass": 1.0},
                              inputs__feed_rate={"driver": "profile",
                                                 "profile": [[0.0, 0.03], [7200.0, 0.07]]},
                              gaps={"sensors": {"biomass": {"noise_std": 0.02}}}))
    with Runtime(sc, lockstep=True, duration_s=4 * 3600.0, record_path=str(tmp_path / "rec")) as rt:
        rt.run()
    run = read_run(tmp_path / "rec", truth.SPEC)
    assert run.t_s[0] == 0.0 and np.isfinite(run.Y[:, truth.SPEC.index("outputs", "biomass")]).all()
    assert run.U[:, 0].max() == pytest.approx(0.07)
    x0 = truth.SPEC.nominal("states")
    x0[0] = 1.0
    # t_s of a recording is the end of each step: the first row is after one step
    res = SysIdProblem(truth.MODULE, [run], ["mu_x"], x0=None, init_states=["biomass"],
                       outputs=["biomass"]).fit()
    assert res.ci95[0][0] <= 0.1 <= res.ci95[0][1], res.values


def test_sysid_cli_bad_log_exit_2_naming_column_and_row(project, tmp_path):
    bad = tmp_path / "bad.csv"
    text = (project / "run0.csv").read_text().splitlines()
    cols = text[1].split(",")
    cols[1] = "n/a?"  # DO_pct of data row 1
    text[1] = ",".join(cols)
    bad.write_text("\n".join(text) + "\n")
    r = CliRunner().invoke(main, ["sysid", "--scenario", str(project / "scenario.toml"),
                                  "--map", str(project / "map.toml"), "--data", str(bad),
                                  "--params", "mu_x", "--out", str(tmp_path / "f.toml")])
    assert r.exit_code == 2
    assert "column 'DO_pct', row 1: 'n/a?' is not a number" in r.output


@pytest.mark.parametrize("extra, message", [
    (["--residual-states", "oxygen"], "--residual-states: 'oxygen' is not a state of bioreactor"),
    (["--residual-states", "co2", "--residual-features", "x.dissolved_oxygen,u.stirrer"],
     "'stirrer' is not an input of bioreactor"),
    (["--residual-states", "co2", "--residual-features", "x.co2,trace.antifoam"],
     "'trace.antifoam': a trace needs its time constant in s > 0"),
    (["--residual-states", "co2", "--residual-features", "x.co2,since.antifoam"],
     "'since.antifoam': 'antifoam' is neither an input of bioreactor nor an extra column of run 'run0'"),
    (["--drift", "oxygen"], "--drift: 'oxygen' is not an output of bioreactor"),
    (["--fit-lag", "pump"], "--fit-lag: 'pump' is not an input of bioreactor"),
])
def test_names_are_checked_before_the_fit(project, extra, message):
    d = project
    r = CliRunner().invoke(main, ["sysid", "--scenario", str(d / "scenario.toml"), "--map", str(d / "map.toml"),
                                  "--data", str(d / "run0.csv"), "--params", "mu_x", "--no-plots",
                                  "--out", str(d / "never.toml")] + extra)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output and "pooled fit" not in r.output  # refused before fitting


def test_an_output_name_is_accepted_for_the_state_it_reads():
    from hil.commands.sysid import _feature_of, _state_of

    assert _state_of(truth.MODULE, "dissolved_oxygen", "--residual-states") == "dissolved_o2"
    assert _feature_of(truth.MODULE, "x.dissolved_oxygen") == "x.dissolved_o2"
    assert _state_of(truth.MODULE, "ph", "--residual-states") == "h_ion"
