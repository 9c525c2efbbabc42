"""The cross-mode equivalence matrix (issue 19): one scenario, one seed, one command sequence
give the same recording, bit for bit and every deterministic column, in every mode that runs
the loop's step (hil/loop/step.py):

    runtime   hil.runtime.Runtime(sc, lockstep=True), the inputs replayed as profiles
    gym       hil.gym.HilEnv, the same inputs as its actions (its per-step row, LoopStep.row)
    vector    hil.gym.HilVectorEnv, instance 0 of two (the second runs other actions)
    campaign  hil.campaign.worker.execute_run, the runtime's scenario file in a one-run campaign

for each shipped plant (bioreactor, grid on the IEEE 14-bus case, panda) and each case:

    plain     no gaps, no residual model, no fault
    gaps      every gap kind: sensor chains, observation and actuation latency, actuator
              chains, randomized plant parameters
    residual  a [plant] residual_model (the issue's reproduction: the gym env used to ignore
              it, so `hil run --lockstep` and the env parted ways without a warning)
    fault     one campaign fault (actuator_degraded on a commanded input, a finite window)

What a mode cannot take, and so is not compared:
- the vector env has no per-step hooks (a campaign FaultStage hooks one instance's Python
  step; the vector env steps its instances in one kernel call): no `fault` column for it.
  The single env takes the FaultStage through `HilEnv.hooks`, the runtime through
  `Runtime.hooks`, as the campaign worker does.
- every mode reads its scenario from a file written once per form (gym: bus-driven inputs;
  runtime and campaign: the same inputs as profiles): the order of the tables is part of a
  scenario (the gap streams are assigned in it), so the forms differ only in [inputs].
- `wall_ns` and `lateness_us` are wall-clock measurements (the envs record 0): every other
  column is compared, as `hil campaign replay`'s digest does (hil/campaign/worker.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from hil.calibration.residual import ResidualModel  # noqa: E402
from hil.calibration.tomlw import dumps  # noqa: E402
from hil.scenario.config import load_scenario, parse_scenario  # noqa: E402
from hil.loop.step import no_correction  # noqa: E402
from hil.recorder import columns_for, read_recording  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
NONDETERMINISTIC = ("wall_ns", "lateness_us")
SEED = 3


# ---- the scenarios (gym form: the commanded inputs are bus-driven) ----

def _bioreactor() -> dict:
    import tomllib

    full = tomllib.loads((ROOT / "configs" / "bioreactor_gym.toml").read_text())
    data = {k: full[k] for k in ("scenario", "plant", "loop", "inputs")}
    data["gaps_all"] = full["gaps"]  # the shipped gym scenario's gaps: every kind
    return data


def _grid() -> dict:
    return {
        "scenario": {"name": "grid14_eq"},
        "plant": {"model": "grid", "case": str(ROOT / "configs" / "grids" / "case14.m")},
        "loop": {"step_s": 1.0},
        "inputs": {"gen_2.p_set": {"driver": "bus", "value": 40.0}, "gen_3.p_set": {"driver": "bus", "value": 0.0}},
        "gaps_all": {
            "enabled": True, "max_delay_s": 10.0,
            "sensors": {"grid.frequency": {"noise_std": 0.002, "bias": 0.001, "quant_step": 0.0001},
                        "bus_2.vm": {"noise_std": 0.001, "sample_period_s": 2.0}},
            "actuators": {"gen_2.p_set": {"gain": 0.97, "rate_limit_per_s": 2.0, "lag_tau_s": 2.0},
                          "gen_3.p_set": {"deadband": 0.5, "quant_step": 0.1}},
            "latency": {"observation": {"grid.frequency": {"value_s": 2.0}},
                        "actuation": {"gen_2.p_set": {"dist": "uniform", "low_s": 1.0, "high_s": 3.0}}},
            "randomize": {"plant": {"line_3.rating": {"dist": "uniform", "low": 0.9, "high": 1.1, "relative": True}}},
        },
    }


def _panda() -> dict:
    inputs = {"control_mode": {"driver": "fixed", "value": 0.0},
              "gripper.width_target": {"driver": "fixed", "value": 0.08},
              "gripper.force_target": {"driver": "fixed", "value": 40.0}}
    for j in (1, 2, 4):
        inputs[f"joint_{j}.tau_target"] = {"driver": "bus", "value": 0.0}
    return {
        "scenario": {"name": "panda_eq"},
        "plant": {"model": "panda"},
        "loop": {"step_s": 0.001},
        "inputs": inputs,
        "gaps_all": {
            "enabled": True, "max_delay_s": 0.02,
            "sensors": {"joint_1.q": {"quant_step": 5.992e-6, "noise_std": 1e-5},
                        "joint_2.tau_measured": {"noise_std": 0.05, "bias": 0.15}},
            "actuators": {"joint_1.tau_target": {"gain": 0.98, "rate_limit_per_s": 200.0, "lag_tau_s": 0.003},
                          "joint_2.tau_target": {"deadband": 0.01}},
            "latency": {"observation": {"joint_1.q": {"value_s": 0.002}},
                        "actuation": {"joint_4.tau_target": {"dist": "uniform", "low_s": 0.001, "high_s": 0.003}}},
            "randomize": {"plant": {"joint_1.rotor_inertia": {"dist": "uniform", "low": 0.9, "high": 1.1,
                                                               "relative": True}}},
        },
    }


# plant -> (scenario builder, steps, residual (state, constant rate, feedback gain), fault)
PLANTS = {
    "bioreactor": (_bioreactor, 150, ("co2", -0.2, -0.5),
                   {"kind": "actuator_degraded", "signal": "agitation_power", "gain": 0.5}),
    "grid": (_grid, 20, ("line_5.temp_state", 0.5, -0.1),
             {"kind": "actuator_degraded", "signal": "gen_2.p_set", "gain": 0.5}),
    "panda": (_panda, 150, ("joint_1.dq", 0.2, -0.5),
              {"kind": "actuator_degraded", "signal": "joint_1.tau_target", "gain": 0.5}),
}
CASES = ("plain", "gaps", "residual", "fault")


def _actions(env, n: int, seed: int) -> np.ndarray:
    """A command sequence inside the action bounds: the initial commands plus a random walk
    of at most 20 % of the span (a fraction that every plant here takes without a stop)."""
    m = env.model
    a0 = m.u0[m.action_index]
    span = np.minimum(m.a_hi - m.a_lo, np.where(np.abs(a0) > 0, np.abs(a0), 1.0))
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.uniform(-0.02, 0.02, (n, a0.size)), axis=0).clip(-0.2, 0.2)
    return np.clip(a0 + walk * span, m.a_lo, m.a_hi)


def _residual(spec, state: str, rate: float, gain: float, path: Path) -> Path:
    """A residual model on one state: rate + gain * (x - x_nominal) per plant time unit."""
    lo = np.concatenate([spec.nominal("states"), spec.nominal("inputs")])
    m = ResidualModel.zeros(spec, [state], [f"x.{state}"], lo, np.ones(lo.size))
    m.W[0, 0] = rate
    m.W[0, 1 + spec.index("states", state)] = gain
    m.save(path)
    return path


class Case:
    """One (plant, case) cell: its gym-form scenario, the runtime-form one, and its fault."""

    def __init__(self, plant: str, case: str, tmp: Path):
        build, self.n, res, fault = PLANTS[plant]
        data = build()
        gaps = data.pop("gaps_all")
        data["loop"].update(seed=SEED, duration_s=self.n * data["loop"]["step_s"])
        data["loop"].pop("time_scale", None)
        self.step_s = data["loop"]["step_s"]
        if case == "gaps":
            data["gaps"] = gaps
        self.fault = None
        if case == "fault":  # a third of the run in, for a third of it
            k0 = self.n // 3
            self.fault = {**fault, "start_s": k0 * self.step_s, "duration_s": (self.n // 3) * self.step_s,
                          "shape": "step"}
        self.gym_data = data
        if case == "residual":
            spec = parse_scenario(_strip_bus(data)).plant.load().spec
            data["plant"]["residual_model"] = str(_residual(spec, *res, tmp / "residual.npz"))
        self.tmp = tmp

    def scenario(self):
        """The gym form, through a scenario file as every mode reads it (the order of the tables
        is part of the scenario: the gap streams are drawn in it)."""
        data = {**self.gym_data, "bus": {"transport": "ipc"}, "gym": {"episode_s": self.n * self.step_s}}
        return load_scenario(_write(self.tmp / "gym.toml", data))

    def runtime_file(self, actions: np.ndarray, names: list[str]) -> Path:
        return _write(self.tmp / "runtime.toml", self.runtime_data(actions, names))

    def runtime_data(self, actions: np.ndarray, names: list[str]) -> dict:
        """The scenario with the bus-driven inputs replaying `actions` (one row per step)."""
        data = _strip_bus(self.gym_data)
        for j, name in enumerate(names):
            data["inputs"][name] = {"driver": "profile",
                                    "profile": [[k * self.step_s, float(a)] for k, a in enumerate(actions[:, j])]}
        return data


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(data))
    return path


def _strip_bus(data: dict) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    out["inputs"] = {k: ({**v, "driver": "fixed"} if v.get("driver") == "bus" else dict(v))
                     for k, v in data["inputs"].items()}
    return out


# ---- the modes ----

def _fault_stage(fault: dict, plant, spec, module, n: int, step_s: float, y_served):
    from hil.campaign.faults import build_fault, check_fault
    from hil.campaign.stage import FaultStage

    args = check_fault(fault, "faults.f", spec, module)
    f = build_fault("f", fault["kind"], args, fault["start_s"], fault["duration_s"], fault["shape"], spec, module,
                    step_s)
    return FaultStage([f], plant, n, step_s, SEED, y_served=y_served)


def run_gym(cell: Case, actions: np.ndarray, *, fault: bool = True, correction: bool = True) -> np.ndarray:
    """The single env's recording rows (n, columns)."""
    from hil.gym.env import HilEnv

    env = HilEnv(cell.scenario())
    if not correction:
        env.loop.corr = no_correction(env.model.spec)
        env.loop.rebind()
    if fault and cell.fault is not None:
        env.hooks = _fault_stage(cell.fault, env.plant, env.model.spec, env.model.plant_model, cell.n, cell.step_s,
                                 env.y_meas)
    env.reset(seed=SEED)
    rows = np.empty((cell.n, env.row.size))
    for k in range(cell.n):
        env.step(actions[k])
        rows[k] = env.row
    return rows


