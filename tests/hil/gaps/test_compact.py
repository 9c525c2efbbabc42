"""hil/gaps/compact.py: the shared-parameter layout of N instances' gaps gives exactly (bit for
bit) what each instance's own GapPipeline arena gives, with parameters drawn per episode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hil.gaps.compact import CompactGaps, actuate_compact, load_drawn, sense_compact
from hil.gaps.pipeline import _actuate, _sense
from hil.scenario.config import load_scenario
from hil.gaps import GapPipeline
from plants.base import Plant

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "bioreactor_gym.toml"  # every gap kind, randomized sensor/actuator/latency fields


def _template(seed: int = 1):
    sc = load_scenario(CONFIG)
    plant = Plant.from_name("bioreactor")
    return GapPipeline.build(sc.gaps, plant.spec, sc.loop.step_s, seed), plant, sc.loop.step_s


def test_compact_layout_is_each_instances_arena_bit_for_bit():
    g, plant, step_s = _template()
    n = 5
    cg = CompactGaps(g, n)
    groups = {grp for grp, _ in cg.drawn_rows}
    assert groups == {"sensors", "actuators", "observation"}  # bioreactor_gym draws these
    arenas, drawn = [], []
    for i in range(n):  # each instance its own seed and episode, as HilVectorEnv does
        g.seed = g.plant_randomizer.seed = 100 + i
        p = plant.p.copy()
        g.reset(i % 2)
        drawn.append(g.randomize(p, i % 2))
        cg.load(i)
        arenas.append((g._act_buf.copy(), g._sense_buf.copy()))
    # the draws differ between instances, so the swapped-in rows matter
    keys = [k for k in drawn[0] if k.startswith("gaps.")]
    assert keys and all(len({d[k] for d in drawn}) == n for k in keys)
    sp = cg.SP[0]
    nd = len(cg.drawn_rows)
    rng = np.random.default_rng(0)
    n_u, n_y = plant.spec.n_inputs, plant.spec.n_outputs
    lo, hi = plant.spec.lows("inputs"), plant.spec.highs("inputs")
    for k in range(400):
        t = k * step_s
        for i in range(n):  # interleaved instances: the shared buffer serves each in turn
            u = rng.uniform(lo, np.minimum(hi, lo + 100.0))
            y = rng.normal(10.0, 3.0, n_y)
            ua1, ua2 = np.zeros(n_u), np.zeros(n_u)
            ym1, ym2 = np.zeros(n_y), np.zeros(n_y)
            _actuate(arenas[i][0], t, u, ua1)
            _sense(arenas[i][1], t + step_s, y, ym1)
            rec = cg.REC[i]
            load_drawn(sp, rec, cg.DV)
            actuate_compact(sp, cg.HS, rec, cg.HR, nd, t, u, ua2)
            sense_compact(sp, cg.HS, rec, cg.HR, nd, t + step_s, y, ym2)
            np.testing.assert_array_equal(ua2, ua1, err_msg=f"u_applied, instance {i}, step {k}")
            np.testing.assert_array_equal(ym2, ym1, err_msg=f"y_meas, instance {i}, step {k}")


def test_load_refuses_a_parameter_the_randomization_does_not_draw():
    g, plant, _ = _template()
    cg = CompactGaps(g, 2)
    cg.load(0)
    g.sensors.P[g.spec.index("outputs", "temperature"), 2] += 1.0  # bias of an undrawn sensor
    with pytest.raises(ValueError, match="not drawn"):
        cg.load(1)


def test_prefetch_plans_point_at_the_records_state_and_rings():
    g, _, _ = _template()
    cg = CompactGaps(g, 3)
    hot, ring_a, ring_o = cg.plans()
    d, o = g.actuation, g.observation
    assert hot.tolist() == [[0, cg.hot_items]]
    # every state array and drawn row lies in the hot range; the rings after it, on line starts
    n_hot = len(cg.state_arrays) + len(cg.drawn_rows)
    assert cg._rec_off[n_hot] == cg.hot_items and cg.hot_items % 8 == 0
    for line, ring, k in ((d, ring_a, n_hot), (o, ring_o, n_hot + 2)):
        assert ring.tolist() == [cg._rec_off[3 if line is d else 5], line.L.shape[0], cg._rec_off[k], line.m,
                                 cg._rec_off[k + 1], line.V.shape[1]]
    # the record is smaller than the two arenas by the shared tables and headers
    assert cg.REC.shape[1] < g._act_buf.size + g._sense_buf.size
    shared = g.actuators.P.size + g.sensors.P.size + d.L.size + o.L.size
    assert cg.hot_items < shared  # per-instance hot data: less than the tables it no longer copies
