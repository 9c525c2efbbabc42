"""hil/loop/specialize.py: the loop step written per plant (so that Numba caches it) is the
generic step bit for bit, a second process loads it from the cache instead of compiling it,
and kernels that cannot be imported by name get the generic step."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hil.loop import specialize
from hil.loop.step import LoopStep
from tests.hil.safety.helpers import ROOT

PROBE = """
import json, sys
from hil.scenario.config import load_scenario
from hil.loop.plant import scenario_plant
from hil.loop.step import LoopStep
sc = load_scenario(sys.argv[1])
plant = scenario_plant(sc)
ls = LoopStep(plant, None, None, step_s=sc.loop.step_s)
ls.u_cmd[:] = plant.u
ls.step(0)
print(json.dumps({"cached": ls.kern.cached, "hits": sum(ls.kern.row_step.stats.cache_hits.values()),
                  "misses": sum(ls.kern.row_step.stats.cache_misses.values())}))
"""


def _plant(config):
    from hil.scenario.config import load_scenario
    from hil.loop.plant import scenario_plant

    sc = load_scenario(ROOT / "configs" / config)
    return sc, scenario_plant(sc)


def _rows(config, n, monkeypatch=None):
    sc, plant = _plant(config)
    ls = LoopStep(plant, None, None, step_s=sc.loop.step_s)
    rng = np.random.default_rng(5)
    lo, hi = plant.spec.lows("inputs"), plant.spec.highs("inputs")
    out = []
    for k in range(n):
        ls.u_cmd[:] = lo + (hi - lo) * rng.uniform(0.2, 0.8, lo.size)
        ls.step(k)
        out.append(ls.row.copy())
    return np.array(out), ls


@pytest.mark.parametrize("config", ["bioreactor.toml", "panda.toml"])
def test_specialised_step_is_the_generic_step_bit_for_bit(config, monkeypatch):
    fast, ls = _rows(config, 50)
    assert ls.kern.cached and ls.kern.prefix == ()
    from hil.loop import step

    monkeypatch.setattr(step, "specialised", lambda model: None)  # the generic kernels
    slow, ls2 = _rows(config, 50)
    assert not ls2.kern.cached
    assert np.array_equal(fast.view(np.uint64), slow.view(np.uint64))


def test_a_second_process_loads_the_step_from_the_cache(tmp_path):
    env = {**os.environ, "HIL_CACHE_DIR": str(tmp_path / "cache")}
    cfg = str(ROOT / "configs" / "bioreactor.toml")
    runs = [json.loads(subprocess.run([sys.executable, "-c", PROBE, cfg], env=env, cwd=ROOT, check=True,
                                      capture_output=True, text=True).stdout.strip().splitlines()[-1])
            for _ in range(2)]
    assert runs[0]["cached"] and runs[0]["misses"] >= 1  # compiled, written
    assert runs[1]["hits"] >= 1 and runs[1]["misses"] == 0, runs  # loaded, not compiled
    written = list((tmp_path / "cache" / "loop_steps").glob("step_*.py"))
    assert len(written) == 1 and "plants.bioreactor" in written[0].read_text()


def test_kernels_not_importable_by_name_get_the_generic_step():
    from numba import njit

    @njit
    def local_step(t, x, u, p, dt, n_sub, work):
        return t + dt

    assert specialize.source_for(local_step, local_step, "ode") is None


def test_a_changed_callee_source_gives_a_new_generated_file(tmp_path, monkeypatch):
    """Numba keys a cached function on its own file only: the generated step's text carries a
    hash of the plant package's sources, so an edited plant kernel is never run from a stale
    cache."""
    pkg = tmp_path / "fakeplants"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "kern.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    importlib.import_module("fakeplants.sub.kern")
    before = specialize.sources_digest("fakeplants.sub.kern")
    (pkg / "helpers.py").write_text("Y = 2\n")  # a sibling the kernel may call
    assert specialize.sources_digest("fakeplants.sub.kern") != before
