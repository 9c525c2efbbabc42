"""Campaign -> runs: every scenario x every fault that applies to it x every seed.

A run id is `<scenario>.<fault>.s<seed>`: stable across restarts (resume skips the ids that
have a result) and enough for `hil campaign replay RUN_ID`. Everything random in a run
follows from its seed: the scenario's loop.seed (gaps, randomization) is set to it, and a
fault start given as [low, high] is drawn from (seed, fault name) (crc32, not Python's
salted hash, so the draw is the same in every process).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass

import numpy as np

from hil.campaign.schema import Campaign, applies


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    scenario: str
    fault: str
    seed: int
    start_s: float
    duration_s: float  # the fault's, simulated s (inf = to the end)
    run_duration_s: float | None  # simulated s of the run (None: the scenario's loop.duration_s)
    canary: str = ""  # a known-bad run ([canaries.<name>]): it must fail; fault = "canary.<name>"

    def as_dict(self) -> dict:
        return asdict(self)


def fault_start(fault: dict, name: str, seed: int, scenario: str | None = None) -> float:
    """The fault's start in simulated s for one seed: start_s as given, or drawn from [low, high];
    a table {scenario: start} gives each scenario its own (schema.py checks every one is there)."""
    st = fault.get("start_s", 0.0)
    if isinstance(st, dict):
        st = st[scenario]
    if isinstance(st, list):
        rng = np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(name.encode())])
        return float(rng.uniform(st[0], st[1]))
    return float(st)


def expand(c: Campaign, canaries: bool = True) -> list[RunSpec]:
    """Every run: scenario x fault x seed, then the canaries (scenario.canary.<name>.s<seed>)."""
    runs = []
    for ref in c.scenarios:
        dur = ref.duration_s or c.campaign.duration_s
        for fname, f in c.faults.items():
            if not applies(f, ref.name):
                continue
            for seed in c.seed_list():
                runs.append(RunSpec(f"{ref.name}.{fname}.s{seed}", ref.name, fname, int(seed),
                                    fault_start(f, fname, seed, ref.name), float(f.get("duration_s", math.inf)), dur))
    if canaries:
        by_name = {ref.name: ref for ref in c.scenarios}
        for cname, cn in c.canaries.items():
            ref = by_name[cn.scenario]
            dur = ref.duration_s or c.campaign.duration_s
            fname = f"canary.{cname}"
            for seed in c.canary_seeds(cname):
                runs.append(RunSpec(f"{ref.name}.{fname}.s{seed}", ref.name, fname, int(seed),
                                    fault_start(cn.fault, fname, seed, ref.name), float(cn.fault.get("duration_s", math.inf)),
                                    dur, canary=cname))
    return runs


def find_run(c: Campaign, run_id: str) -> RunSpec:
    for r in expand(c):
        if r.run_id == run_id:
            return r
    raise KeyError(run_id)