def run_vector(cell: Case, actions: np.ndarray) -> np.ndarray:
    """Instance 0 of a two-instance vector env (instance 1: other commands, seed + 1)."""
    from hil.gym.vector import HilVectorEnv

    venv = HilVectorEnv(cell.scenario(), 2, parallel=False, record_rows=True)  # the fused step where it exists
    venv.reset(seed=SEED)
    other = actions[::-1]
    rows = np.empty((cell.n, venv.Rows.shape[1]))
    for k in range(cell.n):
        venv.step(np.stack([actions[k], other[k]]))
        rows[k] = venv.Rows[0]
    return rows


def run_runtime(cell: Case, actions: np.ndarray, names: list[str], rec: Path):
    from hil.runtime import Runtime
    from plants.base import load_plant_module

    sc = load_scenario(cell.runtime_file(actions, names))
    rt = Runtime(sc, lockstep=True, duration_s=cell.n * cell.step_s, record=True, record_path=str(rec),
                 start_servers=False)
    try:
        if cell.fault is not None:
            rt.hooks = _fault_stage(cell.fault, rt.plant, rt.spec, load_plant_module(sc.plant.model), rt.n_steps,
                                    rt.step_s, rt.y_meas)
        summary = rt.run()
    finally:
        rt.close()
    assert summary.state == "stopped", summary.error
    return read_recording(rec)


