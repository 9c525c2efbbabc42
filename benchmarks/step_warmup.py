"""The loop step's warm-up in a fresh process (`LoopStep.warm_up`: compile or load from Numba's
cache the fused and the staged step), this checkout against another (`--before`).

What changed it: the fused step used to take the plant's kernels as arguments, which Numba
cannot cache (numba/numba#2956), so every process compiled it; it is now written per plant
(hil/loop/specialize.py) and cached. Both sides: fresh interpreters with the checkout first on
PYTHONPATH, the same interpreter and scenario, Numba caches warm on both (one untimed launch
each first), launches interleaved and rotated, >= 3 repeats, wall seconds of `warm_up()` alone
(imports and the plant's build are outside the timer on both sides), median with min/max. The
load average is printed with the figures. Ratio: before / after (> 1: this checkout is faster).

Usage: python benchmarks/step_warmup.py --before DIR [--configs configs/bioreactor.toml,...]
       [--repeats 3]. Last stdout line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import sys, time
from hil.scenario.config import load_scenario
from hil.loop.plant import scenario_plant
from hil.loop.step import LoopStep
sc = load_scenario(sys.argv[1])
plant = scenario_plant(sc)
ls = LoopStep(plant, None, None, step_s=sc.loop.step_s)
t = time.perf_counter()
ls.warm_up()
print(time.perf_counter() - t)
"""


def launch(checkout: Path, config: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, "-c", PROBE, str(checkout / config)], cwd=checkout, env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the other checkout of hil (e.g. a git worktree)")
    ap.add_argument("--configs", default="configs/bioreactor.toml,configs/panda.toml")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.repeats < 3:
        raise SystemExit("--repeats: at least 3")
    sides = {"before": Path(args.before).resolve(), "after": ROOT}
    out: dict = {"load_average": os.getloadavg(), "repeats": args.repeats, "configs": {}}
    for cfg in args.configs.split(","):
        for path in sides.values():
            launch(path, cfg)  # warm Numba's caches on both sides
        times: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(args.repeats):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for k in order:
                times[k].append(launch(sides[k], cfg))
        summ = {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": [round(x, 3) for x in v]}
                for k, v in times.items()}
        summ["ratio_before_over_after"] = summ["before"]["median"] / summ["after"]["median"]
        out["configs"][cfg] = summ
        print(f"{cfg}: warm_up before {summ['before']['median']:.2f} s, after {summ['after']['median']:.2f} s "
              f"({summ['ratio_before_over_after']:.1f}x)", file=sys.stderr)
    out["load_average_end"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
