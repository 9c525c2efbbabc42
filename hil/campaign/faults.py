"""The fault library and the stage the loop calls to inject faults at simulated times.

A fault is one table of a campaign file (hil/campaign/schema.py):

    [faults.<name>]
    kind = "sensor_stuck"     # see KINDS (and the plant's own FAULTS table, below)
    start_s = 3600.0          # simulated s from the run start; or [lo, hi]: drawn per seed (uniform)
    duration_s = 600.0        # simulated s; inf = to the end of the run
    shape = "step"            # "step" (full size at once) or "ramp" (0 -> full size over the window)
    stop_after_s = inf        # end the run this long after the fault ends (terminal faults: the rest
                              # of the run only costs time), simulated s
    ...                       # the kind's own keys (signal, value, gain, ...)

Hooks (hil/runtime.py calls them when `Runtime.hooks` is set; k = step, t = k * step_s):

    hooks.pre(k, t)              top of step k, before the inputs are read from the image:
                                 fault starts and ends, parameter jumps, the lockstep PLC's scan
    hooks.actuate(k, t, u_app)   after the actuator gap, before plant.step: u_app is what the
                                 plant gets (and what the recording's app.<input> shows)
    hooks.sense(k, t_end, y)     after the sensor and observation-latency gaps, before the image
                                 publishes: y is what the PLC, the SCADA and the policy read

Signal names are resolved to indices when the stage is built; per step the stage compares
one integer (the next event's step) and runs only the faults active at that step.

Kinds (signal = a plant output for sensor faults, an input for actuator faults):

    sensor_stuck      value (default: the served value when the fault starts)
    sensor_drift      rate_per_s (units/s; the reading drifts linearly from the fault start)
    sensor_bias       bias (units; "ramp" shape: grows linearly over the window)
    sensor_noise      std (units; white Gaussian, seeded by the run seed)
    sensor_dropout    mode = "bad" (NaN: Bad quality on the wire) | "hold" | "value" (+ value)
    actuator_stuck    value (default: the applied value when the fault starts)
    actuator_degraded gain (applied = gain * u; "ramp": 1 -> gain over the window)
    actuator_saturated low, high (the applied value is clipped into [low, high])
    latency_spike     path = "observation" | "actuation", delay_s (served values that much
                      older, no overtaking: at the start the served value freezes for delay_s)
    jitter_burst      path, max_s: per step an extra delay drawn uniform in [0, max_s]
                      (seeded), no overtaking (a served value is never older than the last)
    param_jump        param, value | factor (x the value at the fault start), restore = true
                      (back at the end of a finite window); "ramp" interpolates
    plc_crash         the SoftPLC stops (its last outputs stay in the image); lockstep: the
                      simulated PLC stops scanning; real time: SIGKILL to its process
    plc_hang          the SoftPLC stops for duration_s, then resumes with its state (real time:
                      SIGSTOP / SIGCONT)
    plc_restart       the SoftPLC stops for duration_s, then restarts from scratch (bumpless
                      from the outputs it reads back)
    policy_crash | policy_hang | policy_nan | policy_wrong_shape | policy_ood | safety_crash
                      in the policy / safety process (hil/campaign/process_faults.py), keyed on
                      the simulated time of the observations they receive
    link_drop | link_delay | link_loss | link_half_open
                      real time only: through the loopback TCP proxy between the SoftPLC and
                      the Modbus server (hil/campaign/proxy.py)
    none              no fault (the baseline column of the matrix)

Plant-contributed kinds: a plant module may define `FAULTS = {name: entry}` (plants import
nothing from hil), each entry a dict with

    "doc":   one line,
    "args":  {key: default},                      # the keys the campaign may set
    "begin": callable(x, p, args) -> saved,       # at the fault start: change state x / params p
    "end":   callable(x, p, args, saved) | None,  # at the end of a finite window
    "each":  callable(x, p, args, frac) | None,   # every step inside the window (frac 0..1)

so a grid plant adds `line_trip`, `generator_trip`, `load_step` without hil/ knowing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hil.errors import ConfigError

SENSOR_KINDS = ("sensor_stuck", "sensor_drift", "sensor_bias", "sensor_noise", "sensor_dropout")
ACTUATOR_KINDS = ("actuator_stuck", "actuator_degraded", "actuator_saturated")
LATENCY_KINDS = ("latency_spike", "jitter_burst")
PLC_KINDS = ("plc_crash", "plc_hang", "plc_restart")
POLICY_KINDS = ("policy_crash", "policy_hang", "policy_nan", "policy_wrong_shape", "policy_ood")
SAFETY_KINDS = ("safety_crash",)
LINK_KINDS = ("link_drop", "link_delay", "link_loss", "link_half_open")
COMMON_KEYS = {"kind", "start_s", "duration_s", "shape", "stop_after_s", "scenarios"}

# the kind's own keys -> default (None: required)
KIND_KEYS: dict[str, dict] = {
    "none": {},
    "sensor_stuck": {"signal": None, "value": math.nan},
    "sensor_drift": {"signal": None, "rate_per_s": None},
    "sensor_bias": {"signal": None, "bias": None},
    "sensor_noise": {"signal": None, "std": None},
    "sensor_dropout": {"signal": None, "mode": "bad", "value": math.nan},
    "actuator_stuck": {"signal": None, "value": math.nan},
    "actuator_degraded": {"signal": None, "gain": None},
    "actuator_saturated": {"signal": None, "low": -math.inf, "high": math.inf},
    "latency_spike": {"path": "observation", "delay_s": None, "signals": []},
    "jitter_burst": {"path": "observation", "max_s": None, "signals": []},
    "param_jump": {"param": None, "value": math.nan, "factor": math.nan, "restore": True},
    "plc_crash": {}, "plc_hang": {}, "plc_restart": {},
    "policy_crash": {}, "policy_hang": {}, "policy_nan": {}, "policy_wrong_shape": {},
    "policy_ood": {"value": math.nan, "factor": 10.0},
    "safety_crash": {},
    "link_drop": {}, "link_delay": {"delay_s": None, "jitter_s": 0.0}, "link_loss": {"probability": None},
    "link_half_open": {},
}
REALTIME_ONLY = set(LINK_KINDS)


def plant_faults(module) -> dict:
    """The fault kinds a plant module contributes (its FAULTS table; {} if none)."""
    table = getattr(module, "FAULTS", None) or {}
    if not isinstance(table, dict):
        raise ValueError(f"plants/{module.__name__.rsplit('.', 1)[-1]}.py: FAULTS must be a dict")
    return table


def known_kinds(module=None) -> list[str]:
    return sorted(set(KIND_KEYS) | set(plant_faults(module) if module is not None else ()))


def check_fault(cfg: dict, path: str, spec, module) -> dict:
    """Validate one fault table (raw dict) against the kind and the plant spec; returns the
    kind's arguments with defaults filled in. Raises ConfigError naming the key."""
    kind = cfg.get("kind")
    extra = plant_faults(module)
    if kind not in KIND_KEYS and kind not in extra:
        raise ConfigError(f"{path}.kind", f"unknown fault kind {kind!r} (known: {', '.join(known_kinds(module))})")
    keys = dict(extra[kind].get("args", {})) if kind in extra else dict(KIND_KEYS[kind])
    args = {}
    for k, v in cfg.items():
        if k in COMMON_KEYS:
            continue
        if k not in keys:
            raise ConfigError(f"{path}.{k}", f"unknown key for a {kind} fault (its keys: "
                              f"{', '.join(sorted(keys)) or 'none'}, and {', '.join(sorted(COMMON_KEYS))})")
        args[k] = v
    for k, default in keys.items():
        if k not in args:
            if default is None:
                raise ConfigError(f"{path}.{k}", f"required for a {kind} fault")
            args[k] = default
    for k, v in args.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isnan(v) and k in cfg:
            raise ConfigError(f"{path}.{k}", "NaN is not a value here")
    kind_out = "outputs" if kind in SENSOR_KINDS else "inputs" if kind in ACTUATOR_KINDS else None
    if kind_out is not None:
        if args["signal"] not in spec.names(kind_out):
            raise ConfigError(f"{path}.signal", f"{spec.name} has no {kind_out[:-1]} {args['signal']!r} "
                              f"(known: {', '.join(spec.names(kind_out))})")
    if kind == "sensor_dropout" and args["mode"] not in ("bad", "hold", "value"):
        raise ConfigError(f"{path}.mode", f"{args['mode']!r}: one of bad, hold, value")
    if kind == "sensor_noise" and not args["std"] >= 0:
        raise ConfigError(f"{path}.std", f"{args['std']} is not a standard deviation (>= 0)")
    if kind == "actuator_saturated" and not args["low"] < args["high"]:
        raise ConfigError(f"{path}", f"low {args['low']} must be below high {args['high']}")
    if kind in LATENCY_KINDS:
        if args["path"] not in ("observation", "actuation"):
            raise ConfigError(f"{path}.path", f"{args['path']!r}: observation or actuation")
        key = "delay_s" if kind == "latency_spike" else "max_s"
        if not (args[key] >= 0 and math.isfinite(args[key])):
            raise ConfigError(f"{path}.{key}", f"{args[key]} is not a delay in seconds (>= 0, finite)")
        names = spec.names("outputs" if args["path"] == "observation" else "inputs")
        for s in args["signals"] or ():
            if s not in names:
                raise ConfigError(f"{path}.signals", f"{spec.name} has no {args['path']} signal {s!r}")
    if kind == "param_jump":
        if args["param"] not in spec.names("params"):
            raise ConfigError(f"{path}.param", f"{spec.name} has no parameter {args['param']!r}")
        if math.isnan(args["value"]) == math.isnan(args["factor"]):
            raise ConfigError(f"{path}", "a param_jump needs exactly one of value, factor")
    if kind == "link_loss" and not 0.0 <= args["probability"] <= 1.0:
        raise ConfigError(f"{path}.probability", f"{args['probability']} is outside 0..1")
    return args