def run_campaign(cell: Case, actions: np.ndarray, names: list[str], out: Path):
    from hil.campaign.expand import expand
    from hil.campaign.schema import parse_campaign
    from hil.campaign.worker import execute_run, run_paths

    path = cell.runtime_file(actions, names)
    fault = cell.fault if cell.fault is not None else {"kind": "none"}
    c = parse_campaign({"campaign": {"name": "eq", "seeds": [SEED], "record_decimate": 1, "retries": 0},
                        "scenarios": [{"name": "s", "file": str(path), "controller": "none",
                                       "duration_s": cell.n * cell.step_s}],
                        "faults": {"f": fault}}, base_dir=out)
    (run,) = expand(c)
    result = execute_run(c, run, out)
    assert "error" not in result, result.get("traceback")
    return read_recording(run_paths(out, run.run_id)[0] / "rec")


# ---- the comparison ----

def assert_same_recording(spec, rows: np.ndarray, df, what: str) -> None:
    """Every deterministic column equal, bit for bit (NaN where NaN)."""
    cols = columns_for(spec)
    assert rows.shape == (len(df), len(cols)), f"{what}: {rows.shape} rows vs {len(df)} recorded"
    for j, col in enumerate(cols):
        if col in NONDETERMINISTIC:
            continue
        a = np.ascontiguousarray(rows[:, j])
        b = np.ascontiguousarray(df[col].to_numpy(dtype=np.float64))
        bad = np.flatnonzero(a.view(np.uint64) != b.view(np.uint64))
        assert bad.size == 0, f"{what}: column {col} differs first at row {bad[0]}: {a[bad[0]]!r} != {b[bad[0]]!r}"


