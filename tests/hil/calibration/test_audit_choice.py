"""hil audit rests the dynamics and sensor rows on one fit: the newest on the deployment unit;
a profile injected from a fit that misfits the output with structure cannot make the sensor
row green (hand-written fitted.toml evidence, no fitting here)."""

from __future__ import annotations

from hil.calibration import tomlw
from hil.calibration.audit import audit, chosen_fit, gather

DO = {"noise_std": 0.4}


def _fit(path, unit, created, model_error=None, findings=None, sensors=None, residual=None):
    doc = {"sysid": {"plant": "bioreactor", "unit": unit, "n_runs": 3, "created": created,
                     "runs": ["run0", "run1", "run2"], "outputs": ["dissolved_oxygen"],
                     "files": [f"/logs/{unit}/run{i}.csv" for i in range(3)],
                     "estimates": {"mu_x": {"value": 0.1}},
                     "model_error": model_error or {}, "identifiability": findings or {}},
           "gaps": {"sensors": sensors if sensors is not None else {"dissolved_oxygen": DO}}}
    if residual:
        doc["sysid"]["residual_model"] = residual
    path.write_text(tomlw.dumps(doc, {}))


def _scenario(d, sensors=None):
    (d / "scenario.toml").write_text(
        '[scenario]\nname = "s"\n[plant]\nmodel = "bioreactor"\n'
        + "".join(f"[gaps.sensors.{n}]\nnoise_std = {f['noise_std']}\n" for n, f in (sensors or {}).items()))


def test_the_newest_fit_on_the_deployment_unit_is_chosen_for_both_rows(tmp_path):
    _fit(tmp_path / "a_old.toml", "BR-07", "2026-01-01T00:00:00+00:00")
    _fit(tmp_path / "b_new.toml", "BR-07", "2026-03-01T00:00:00+00:00",
         sensors={"dissolved_oxygen": {"noise_std": 0.5}})
    _fit(tmp_path / "c_other.toml", "BR-09", "2026-06-01T00:00:00+00:00")  # newer, other unit
    (tmp_path / "project.toml").write_text('[project]\nunit = "BR-07"\n')
    _scenario(tmp_path, {"dissolved_oxygen": {"noise_std": 0.5}})
    (path, _), why = chosen_fit(gather(tmp_path))
    assert path.endswith("b_new.toml") and "deployment unit BR-07" in why
    cells = {c.gap: c for c in audit(tmp_path)}
    assert cells["dynamics"].evidence[0].startswith(str(tmp_path / "b_new.toml"))
    assert any("/logs/BR-07/run0.csv" in e for e in cells["dynamics"].evidence)  # the logs cited
    assert cells["sensor/noise"].status == "green"  # b_new's profile is the injected one
    assert "b_new.toml" in " ".join(cells["sensor/noise"].evidence)
    assert "c_other.toml" not in " ".join(cells["sensor/noise"].evidence + cells["dynamics"].evidence)


def test_a_profile_resting_on_model_error_does_not_turn_the_sensor_row_green(tmp_path):
    me = {"dissolved_oxygen": {"structured": True, "rms": 3.0}}
    _fit(tmp_path / "f.toml", "BR-07", "2026-03-01T00:00:00+00:00", model_error=me)
    (tmp_path / "project.toml").write_text('[project]\nunit = "BR-07"\n')
    _scenario(tmp_path, {"dissolved_oxygen": DO})
    cells = {c.gap: c for c in audit(tmp_path)}
    assert cells["sensor/noise"].status == "amber"
    assert "model error, not sensor error" in cells["sensor/noise"].next_step
    assert cells["dynamics"].status == "amber" and "dissolved_oxygen" in cells["dynamics"].next_step


def test_a_finding_names_the_effect_in_the_dynamics_row(tmp_path):
    why = "kla_alpha falls from 75 to 58 between 2.0 h and 22.0 h of run run0"
    _fit(tmp_path / "f.toml", "BR-07", "2026-03-01T00:00:00+00:00",
         findings={"finding_0": {"kind": "trend", "params": ["kla_alpha"], "why": why}})
    cells = {c.gap: c for c in audit(tmp_path)}
    assert cells["dynamics"].status == "amber" and why in cells["dynamics"].next_step


def test_no_scenario_is_said_so(tmp_path):
    _fit(tmp_path / "f.toml", "", "2026-03-01T00:00:00+00:00")
    cells = {c.gap: c for c in audit(tmp_path)}
    assert cells["sensor/noise"].evidence[0] == "no scenario on file"
    assert cells["dynamics"].status == "green"  # 3 runs, no finding, no misfit, no unit named


def test_a_diagnosis_only_residual_model_is_not_offered_for_shipping(tmp_path):
    """A residual model reading a logged column the loop lacks was not written: the dynamics
    row says so instead of 'ship the residual model'."""
    why = "feature 'trace.antifoam:86400' reads the logged column 'antifoam', which is no input of bioreactor"
    res = {"states": ["dissolved_o2"], "evaluated_on": "held-out runs", "improvement": {"dissolved_oxygen": 0.5},
           "rmse_without": {"dissolved_oxygen": 1.2}, "rmse_with": {"dissolved_oxygen": 0.6}, "not_written": why}
    _fit(tmp_path / "f.toml", "BR-07", "2026-03-01T00:00:00+00:00", residual=res)
    cells = {c.gap: c for c in audit(tmp_path)}
    step = cells["dynamics"].next_step
    assert cells["dynamics"].status == "amber"
    assert "for diagnosis only" in step and "'antifoam'" in step and "ship the residual model" not in step
    res.pop("not_written")
    _fit(tmp_path / "f.toml", "BR-07", "2026-03-01T00:00:00+00:00", residual=res)
    assert "ship the residual model" in {c.gap: c for c in audit(tmp_path)}["dynamics"].next_step
