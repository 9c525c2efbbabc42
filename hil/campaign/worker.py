"""One campaign run: scenario + fault + seed -> recording -> criteria -> result JSON.

    result = execute_run(campaign, run_spec, out_dir)      # in a worker process

The run's directory is `<out>/runs/<run_id>/` (recording in `rec/`, the safety's decision log,
the SoftPLC log in real time); the result is `<out>/results/<run_id>.json`, written atomically
last, so a run without a result file is not done (resume runs it again from scratch).

The result holds: the run spec, the fault window (steps and s), the run summary's essentials,
per criterion {"status": "pass" | "fail" | "n/a", "value", "detail"}, the interventions seen
(safety clips, fallbacks, rollbacks, the loop's watchdog), the plotted signals downsampled,
and `digest`: sha256 of every deterministic column of the recording (all but wall_ns and
lateness_us), which `hil campaign replay` compares bit for bit, and `phases_s`: where the
run's wall time went (PhaseClock: setup, helper start, loop, helper stop, criteria), and
`warm`: what the run reused from its worker (hil/campaign/warm.py; `processes`: kept policy
and safety processes reset for the run, or spawned, and why, hil/campaign/warm_procs.py).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from hil.atomic import write_json_atomic
from hil.campaign.expand import RunSpec
from hil.campaign.digest import NONDETERMINISTIC, recording_digest  # noqa: F401  (re-exported)
from hil.campaign.schema import Campaign, controller_of, decimate_of, load_scenario_ref
from hil.scenario.ports import check_ports, with_free_ports

FORK_HELPERS = False  # set in the local pool's warm workers: lockstep runs fork their recorder (no re-import)
WARM_POLICY_CACHE = False  # set in the local pool's warm workers: policy runs get the worker's Numba cache
#                            (hil/campaign/warm.py) instead of compiling the policy's kernel per run
WARM_PROCESSES = False  # set in the local pool's warm workers: lockstep policy runs reuse this worker's
#                         policy and safety processes, reset per run (hil/campaign/warm_procs.py)
_KEEPER = None  # this worker's ProcessKeeper, made on its first policy run
FULL_GC_EVERY_RUNS = 16  # a warm worker's full garbage collection: once per this many runs (see heap_frozen)
_runs_since_full_gc = 0


def heap_frozen() -> None:
    """Before a run in a warm worker: the worker's heap (imports, Numba dispatchers, pyarrow,
    what earlier runs left) moved to the permanent generation (gc.freeze), so the loop's own
    collection before its first step (hil/loop/gc.py LoopGc.begin, a full one) traverses only
    the objects this run made. Without it, every run paid a full collection of the whole worker
    heap (0.36 s CPU per run measured at load ~5 on 2 cores, cProfile of a policy run: a tenth
    of its loop process's CPU). The loop unfreezes at its end, so cyclic garbage of earlier runs
    is collected here by a real full collection every FULL_GC_EVERY_RUNS runs (memory bounded by
    that many runs' garbage). Collection timing changes no recorded value: digests are equal."""
    import gc

    global _runs_since_full_gc
    _runs_since_full_gc += 1
    if _runs_since_full_gc >= FULL_GC_EVERY_RUNS:
        _runs_since_full_gc = 0
        gc.collect()
    gc.freeze()


def process_keeper():
    """This worker's ProcessKeeper (made once; its processes stopped when the worker exits)."""
    global _KEEPER
    if _KEEPER is None:
        import atexit

        from hil.campaign.warm_procs import ProcessKeeper

        _KEEPER = ProcessKeeper(seed_numba_cache=WARM_POLICY_CACHE)
        atexit.register(_KEEPER.close)
    return _KEEPER


class RunInterrupted(Exception):
    """The run was stopped from outside (Ctrl-C in the driver): no result, it runs again on resume."""


def run_paths(out_dir: Path, run_id: str) -> tuple[Path, Path]:
    return Path(out_dir) / "runs" / run_id, Path(out_dir) / "results" / f"{run_id}.json"


SERVER_SECTIONS = ("modbus", "opcua", "iec104")


def _extra_overrides(c: Campaign, run: RunSpec, run_dir: Path, ipc_dir: str, sc0, ports: list[int]) -> dict:
    """ports: one per server section of sc0 (real time; empty in lockstep)."""
    extra: dict = {"loop": {"seed": int(run.seed)},
                   "recording": {"decimate": decimate_of(c, run), "enabled": True}}
    servers = [s for s in SERVER_SECTIONS if sc0.served(s) is not None]  # a switched-off one binds nothing
    for section, port in zip(servers, ports):  # every run its own ports: parallel runs never collide
        extra[section] = {"port": port}
    if sc0.bus is not None:
        extra["bus"] = {"transport": "ipc", "ipc_dir": ipc_dir}
    if sc0.safety is not None:
        extra["safety"] = {"decision_log": str(run_dir / "safety-decisions.jsonl"),
                           "status_path": str(run_dir / "safety-status.json")}
        if str(c.fault_def(run.fault).get("kind", "")).startswith("safety_"):
            # the fault kills the safety on purpose and the criteria measure what the loop does
            # next: the run goes on under the loop's fallback (the safety_died alarm and
            # dead_processes still show), instead of stopping with exit 8 ([safety] required)
            extra["safety"]["required"] = False
    return extra


def build_stage(c: Campaign, run: RunSpec, runtime, controller: str, rt_ctl=None):
    """The FaultStage for this run (and the lockstep PLC when the controller is the SoftPLC)."""
    from hil.campaign.faults import build_fault, check_fault
    from hil.campaign.plc import LockstepPlc
    from hil.campaign.stage import FaultStage
    from plants.base import load_plant_module

    module = load_plant_module(runtime.scenario.plant.model)
    f = c.fault_def(run.fault)
    args = check_fault(f, f"faults.{run.fault}", runtime.spec, module)
    faults = []
    if f.get("kind") != "none":
        faults.append(build_fault(run.fault, f["kind"], args, run.start_s, run.duration_s, f.get("shape", "step"),
                                  runtime.spec, module, runtime.step_s))
    stop_after = float(f.get("stop_after_s", math.inf))
    stop_at_k = None
    if faults and math.isfinite(stop_after) and faults[0].end_k < 1 << 60:
        stop_at_k = faults[0].end_k + int(round(stop_after / runtime.step_s))
    plc = rt_ctl
    if controller == "softplc" and runtime.lockstep:
        plc = LockstepPlc(runtime.scenario, runtime.spec, runtime.image, runtime.y_meas, runtime.step_s)
    return FaultStage(faults, runtime.plant, runtime.n_steps, runtime.step_s, run.seed, stop_at_k=stop_at_k,
                      plc=plc, request_stop=runtime.request_stop, y_served=runtime.y_meas,
                      external=rt_ctl.external if rt_ctl is not None else None), args


class PhaseClock:
    """Wall-time marks of one run (time.monotonic, s): configured (scenario loaded, Runtime
    built), started (helpers up: recorder, servers, policy and safety; Runtime.run's
    on_started), stopping (the loop ended; on_stopping), stopped (helpers stopped, the summary
    written), evaluated (criteria done)."""

    def __init__(self):
        self.t = {"begin": time.monotonic()}

    def mark(self, name: str) -> None:
        self.t[name] = time.monotonic()

    def phases(self) -> dict:
        """{"setup_s", "start_s", "loop_s", "stop_s", "criteria_s"}: the spans between marks (only
        those whose two marks were reached)."""
        spans = (("setup_s", "begin", "configured"), ("start_s", "configured", "started"),
                 ("loop_s", "started", "stopping"), ("stop_s", "stopping", "stopped"),
                 ("criteria_s", "stopped", "evaluated"))
        return {k: round(self.t[b] - self.t[a], 4) for k, a, b in spans if a in self.t and b in self.t}


def _chain(first, clock: PhaseClock, mark: str):
    def call(runtime) -> None:
        clock.mark(mark)
        if first is not None:
            first(runtime)
    return call


def execute_run(c: Campaign, run: RunSpec, out_dir: str | Path, *, realtime: bool | None = None,
                keep_recording: bool = True) -> dict:
    """Run one spec to its result dict (also written to results/<run_id>.json)."""
    from hil.campaign.criteria import evaluate
    from hil.runtime import Runtime

    out_dir = Path(out_dir)
    run_dir, result_path = run_paths(out_dir, run.run_id)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a run interrupted before its result: start it over
    run_dir.mkdir(parents=True)
    realtime = (c.campaign.mode == "realtime") if realtime is None else realtime
    ref = next(s for s in c.scenarios if s.name == run.scenario)
    t_wall = time.monotonic()
    clock = PhaseClock()
    warm = {"fork_helpers": bool(FORK_HELPERS and not realtime), "policy_numba_cache": False}
    ipc_dir = None
    keeper = None
    env_set: list[str] = []
    # this run's stderr (and that of the processes it starts: policy, safety) to a file of its own
    log_fd = os.open(run_dir / "stderr.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    saved_fd = os.dup(2)
    os.dup2(log_fd, 2)
    from hil import recorder as _recorder

    _recorder.START_METHOD = "fork" if (FORK_HELPERS and not realtime) else "spawn"
    try:
        sc0 = load_scenario_ref(c, ref)  # as declared: the safety envelope criteria hold runs to it
        if WARM_PROCESSES and not realtime and sc0.bus is not None and sc0.policy is not None:
            from hil.safety import launch

            keeper = process_keeper()  # its bus directory: the kept processes' sockets have fixed paths
            ipc_dir = keeper.ipc_dir
            launch.KEEPER = keeper
        else:
            ipc_dir = tempfile.mkdtemp(prefix="hilc-")
        if keeper is None and WARM_POLICY_CACHE and sc0.bus is not None and sc0.policy is not None:
            from hil.campaign.warm import seed_policy_cache

            warm["policy_numba_cache"] = seed_policy_cache(ipc_dir, sc0.policy)

        def configure(ports: list[int]):
            extra = _extra_overrides(c, run, run_dir, ipc_dir, sc0, ports)
            if run.canary:  # a known-bad run: its overrides (e.g. the wrapper's envelope opened) on top
                from hil.scenario.config import _deep_merge
                from hil.campaign.schema import scenario_overrides

                over = scenario_overrides(c.canaries[run.canary])
                _deep_merge(over, extra)
                extra = over
            sc = load_scenario_ref(c, ref, extra=extra)
            if realtime:  # a port taken since it was chosen: fresh ones (hil/scenario/ports.py)
                check_ports(sc, servers=True, bus=False)
            return sc

        n_ports = sum(sc0.served(s) is not None for s in SERVER_SECTIONS) if realtime else 0
        sc = with_free_ports(configure, n_ports)
        controller = controller_of(ref, sc)
        runtime = Runtime(sc, lockstep=not realtime, duration_s=run.run_duration_s, record=True,
                          record_path=str(run_dir / "rec"), start_servers=realtime,
                          scenario_path=str(c.resolve(ref.file)))
        fault_cfg = c.fault_def(run.fault)
        kind = fault_cfg.get("kind", "none")
        rt_ctl = None
        if realtime:
            from hil.campaign.realtime import RealtimeControl

            rt_ctl = RealtimeControl(sc, run, run_dir, kind, {k: v for k, v in fault_cfg.items()}, controller)
        stage, args = build_stage(c, run, runtime, controller, rt_ctl)
        if rt_ctl is not None:
            rt_ctl.args = args
        runtime.hooks = stage
        if kind.startswith(("policy_", "safety_")) and not (realtime and kind == "policy_hang"):
            from hil.campaign.process_faults import ProcessFault

            pf = ProcessFault("policy" if kind.startswith("policy_") else "safety", kind, run.start_s,
                              run.start_s + run.duration_s, args)
            key, val = pf.to_env()
            os.environ[key] = val
            env_set.append(key)
        clock.mark("configured")
        if FORK_HELPERS or WARM_PROCESSES:  # a warm worker (local pool, Ray): its heap out of the run's collections
            heap_frozen()
        with runtime:
            summary = runtime.run(on_started=_chain(rt_ctl and rt_ctl.started, clock, "started"),
                                  on_stopping=_chain(rt_ctl and rt_ctl.stopping, clock, "stopping")).as_dict()
        clock.mark("stopped")
        if summary.get("stop_reason") == "stop requested" and not stage.stopped_run:
            raise RunInterrupted(run.run_id)
        extra_info = rt_ctl.info() if rt_ctl is not None else {}
        if stage.plc is not None and hasattr(stage.plc, "scans"):
            extra_info["plc_scans"] = stage.plc.scans
        result = evaluate(c, run, sc, runtime, summary, stage, run_dir, extra_info, sc_declared=sc0)
        clock.mark("evaluated")
    except RunInterrupted:
        raise
    except Exception as exc:  # noqa: BLE001  (a run that cannot run is a failed run, with the reason)
        import traceback

        result = {"run": run.as_dict(), "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc(limit=8), "criteria": {}, "verdict": "error"}
    finally:
        os.dup2(saved_fd, 2)
        os.close(saved_fd)
        os.close(log_fd)
        for key in env_set:
            os.environ.pop(key, None)
        if keeper is not None:
            from hil.safety import launch

            launch.KEEPER = None
            warm["processes"] = dict(keeper.last)
            warm["policy_numba_cache"] = bool(keeper.numba_cache)
        elif ipc_dir is not None:
            shutil.rmtree(ipc_dir, ignore_errors=True)
    result["wall_s"] = round(time.monotonic() - t_wall, 3)
    result["phases_s"] = clock.phases()
    result["warm"] = warm  # what this run reused from its worker (hil/campaign/executors.py, warm.py)
    result["worker_pid"] = os.getpid()
    if not keep_recording:
        shutil.rmtree(run_dir / "rec", ignore_errors=True)
    write_result(result_path, result)
    return result


def write_result(path: Path, result: dict) -> None:
    write_json_atomic(path, result, default=_json_default)


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)