def assert_same_rows(spec, a: np.ndarray, b: np.ndarray, what: str) -> None:
    cols = columns_for(spec)
    for j, col in enumerate(cols):
        if col in NONDETERMINISTIC:
            continue
        bad = np.flatnonzero(np.ascontiguousarray(a[:, j]).view(np.uint64) != np.ascontiguousarray(b[:, j]).view(np.uint64))
        assert bad.size == 0, f"{what}: column {col} differs first at row {bad[0]}: {a[bad[0], j]!r} != {b[bad[0], j]!r}"


def column(spec, rows: np.ndarray, name: str) -> np.ndarray:
    return rows[:, columns_for(spec).index(name)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("plant", list(PLANTS))
def test_every_mode_records_the_same_run(plant, case, tmp_path):
    from hil.gym.env import HilEnv

    cell = Case(plant, case, tmp_path)
    probe = HilEnv(cell.scenario())
    spec, names = probe.model.spec, probe.action_names
    actions = _actions(probe, cell.n, seed=11)
    del probe

    gym_rows = run_gym(cell, actions)
    assert np.isfinite(column(spec, gym_rows, f"x.{spec.states[0].name}")).all()
    # the case is what it says: the gaps, the residual model, the fault each change the run
    if case == "gaps":
        y = np.stack([column(spec, gym_rows, f"y.{o}") for o in spec.names("outputs")], 1)
        meas = np.stack([column(spec, gym_rows, f"meas.{o}") for o in spec.names("outputs")], 1)
        assert not np.array_equal(y, meas, equal_nan=True)
    if case == "residual":
        state = PLANTS[plant][2][0]
        plain = run_gym(cell, actions, correction=False)
        assert not np.array_equal(column(spec, gym_rows, f"x.{state}"), column(spec, plain, f"x.{state}"))
    if case == "fault":
        sig = f"app.{cell.fault['signal']}"
        unfaulted = run_gym(cell, actions, fault=False)
        assert not np.array_equal(column(spec, gym_rows, sig), column(spec, unfaulted, sig))

    df = run_runtime(cell, actions, names, tmp_path / "rec")
    assert_same_recording(spec, gym_rows, df, "gym vs runtime lockstep")
    if case != "fault":  # the vector env takes no hooks (module docstring)
        assert_same_rows(spec, run_vector(cell, actions), gym_rows, "vector instance 0 vs gym")
    dfc = run_campaign(cell, actions, names, tmp_path / "campaign")
    assert_same_recording(spec, gym_rows, dfc, "gym vs campaign worker")


def test_gym_with_a_residual_model_equals_hil_run_lockstep(tmp_path):
    """The issue's reproduction: the bioreactor with [plant] residual_model, 300 steps, the same
    commands, through the `hil run --lockstep` command line and through the gym env. They used
    to part (co2 0.494275 vs 0.510944, the env's value the one without the model); now every
    column is the same, and the model moves co2 away from the run without it."""
    import subprocess
    import sys

    cell = Case("bioreactor", "residual", tmp_path)
    cell.n = 300
    cell.gym_data["loop"]["duration_s"] = 300 * cell.step_s
    from hil.gym.env import HilEnv

    probe = HilEnv(cell.scenario())
    spec, names = probe.model.spec, probe.action_names
    actions = _actions(probe, cell.n, seed=5)
    del probe
    gym_rows = run_gym(cell, actions)
    plain_rows = run_gym(cell, actions, correction=False)
    rec = tmp_path / "cli-rec"
    res = subprocess.run([sys.executable, "-m", "hil.cli", "run", str(cell.runtime_file(actions, names)), "--lockstep",
                          "--record", str(rec), "--quiet", "--json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    df = read_recording(rec)
    assert_same_recording(spec, gym_rows, df, "gym vs hil run --lockstep")
    co2, co2_plain = column(spec, gym_rows, "x.co2")[-1], column(spec, plain_rows, "x.co2")[-1]
    assert abs(co2 - co2_plain) > 1e-3, (co2, co2_plain)
