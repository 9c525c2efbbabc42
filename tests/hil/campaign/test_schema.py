"""Campaign files: expansion, seeds, and errors that name the key."""

from pathlib import Path

import pytest

from hil.campaign.expand import expand
from hil.campaign.schema import parse_campaign
from hil.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def _camp(**over):
    d = {"campaign": {"name": "t", "seeds": 3},
         "scenarios": [{"name": "plc", "file": str(ROOT / "configs/bioreactor_plc.toml"), "controller": "softplc"}],
         "faults": {"none": {"kind": "none"},
                    "stuck": {"kind": "sensor_stuck", "signal": "ph", "start_s": [10.0, 20.0], "duration_s": 5.0}}}
    for k, v in over.items():
        d[k] = v
    return d


def test_expand_scenarios_faults_seeds_with_stable_drawn_starts():
    c = parse_campaign(_camp())
    runs = expand(c)
    assert [r.run_id for r in runs] == ["plc.none.s1", "plc.none.s2", "plc.none.s3",
                                        "plc.stuck.s1", "plc.stuck.s2", "plc.stuck.s3"]
    starts = [r.start_s for r in runs if r.fault == "stuck"]
    assert all(10.0 <= s <= 20.0 for s in starts) and len(set(starts)) == 3
    assert starts == [r.start_s for r in expand(parse_campaign(_camp())) if r.fault == "stuck"]


def test_a_start_per_scenario_draws_each_scenario_in_its_own_window():
    c = parse_campaign(_camp(faults={"stuck": {"kind": "sensor_stuck", "signal": "ph", "duration_s": 5.0,
                                               "start_s": {"plc": [100.0, 200.0]}}}))
    starts = [r.start_s for r in expand(c)]
    assert len(starts) == 3 and all(100.0 <= s <= 200.0 for s in starts) and len(set(starts)) == 3
    fixed = parse_campaign(_camp(faults={"stuck": {"kind": "sensor_stuck", "signal": "ph", "duration_s": 5.0,
                                                   "start_s": {"plc": 42.0}}}))
    assert [r.start_s for r in expand(fixed)] == [42.0] * 3


def test_shipped_campaigns_parse():
    from hil.campaign.schema import load_campaign

    c = load_campaign(ROOT / "configs/campaigns/bioreactor_faults.toml")
    all_runs = expand(c)
    runs = [r for r in all_runs if not r.canary]
    kinds = {c.faults[r.fault]["kind"] for r in runs} - {"none"}
    assert len(runs) == 600 and len(kinds) >= 10 and len(c.seed_list()) == 20
    # known-bad runs on both scenarios: the wrapper opened, a PLC loop opened, a fault twice its size
    canaries = {(r.scenario, r.canary) for r in all_runs if r.canary}
    assert {s for s, _ in canaries} == {"plc", "policy"} and len(canaries) >= 3, canaries
    # no criterion that the loop's own clamp satisfies (bounds on app.*): the wrapper is judged on cmd.*
    assert not [cr.name for cr in c.criteria if cr.kind == "bounds" and any(
        s.startswith("app.") for s in (cr.signals or [cr.signal or ""]))]
    assert any(cr.kind == "safety_envelope" and "cmd" in cr.on for cr in c.criteria)
    assert load_campaign(ROOT / "configs/campaigns/bioreactor_smoke_rt.toml").campaign.mode == "realtime"


@pytest.mark.parametrize("over, key", [
    ({"faults": {"l": {"kind": "link_drop", "start_s": 1.0, "duration_s": 1.0}}}, "faults.l.kind"),
    ({"faults": {"p": {"kind": "policy_nan", "start_s": 1.0}}}, "faults.p.scenarios"),
    ({"faults": {"s": {"kind": "sensor_bias", "signal": "ph", "bias": 1.0, "start_s": [5.0, 1.0]}}},
     "faults.s.start_s"),
    ({"faults": {"s": {"kind": "sensor_bias", "signal": "ph", "bias": 1.0, "start_s": {"policy": 5.0}}}},
     "faults.s.start_s"),
    ({"faults": {"s": {"kind": "sensor_bias", "signal": "ph", "bias": 1.0, "start_s": {"plc": [5.0, 1.0]}}}},
     "faults.s.start_s.plc"),
    ({"criteria": [{"name": "e", "kind": "envelope", "envelope": "nope"}]}, "criteria[0].envelope"),
    ({"criteria": [{"name": "i", "kind": "iae", "signal": "y.ph"}]}, "criteria[0].setpoint"),
    ({"criteria": [{"name": "b", "kind": "bounds", "signal": "y.ph", "faults": ["nope"]}]}, "criteria[0].faults"),
])
def test_errors_name_the_key(over, key):
    with pytest.raises(ConfigError) as e:
        parse_campaign(_camp(**over))
    assert e.value.path == key, str(e.value)


def test_faults_of_a_plant_built_from_a_model_file_are_checked_against_its_spec(tmp_path):
    """A plant whose spec is built at load time (here the 14-bus grid: no module SPEC) takes
    campaign faults named after its generated signals; an unknown signal names the key."""
    sc = tmp_path / "grid.toml"
    sc.write_text(f'[scenario]\nname = "g"\n[plant]\nmodel = "grid"\ncase = "{ROOT / "configs/grids/case14.m"}"\n'
                  '[loop]\nstep_s = 1.0\nduration_s = 10.0\n')
    data = {"campaign": {"name": "t", "seeds": 1},
            "scenarios": [{"name": "g", "file": str(sc), "controller": "none"}],
            "faults": {"none": {"kind": "none"},
                       "gen": {"kind": "actuator_degraded", "signal": "gen_2.p_set", "gain": 0.5, "start_s": 2.0,
                               "duration_s": 3.0}}}
    c = parse_campaign(data)
    assert [r.fault for r in expand(c)] == ["none", "gen"]
    data["faults"]["gen"]["signal"] = "gen_99.p_set"
    with pytest.raises(ConfigError, match="faults.gen"):
        parse_campaign(data)