def shape_fraction(shape: str, k: int, start_k: int, end_k: int) -> float:
    """How much of the fault's size acts at step k: 1 for "step", linear 0->1 for "ramp"."""
    if shape == "step" or end_k >= 1 << 60:
        return 1.0
    return min(1.0, (k - start_k + 1) / max(1, end_k - start_k))


# ---------------------------------------------------------------- the faults themselves


@dataclass
class Fault:
    """One fault instance of one run: its window in steps and its arguments."""

    name: str
    kind: str
    args: dict
    start_k: int
    end_k: int  # exclusive; 1 << 62 = never ends
    shape: str = "step"
    hook: str = "none"  # "pre" | "actuate" | "sense" | "none" (handled by begin/end only)
    lead_k: int = 0  # steps before start_k at which the stage arms it (latency rings)
    index: np.ndarray | None = None
    state: dict = field(default_factory=dict)

    def begin(self, st: "FaultStage", k: int) -> None:
        pass

    def end(self, st: "FaultStage", k: int) -> None:
        pass

    def apply(self, st: "FaultStage", k: int, arr: np.ndarray) -> None:
        pass


class SensorFault(Fault):
    def begin(self, st, k):
        i = int(self.index[0])
        a = self.args
        self.state["held"] = st.y_last[i] if math.isnan(a.get("value", math.nan)) else a["value"]
        self.state["t0"] = k * st.step_s
        if self.kind == "sensor_noise":
            self.state["rng"] = np.random.default_rng([st.seed, st.fault_no(self), 11])

    def apply(self, st, k, y):
        i = int(self.index[0])
        kind, a = self.kind, self.args
        if kind == "sensor_stuck":
            y[i] = self.state["held"]
        elif kind == "sensor_drift":
            y[i] += a["rate_per_s"] * ((k + 1) * st.step_s - self.state["t0"])
        elif kind == "sensor_bias":
            y[i] += a["bias"] * shape_fraction(self.shape, k, self.start_k, self.end_k)
        elif kind == "sensor_noise":
            y[i] += a["std"] * shape_fraction(self.shape, k, self.start_k, self.end_k) \
                * self.state["rng"].standard_normal()
        elif kind == "sensor_dropout":
            mode = a["mode"]
            y[i] = math.nan if mode == "bad" else self.state["held"] if mode == "hold" else a["value"]


