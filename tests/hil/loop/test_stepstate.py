"""hil/loop/stepstate.py: the specialised fused step called through a StepState (one object
unboxed per call) is the step called with its 33 arguments, bit for bit, and the StepState
references the instance's arrays (a command written into u_cmd between steps is applied)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hil.loop.plant import scenario_plant
from hil.loop.step import LoopStep
from hil.scenario.config import load_scenario

ROOT = Path(__file__).resolve().parents[3]
N = 200


def _loop_step():
    sc = load_scenario(ROOT / "configs" / "bioreactor.toml", {"gaps": {"enabled": False}})
    plant = scenario_plant(sc)
    ls = LoopStep(plant, None, None, step_s=sc.loop.step_s, seed=sc.loop.seed)
    ls.u_cmd[:] = plant.u
    return plant, ls


def _commands(ls) -> np.ndarray:
    rng = np.random.default_rng(7)
    return ls.u_lo + (ls.u_hi - ls.u_lo) * rng.random((N, ls.u_cmd.size))


def test_state_path_equals_the_argument_path_bit_for_bit():
    plant, ls = _loop_step()
    snap = plant.snapshot()
    cmds = _commands(ls)
    ls.sync_in()
    rows_state = np.empty((N, ls.row.size))
    for k in range(N):
        ls.u_cmd[:] = cmds[k]  # written into the bound array: the StepState must see it
        ls.step(k, 1000 + k, 0.5 * k)
        rows_state[k] = ls.row
    assert ls._state is not None, "the specialised step was not bound to a StepState"

    plant.restore(snap)
    ls.sync_in()
    ls.counts[:] = 0
    kern, args = ls.kern, list(ls._fused_args(0, 0, 0.0))  # the same arrays, as 33 arguments
    rows_args = np.empty_like(rows_state)
    for k in range(N):
        ls.u_cmd[:] = cmds[k]
        args[0], args[-2], args[-1] = k, 1000 + k, 0.5 * k
        kern.row_step(*args)
        rows_args[k] = ls.row
    assert np.array_equal(rows_state.view(np.uint64), rows_args.view(np.uint64))
    assert np.any(rows_state[:, 4] != rows_state[0, 4])  # the commands varied (cmd columns follow step, t, wall, late)


def test_rebind_takes_a_replaced_array():
    plant, ls = _loop_step()
    ls.step(0)
    first = ls._state
    ls.row = np.zeros_like(ls.row)  # replaced, not written into
    ls.rebind()
    ls.step(1)
    assert ls._state is not first and ls.row[0] == 1.0  # the new row array got step 1
