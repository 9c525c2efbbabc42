"""hil/loop/step.py: the fused path (one compiled call) and the staged path (the same stage
kernels one by one, Python hooks between them) give the same step, bit for bit; the bound
entry point follows a plant kernel replaced after the first step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from hil.loop.step import LoopStep  # noqa: E402
from tests.hil.loop.test_equivalence import SEED, Case, _actions  # noqa: E402


class _NoHooks:
    """Hooks that change nothing: their presence alone selects the staged path."""

    def pre(self, k, t):
        pass

    def actuate(self, k, t, u):
        pass

    def sense(self, k, t_end, y):
        pass


def _rows(cell, hooks) -> np.ndarray:
    from hil.gym.env import HilEnv

    env = HilEnv(cell.scenario())
    env.hooks = hooks
    env.reset(seed=SEED)
    acts = _actions(env, cell.n, seed=2)
    out = np.empty((cell.n, env.row.size))
    for k in range(cell.n):
        env.step(acts[k])
        out[k] = env.row
    return out


@pytest.mark.parametrize("case", ["gaps", "residual"])
def test_fused_and_staged_paths_are_bit_identical(case, tmp_path):
    cell = Case("bioreactor", case, tmp_path)
    fused, staged = _rows(cell, None), _rows(cell, _NoHooks())
    assert np.array_equal(fused.view(np.uint64), staged.view(np.uint64))


def test_a_plant_kernel_replaced_after_the_first_step_is_the_one_called(tmp_path):
    from numba import njit

    from hil.scenario.config import parse_scenario
    from hil.loop.plant import scenario_plant

    cell = Case("bioreactor", "plain", tmp_path)
    plant = scenario_plant(parse_scenario(cell.runtime_data(np.zeros((cell.n, 2)), [])))
    ls = LoopStep(plant, None, None, step_s=cell.step_s)
    ls.u_cmd[:] = plant.u
    assert ls.step(0) == 0
    real = plant.model.step

    @njit
    def frozen(t, x, u, p, dt, n_sub, work):  # time moves, the state does not
        return t + dt

    plant.model = dataclasses.replace(plant.model, step=frozen)
    x1 = plant.x.copy()
    ls.step(1)
    assert np.array_equal(plant.x, x1)
    plant.model = dataclasses.replace(plant.model, step=real)
    ls.step(2)
    assert not np.array_equal(plant.x, x1)