class ActuatorFault(Fault):
    def begin(self, st, k):
        i = int(self.index[0])
        v = self.args.get("value", math.nan)
        self.state["held"] = st.u_last[i] if math.isnan(v) else v

    def apply(self, st, k, u):
        i = int(self.index[0])
        kind, a = self.kind, self.args
        if kind == "actuator_stuck":
            u[i] = self.state["held"]
        elif kind == "actuator_degraded":
            f = shape_fraction(self.shape, k, self.start_k, self.end_k)
            u[i] *= 1.0 + (a["gain"] - 1.0) * f
        elif kind == "actuator_saturated":
            u[i] = min(max(u[i], a["low"]), a["high"])


class LatencyFault(Fault):
    """Served values come from a ring of past values (no overtaking): armed lead_k steps before
    the start so the ring holds the history the first delayed samples need."""

    def begin(self, st, k):
        n = self.index.size
        self.state["ring"] = np.zeros((self.lead_k + 1, n))
        self.state["served_k"] = self.start_k - 1  # the last value served before the fault
        self.state["armed_k"] = k
        if self.kind == "jitter_burst":
            rng = np.random.default_rng([st.seed, st.fault_no(self), 13])
            span = max(1, self.end_k - self.start_k) if self.end_k < 1 << 60 else st.n_steps + 1
            self.state["draws"] = rng.integers(0, self.lead_k + 1, size=min(span, st.n_steps + 1))

    def apply(self, st, k, arr):
        ring, idx, m = self.state["ring"], self.index, self.lead_k + 1
        ring[k % m] = arr[idx]
        if k < self.start_k:
            return
        if self.kind == "latency_spike":
            d = self.lead_k
        else:
            draws = self.state["draws"]
            d = int(draws[min(k - self.start_k, draws.size - 1)])
        want = max(k - d, self.state["armed_k"], self.state["served_k"])  # never older than the last
        self.state["served_k"] = want
        arr[idx] = ring[want % m]


class ParamJump(Fault):
    def begin(self, st, k):
        i = int(self.index[0])
        old = float(st.plant.p[i])
        a = self.args
        self.state["old"] = old
        self.state["new"] = a["value"] if not math.isnan(a["value"]) else old * a["factor"]
        self.apply(st, k, None)

    def apply(self, st, k, _arr):
        f = shape_fraction(self.shape, k, self.start_k, self.end_k)
        old, new = self.state["old"], self.state["new"]
        st.plant.p[int(self.index[0])] = old + (new - old) * f

    def end(self, st, k):
        if self.args["restore"]:
            st.plant.p[int(self.index[0])] = self.state["old"]


class PlantFault(Fault):
    """A kind from the plant module's FAULTS table."""

    def begin(self, st, k):
        entry = self.state["entry"]
        self.state["saved"] = entry["begin"](st.plant.x, st.plant.p, self.args)

    def apply(self, st, k, _arr):
        f = shape_fraction(self.shape, k, self.start_k, self.end_k)
        self.state["entry"]["each"](st.plant.x, st.plant.p, self.args, f)

    def end(self, st, k):
        end = self.state["entry"].get("end")
        if end is not None:
            end(st.plant.x, st.plant.p, self.args, self.state["saved"])


class PlcFault(Fault):
    def begin(self, st, k):
        if st.plc is not None:
            st.plc.halt()

    def end(self, st, k):
        if st.plc is not None and self.kind != "plc_crash":
            st.plc.resume(restart=self.kind == "plc_restart", k=k)


class ExternalFault(Fault):
    """Injected outside the loop's process (policy, safety, link proxy): the stage hands the
    window's start and end to `FaultStage.external` (real time: hil/campaign/realtime.py);
    policy and safety faults are also keyed on simulated time inside those processes."""

    def begin(self, st, k):
        if st.external is not None:
            st.external(self, True)

    def end(self, st, k):
        if st.external is not None:
            st.external(self, False)


def build_fault(name: str, kind: str, args: dict, start_s: float, duration_s: float, shape: str,
                spec, module, step_s: float) -> Fault:
    """The Fault for one run (window in steps: start at ceil(start_s / step_s))."""
    start_k = int(math.ceil(start_s / step_s - 1e-9))
    end_k = (1 << 62) if not math.isfinite(duration_s) else start_k + max(1, int(round(duration_s / step_s)))
    kw = dict(name=name, kind=kind, args=args, start_k=start_k, end_k=end_k, shape=shape)
    extra = plant_faults(module)
    if kind in extra:
        f = PlantFault(**kw, hook="pre" if extra[kind].get("each") else "none")
        f.state["entry"] = extra[kind]
        return f
    if kind in SENSOR_KINDS:
        return SensorFault(**kw, hook="sense", index=np.array([spec.index("outputs", args["signal"])]))
    if kind in ACTUATOR_KINDS:
        return ActuatorFault(**kw, hook="actuate", index=np.array([spec.index("inputs", args["signal"])]))
    if kind in LATENCY_KINDS:
        group = "outputs" if args["path"] == "observation" else "inputs"
        sigs = args["signals"] or spec.names(group)
        lead = int(math.ceil((args["delay_s"] if kind == "latency_spike" else args["max_s"]) / step_s - 1e-9))
        return LatencyFault(**kw, hook="sense" if group == "outputs" else "actuate", lead_k=lead,
                            index=np.array([spec.index(group, s) for s in sigs], dtype=np.intp))
    if kind == "param_jump":
        return ParamJump(**kw, hook="pre" if shape == "ramp" else "none",
                         index=np.array([spec.index("params", args["param"])]))
    if kind in PLC_KINDS:
        return PlcFault(**kw)
    return ExternalFault(**kw)
