"""[policy] and [safety] sections: which policy runs, and the wrapper operations put around it.

Values are in the plant units of the signal they act on; `_s` keys are simulated seconds.
Signals in expressions are output names (`dissolved_oxygen`) or applied inputs (`u.base_flow`).

    [policy]
    directory = "policies/bioreactor"   # versioned policy directory (v1, v2, ...); relative
    version = "v1"                      #   paths: relative to the scenario file
    entry = ""                          # or "package.module:attribute" (callable / .act(obs))
    onnx = ""                           # or an ONNX model (needs onnxruntime)
    inputs = ["agitation_power", ...]   # actions, in order (default: inputs with driver "bus")
    features = ["dissolved_oxygen", "u.agitation_power"]   # for entry/onnx policies
    launch = true                       # hil run starts the policy and safety processes
    restart = { max_restarts = 3, backoff_s = 1.0 }   # restart a dead/hung policy (default: never)

    [safety]
    mode = "shadow"                     # initial rollout mode: shadow|advisory|limited|full
    decision_log = "runs/{scenario}-{timestamp}-safety.jsonl"
    status_path = ""                    # JSON status file ("" = beside the decision log)
    policy_lost_after_s = 5.0           # sim s without a valid proposal = policy lost (alarm;
                                        # when it answers again: back to shadow); default 5 steps
    required = true                     # a dead safety process stops the run (exit 8), a hung
                                        # one makes it exit 8 at the end; false: alarm only
    hang_s = 5.0                        # wall s without the safety's status heartbeat: hung
    restart = { max_restarts = 2, backoff_s = 0.5 }   # start a dead/hung safety again, resuming
                                        # at no higher a mode than it had (default: never)

    [safety.projection]
    box = { agitation_power = [0.0, 80.0] }       # tighter than the spec's bounds
    rate = { agitation_power = 0.5 }              # max |du/dt|, units per sim s
    [[safety.projection.linear]]                  # a . w <= b0 + sum(b[s] * signal s)
    name = "shear"
    w = { agitation_power = 1.0 }
    b0 = 0.0
    b = { volume = 0.8 }
    [[safety.projection.plant]]                   # rows W(state) a <= b(state) from the plant
    name = "workspace"                            #   module's SAFETY_LIMITS[kind], rebuilt
    kind = "ee_box"                               #   every step (plants/panda.py)
    options = { low = [0.25, -0.4, 0.03], high = [0.75, 0.4, 0.8], horizon_s = 0.1 }

    [safety.confidence]                 # fallback when off-distribution or unsure; every
                                        # check fails closed: a score that cannot be computed
                                        # (no training statistics, a Bad feature, fewer than 2
                                        # members, no members) means "not confident"
    mahalanobis = true                  # false: the operator disables this check explicitly
    disagreement = true                 #   (`hil safety status` shows it disabled)
    consistency = true                  # the proposed action must lie in the members' hull
    consistency_tolerance = 0.01        #   widened by this fraction of each input's scale
    mahalanobis_enter = 6.0             # distance of the features from the training data
    mahalanobis_exit = 4.0
    disagreement_enter = 0.05           # max over actions of std(members) / scale
    disagreement_exit = 0.02
    scale = { agitation_power = 100.0 } # default: each input's span (high - low)
    min_dwell_s = 60.0                  # in fallback at least this long, and exit conditions
                                        # must hold this long before control returns
    single_network = "refuse"           # a proposal without members (one network): disagreement
                                        # and consistency cannot be computed -> fallback; or
                                        # "operator-accepted" for accepted_versions only, those two
                                        # checks then do not apply to it (Mahalanobis must stay on);
    accepted_by = "A. Operator"         #   who, when (ISO 8601 with zone), which versions, why:
    accepted_utc = "2026-12-02T17:00:00Z"   # recorded in the decision log and the status
    accepted_versions = ["v3"]
    accepted_reason = "..."

    [safety.fallback]                   # baseline controller (hil.control.pid.PID loops)
    fixed = { base_flow = 0.0 }         # inputs held at a value
    on_bad = "hold"                     # a loop's measurement is Bad: "hold" the output where
                                        # the actuator is (integral frozen, no windup), or go
    safe_output = { agitation_power = 30.0 }  # to "safe": this value (ramped by the rate limit)
    hold = ["gripper.width_target"]     # inputs held at their applied value
    [[safety.fallback.joint_pd]]        # joint PD holding position (torque inputs, N m)
    inputs = "joint.tau_target"         #   group or element; position / velocity: output
    position = "joint.q"                #   groups; kp (N m/rad), kd (N m s/rad): one or per
    velocity = "joint.dq"               #   joint; gravity = true adds the plant's g(q)
    kp = 600.0
    kd = 50.0
    [[safety.fallback.loops]]
    input = "agitation_power"
    measurement = "dissolved_oxygen"
    setpoint = 40.0
    kp = 0.5                            # input units per measurement unit
    ki = 0.01                           # per (unit s)
    kd = 0.0                            # s
    reverse = false
    on_bad = "safe"                     # per loop, overrides [safety.fallback].on_bad
    bias = 30.0                         # output at zero error
    out_min = 0.0                       # default: the input's bounds
    out_max = 100.0

    [safety.monitor]
    demote_to = "limited"               # mode after a trip (never raises the mode)
    [[safety.monitor.rules]]
    name = "do_low"
    signal = "dissolved_oxygen"
    op = "<"                            # "<" or ">"
    limit = 20.0
    for_s = 30.0                        # continuously, in simulated seconds
    action = "rollback"                 # rollback (+ alarm, demote) | alarm | fallback
    on_bad = "trip"                     # signal Bad (NaN or Bad quality): "trip" at once with
                                        # `action`; or trip at once with "alarm" / "fallback"
                                        # instead; "condition": counts as the condition holding

    [safety.rollout]
    auto_promote = false                # promote as soon as a gate passes
    max_mode = "full"
    limited_max_deviation = { agitation_power = 10.0 }  # limited: baseline +/- this
    limited_box = { agitation_power = [10.0, 60.0] }     # limited: tighter box
    [safety.rollout.gates.shadow]       # gate to leave a mode (shadow, advisory, limited)
    window_s = 600.0                    # KPIs over the last window_s in the current mode
    max_tracking_nrmse = 0.05           # RMS (measurement - setpoint) / span, fallback loops
    max_fallback_rate = 0.05            # fraction of steps the confidence fallback held
    max_silent_rate = 0.01              # fraction of steps the policy did not answer in time
    max_clip_rate = 0.5                 # fraction of steps the projection clipped
    max_action_nrmse = 0.2              # RMS (proposal - baseline) / span
    max_alarms = 0                      # monitor trips
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from hil.scenario.numbers import unlimited
from hil.scenario.config import StrictModel, outside_bounds, resolve_path  # noqa: F401  (resolve_path re-exported)

MODES = ("shadow", "advisory", "limited", "full")
LOST_AFTER_STEPS = 5  # default [safety].policy_lost_after_s, in loop steps
Mode = Literal["shadow", "advisory", "limited", "full"]


def signal_index(spec, name: str) -> tuple[str, int]:
    """('y', index) for an output name, ('u', index) for 'u.<input>'. Raises KeyError."""
    if name.startswith("u."):
        return "u", spec.index("inputs", name[2:])
    if name.startswith("y."):
        name = name[2:]
    return "y", spec.index("outputs", name)


def signal_span(spec, name: str) -> float:
    kind, i = signal_index(spec, name)
    q = (spec.inputs if kind == "u" else spec.outputs)[i]
    return max(q.high - q.low, 1e-12)


class RestartSection(StrictModel):
    """[policy] restart = { max_restarts = 3, backoff_s = 1.0 }: restart a dead or hung policy
    process (hil.safety.launch.PolicySupervisor). Times are wall seconds."""

    max_restarts: int = Field(default=3, ge=0, le=1000, description="restarts per run, at most")
    backoff_s: float = Field(default=1.0, gt=0, le=3600, description="wall s before the first restart; "
                             "doubles with each restart")
    backoff_max_s: float = Field(default=30.0, gt=0, le=3600, description="wall s, cap of the backoff")
    hang_s: float = Field(default=5.0, gt=0, le=3600, description="wall s without a heartbeat (the policy's "
                          "status file, rewritten every 0.5 s) before a live policy process counts as hung")


class SafetyRestartSection(StrictModel):
    """[safety] restart = { max_restarts = 2, backoff_s = 0.5 }: start a dead or hung safety process
    again (hil/safety/watch.py); it resumes in the lower of the configured mode and its
    predecessor's last mode. Times are wall seconds."""

    max_restarts: int = Field(default=2, ge=0, le=1000, description="restarts per run, at most")
    backoff_s: float = Field(default=0.5, gt=0, le=3600, description="wall s before the first restart; "
                             "doubles with each restart")
    backoff_max_s: float = Field(default=30.0, gt=0, le=3600, description="wall s, cap of the backoff")


class PolicySection(StrictModel):
    directory: str = Field(default="", description="versioned policy directory (v1, v2, ...)")
    version: str = Field(default="latest_known_good", description="vN, latest or latest_known_good")
    entry: str = Field(default="", description="module:attribute, a callable or an object with act()")
    onnx: str = Field(default="", description="path of an ONNX model (needs onnxruntime)")
    inputs: list[str] = Field(default_factory=list, description="action inputs, in order")
    features: list[str] = Field(default_factory=list, description="observation features, in order")
    launch: bool = Field(default=True, description="hil run starts the policy and safety processes")
    restart: RestartSection | None = Field(default=None, description="restart a dead or hung policy process; "
                                           "default: never (the safety's baseline holds)")
    uid: int = Field(default=65534, ge=1, le=2**31 - 2, description="when hil runs as root: the unprivileged uid "
                     "(and gid) the policy process runs as, kept out of the run directory (hil/confine.py)")
    rate_hz: float | None = Field(default=None, gt=0, le=100_000, description="proposals per sim s: the policy "
                                  "answers every observation whose step is a multiple of round(1 / (rate_hz * "
                                  "step_s)) loop steps; default every step")
    max_age_s: float | None = Field(default=None, gt=0, le=3600, description="[safety] placement = 'loop': sim s "
                                    "a proposal may act after the observation it answers; older: the shield's "
                                    "fallback acts ('fallback:late'). Default two proposal periods")

    def every_steps(self, step_s: float) -> int:
        """Loop steps between the observations the policy answers (>= 1)."""
        if self.rate_hz is None:
            return 1
        return max(1, int(round(1.0 / (self.rate_hz * step_s))))

    def max_age_steps(self, step_s: float) -> int:
        """The proposal age bound in loop steps (hil/loop/shield.py)."""
        if self.max_age_s is None:
            return 2 * self.every_steps(step_s)
        return max(0, int(math.floor(self.max_age_s / step_s + 1e-9)))

    @model_validator(mode="after")
    def _one_source(self):
        given = [k for k in ("directory", "entry", "onnx") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of directory, entry, onnx (got {given or 'none'})")
        if self.entry and ":" not in self.entry:
            raise ValueError(f"entry {self.entry!r} is not module:attribute")
        return self

    def validate_against(self, spec, scenario) -> list[tuple[str, str]]:
        problems = []
        names = spec.names("inputs")
        for i, n in enumerate(self.inputs):
            if n not in names:
                problems.append((f"policy.inputs[{i}]", f"{spec.name} has no input {n!r}"))
        if len(set(self.inputs)) != len(self.inputs):
            problems.append(("policy.inputs", "names repeat"))
        for i, n in enumerate(self.features):
            try:
                signal_index(spec, n[2:] if n.startswith("d.") else n)
            except KeyError as exc:
                problems.append((f"policy.features[{i}]", str(exc.args[0])))
        from hil.bus.config import action_input_names

        if not action_input_names(scenario, spec):
            problems.append(("policy.inputs", "no action inputs: list them or set driver = 'bus'"))
        if (self.entry or self.onnx) and not self.features:
            problems.append(("policy.features", "an entry or onnx policy needs its feature list"))
        safety = getattr(scenario, "safety", None)
        in_loop = safety is not None and safety.placement == "loop"
        if self.every_steps(scenario.loop.step_s) > 1 and not in_loop:
            problems.append(("policy.rate_hz", "a policy slower than the loop needs the in-loop shield "
                             "(safety.placement = 'loop'): the safety process would decide the other steps "
                             "without a proposal"))
        if self.max_age_s is not None and not in_loop:
            problems.append(("policy.max_age_s", "the proposal age bound is the in-loop shield's "
                             "(safety.placement = 'loop')"))
        if self.rate_hz is not None and 1.0 / self.rate_hz < scenario.loop.step_s * (1 - 1e-9):
            problems.append(("policy.rate_hz", f"{self.rate_hz:g} Hz is faster than the loop "
                             f"({1.0 / scenario.loop.step_s:g} Hz)"))
        return problems


class LinearLimit(StrictModel):
    name: str
    w: dict[str, float] = Field(description="weights per action input")
    b0: float = 0.0
    b: dict[str, float] = Field(default_factory=dict, description="b(state) coefficients per signal")


class PlantLimit(StrictModel):
    """[[safety.projection.plant]]: state-dependent linear limits the plant module provides
    (`SAFETY_LIMITS[kind]`), weights and bound rebuilt from the observation every step."""

    name: str
    kind: str = Field(description="a limit family of the plant module (plants/panda.py: ee_box, ...; "
                      "plants/grid: line_rating)")
    options: dict = Field(default_factory=dict, description="the family's options (plant units)")


class ProjectionSection(StrictModel):
    box: dict[str, tuple[float, float]] = Field(default_factory=dict)
    rate: dict[str, float] = Field(default_factory=dict, description="units per sim s")
    linear: list[LinearLimit] = Field(default_factory=list)
    plant: list[PlantLimit] = Field(default_factory=list, description="state-dependent rows from the plant")
    max_iter: int = Field(default=200, ge=1, le=10_000, description="Dykstra iterations, >1 limit")


class ConfidenceSection(StrictModel):
    mahalanobis: bool = Field(default=True, description="Mahalanobis check on (fails closed)")
    disagreement: bool = Field(default=True, description="ensemble disagreement check on (fails closed)")
    consistency: bool = Field(default=True, description="proposal inside the members' hull (fails closed)")
    consistency_tolerance: float = Field(default=0.01, ge=0, description="fraction of each input's scale")
    mahalanobis_enter: float = unlimited(math.inf, gt=0)
    mahalanobis_exit: float = unlimited(math.inf, gt=0)
    disagreement_enter: float = unlimited(math.inf, gt=0)
    disagreement_exit: float = unlimited(math.inf, gt=0)
    scale: dict[str, float] = Field(default_factory=dict)
    min_dwell_s: float = Field(default=0.0, ge=0)
    single_network: Literal["refuse", "operator-accepted"] = Field(
        default="refuse", description="a proposal without members (a single network): its disagreement and "
                                      "consistency cannot be computed, so the gate holds the fallback ('refuse'), "
                                      "or an operator accepts the listed versions without them")
    accepted_by: str = Field(default="", max_length=200, description="who accepted (single_network)")
    accepted_utc: str = Field(default="", max_length=64, description="when, ISO 8601 with a time zone")
    accepted_versions: list[str] = Field(default_factory=list, description="the policy versions accepted")
    accepted_reason: str = Field(default="", max_length=2000)

    @model_validator(mode="after")
    def _hysteresis(self):
        for k in ("mahalanobis", "disagreement"):
            if getattr(self, f"{k}_exit") > getattr(self, f"{k}_enter"):
                raise ValueError(f"{k}_exit must be <= {k}_enter (hysteresis)")
        return self

    @model_validator(mode="after")
    def _acceptance(self):
        """An operator's acceptance of single networks names who, when and which versions, and
        keeps the Mahalanobis check (the one confidence signal left to such a network)."""
        keys = ("accepted_by", "accepted_utc", "accepted_versions", "accepted_reason")
        if self.single_network == "refuse":
            given = [k for k in keys if getattr(self, k)]
            if given:
                raise ValueError(f"{', '.join(given)} given, but single_network = 'refuse' (set it to "
                                 "'operator-accepted' to accept single networks)")
            return self
        if not self.accepted_by.strip():
            raise ValueError("single_network = 'operator-accepted' needs accepted_by (who accepted)")
        try:
            when = datetime.fromisoformat(self.accepted_utc)
        except ValueError:
            raise ValueError(f"accepted_utc: {self.accepted_utc!r} is not an ISO 8601 date and time "
                             "(2026-12-02T17:00:00Z)") from None
        if when.tzinfo is None:
            raise ValueError(f"accepted_utc: {self.accepted_utc!r} has no time zone (append Z for UTC)")
        if not self.accepted_versions:
            raise ValueError("single_network = 'operator-accepted' needs accepted_versions (the policy versions "
                             "accepted, e.g. [\"v3\"])")
        for v in self.accepted_versions:
            if not re.fullmatch(r"v[0-9]+", v):
                raise ValueError(f"accepted_versions: {v!r} is not a policy version (v1, v2, ...)")
        if not self.mahalanobis:
            raise ValueError("single_network = 'operator-accepted' needs mahalanobis = true: an accepted single "
                             "network keeps the Mahalanobis check (its one confidence signal)")
        return self

    def acceptance(self, version: str | None) -> dict | None:
        """The operator's acceptance covering `version` (who, when, why), or None."""
        if self.single_network != "operator-accepted" or version not in self.accepted_versions:
            return None
        return {"accepted_by": self.accepted_by, "accepted_utc": self.accepted_utc, "version": version,
                "reason": self.accepted_reason}


class PidLoop(StrictModel):
    input: str
    measurement: str
    setpoint: float
    kp: float
    ki: float = 0.0
    kd: float = 0.0
    reverse: bool = False
    bias: float = 0.0
    td_filter_s: float = Field(default=0.0, ge=0)
    on_bad: Literal["hold", "safe"] | None = Field(default=None, description="default [safety.fallback].on_bad")
    out_min: float | None = None
    out_max: float | None = None


class JointPd(StrictModel):
    """[[safety.fallback.joint_pd]]: a joint-space PD holding position, on torque inputs:
        tau_i = kp_i (q_ref_i - q_i) - kd_i dq_i (+ g_i(q) if gravity)
    q_ref is the measured position when the baseline takes over (while someone else acts it
    follows the measured q, so the hand-over is bumpless and the arm stops where it is).
    gravity = true adds the plant's g(q) (its module's `gravity_hook`): for a drive that does
    not compensate gravity itself (the Panda's drive does with gravity_comp = 1: leave false)."""

    inputs: str = Field(description="torque input group or list of elements, N m (joint.tau_target)")
    position: str = Field(description="measured joint positions, output group (joint.q), rad")
    velocity: str = Field(description="measured joint velocities, output group (joint.dq), rad/s")
    kp: float | list[float] = Field(description="N m/rad, one value or one per joint")
    kd: float | list[float] = Field(description="N m s/rad, one value or one per joint")
    gravity: bool = False


class FallbackSection(StrictModel):
    loops: list[PidLoop] = Field(default_factory=list)
    joint_pd: list[JointPd] = Field(default_factory=list)
    hold: list[str] = Field(default_factory=list, description="inputs the baseline holds at their applied value")
    fixed: dict[str, float] = Field(default_factory=dict)
    on_bad: Literal["hold", "safe"] = Field(default="hold", description="a loop's measurement is Bad")
    safe_output: dict[str, float] = Field(default_factory=dict, description="per loop input, plant units")

    def loop_on_bad(self, loop: PidLoop) -> str:
        return loop.on_bad or self.on_bad


class Rule(StrictModel):
    name: str
    signal: str
    op: Literal["<", ">"]
    limit: float
    for_s: float = Field(default=0.0, ge=0)
    action: Literal["rollback", "alarm", "fallback"] = "rollback"
    on_bad: Literal["trip", "alarm", "fallback", "condition"] = "trip"


class MonitorSection(StrictModel):
    rules: list[Rule] = Field(default_factory=list)
    demote_to: Mode | None = "limited"


class Gate(StrictModel):
    window_s: float = Field(gt=0)
    max_tracking_nrmse: float | None = Field(default=None, ge=0)
    max_fallback_rate: float | None = Field(default=None, ge=0, le=1)
    max_silent_rate: float | None = Field(default=None, ge=0, le=1)
    max_clip_rate: float | None = Field(default=None, ge=0, le=1)
    max_action_nrmse: float | None = Field(default=None, ge=0)
    max_alarms: int | None = Field(default=0, ge=0)


class RolloutSection(StrictModel):
    auto_promote: bool = False
    max_mode: Mode = "full"
    limited_max_deviation: dict[str, float] = Field(default_factory=dict)
    limited_box: dict[str, tuple[float, float]] = Field(default_factory=dict)
    gates: dict[Literal["shadow", "advisory", "limited"], Gate] = Field(default_factory=dict)


class SafetySection(StrictModel):
    mode: Mode = "shadow"
    decision_log: str = "runs/{scenario}-{timestamp}-safety.jsonl"
    status_path: str = ""
    log_every_step: bool = Field(default=False, description="a log line per step, not only on events")
    policy_lost_after_s: float | None = Field(
        default=None, gt=0, description="sim s without a valid proposal before the policy counts as lost; "
        f"default {LOST_AFTER_STEPS} loop steps")
    required: bool = Field(default=True, description="the run needs its safety process: one that dies stops "
                           "the run with exit code 8, one that hangs (no heartbeat for hang_s) makes it exit 8 "
                           "at the end; false: an alarm only, the loop's fallback action holds")
    hang_s: float = Field(default=5.0, ge=1.0, le=3600, description="wall s without the safety process's status "
                          "heartbeat (rewritten every 0.5 s, so at least 1 s) before it counts as hung")
    restart: SafetyRestartSection | None = Field(
        default=None, description="start a dead or hung safety process again (it never resumes above its "
        "predecessor's mode); default: never")
    placement: Literal["process", "loop"] = Field(
        default="process", description="where the envelope is enforced: 'process' = the safety process decides "
        "every step's action (one round trip per step); 'loop' = the compiled shield in the loop process "
        "(hil/loop/shield.py) enforces it every step on the policy's newest proposal, and the safety process "
        "supervises (signed decisions: mode, which controller acts, the limited envelope)")
    supervisor_rate_hz: float = Field(default=50.0, gt=0, le=10_000, description="placement = 'loop', real time: "
                                      "decisions per wall s the safety process sends when nothing changed "
                                      "(a changed decision goes at once; lockstep: one per proposal)")
    supervisor_silence_s: float = Field(default=0.1, gt=0, le=3600, description="placement = 'loop': sim s "
                                        "without a supervisor decision before the shield puts the fallback on "
                                        "(fail closed, alarm)")
    projection: ProjectionSection = Field(default_factory=ProjectionSection)
    confidence: ConfidenceSection = Field(default_factory=ConfidenceSection)
    fallback: FallbackSection = Field(default_factory=FallbackSection)
    monitor: MonitorSection = Field(default_factory=MonitorSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)

    def _shield_problems(self, spec, scenario) -> list[tuple[str, str]]:
        """What the in-loop shield cannot enforce (placement = 'loop'), each with its key."""
        problems = []
        for i, blk in enumerate(self.fallback.joint_pd):
            if blk.gravity:
                problems.append((f"safety.fallback.joint_pd[{i}].gravity", "the in-loop shield's joint PD has "
                                 "no gravity model: the drive compensates it (gravity = false)"))
        if self.projection.plant:
            from hil.safety.projection import plant_module

            try:
                mod = plant_module(scenario.plant.load())
            except Exception:  # the plant itself is reported by [plant] validation
                mod = None
            if mod is not None and getattr(mod, "SAFETY_LIMITS_COMPILED", None) is None:
                problems.append(("safety.projection.plant", f"{spec.name} has no compiled limit families "
                                 "(SAFETY_LIMITS_COMPILED): the in-loop shield cannot enforce them; use "
                                 "placement = 'process'"))
        return problems

    def validate_against(self, spec, scenario) -> list[tuple[str, str]]:
        from hil.bus.config import action_input_names

        problems: list[tuple[str, str]] = []
        if self.placement == "loop":
            problems += self._shield_problems(spec, scenario)
        actions = action_input_names(scenario, spec)
        if scenario.policy is None:
            problems.append(("safety", "a [safety] section needs a [policy] section"))
        if scenario.bus is None:
            problems.append(("safety", "a [safety] section needs a [bus] section"))

        def action_name(path, name):
            if name not in actions:
                problems.append((path, f"{name!r} is not an action input (actions: {', '.join(actions)})"))
                return False
            return True

        def signal(path, name):
            try:
                signal_index(spec, name)
                return True
            except KeyError as exc:
                problems.append((path, str(exc.args[0])))
                return False

        def box(path, table):
            for name, (lo, hi) in table.items():
                if action_name(f"{path}.{name}", name):
                    q = spec.quantity("inputs", name)
                    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                        problems.append((f"{path}.{name}", f"[{lo}, {hi}] is not an interval"))
                    elif lo < q.low or hi > q.high:
                        problems.append(
                            (f"{path}.{name}", f"[{lo}, {hi}] is outside the physical bounds [{q.low}, {q.high}] {q.unit}")
                        )

        pr = self.projection
        box("safety.projection.box", pr.box)
        box("safety.rollout.limited_box", self.rollout.limited_box)
        for name, r in pr.rate.items():
            if action_name(f"safety.projection.rate.{name}", name) and not (r > 0 and math.isfinite(r)):
                problems.append((f"safety.projection.rate.{name}", f"{r} is not a positive rate"))
        for i, lim in enumerate(pr.linear):
            path = f"safety.projection.linear[{i}]"
            if not lim.w or not any(v != 0 for v in lim.w.values()):
                problems.append((f"{path}.w", "needs at least one non-zero weight"))
            for name in lim.w:
                action_name(f"{path}.w.{name}", name)
            for name in lim.b:
                signal(f"{path}.b.{name}", name)
        if pr.plant:
            from hil.safety.projection import plant_limit_family

            for i, pl in enumerate(pr.plant):
                try:
                    plant_limit_family(scenario.plant.load(), pl.kind, actions, pl.options,
                                       f"safety.projection.plant[{i}]")
                except ValueError as exc:
                    path, _, reason = str(exc).partition(": ")
                    problems.append((path, reason or str(exc)))
        for name, v in self.rollout.limited_max_deviation.items():
            if action_name(f"safety.rollout.limited_max_deviation.{name}", name) and not v >= 0:
                problems.append((f"safety.rollout.limited_max_deviation.{name}", f"{v} is negative"))
        for name, v in self.confidence.scale.items():
            if action_name(f"safety.confidence.scale.{name}", name) and not v > 0:
                problems.append((f"safety.confidence.scale.{name}", f"{v} is not positive"))
        covered: dict[str, str] = {}
        for i, loop in enumerate(self.fallback.loops):
            path = f"safety.fallback.loops[{i}]"
            if action_name(f"{path}.input", loop.input):
                if loop.input in covered:
                    problems.append((f"{path}.input", f"{loop.input!r} already driven by {covered[loop.input]}"))
                covered[loop.input] = path
                q = spec.quantity("inputs", loop.input)
                lo = q.low if loop.out_min is None else loop.out_min
                hi = q.high if loop.out_max is None else loop.out_max
                if not q.low <= lo <= hi <= q.high:
                    problems.append((path, f"output range [{lo}, {hi}] outside [{q.low}, {q.high}] {q.unit}"))
            signal(f"{path}.measurement", loop.measurement)
        for i, pd in enumerate(self.fallback.joint_pd):
            path = f"safety.fallback.joint_pd[{i}]"
            try:
                elems = spec.expand("inputs", pd.inputs)
                n_q = len(spec.expand("outputs", pd.position))
                n_dq = len(spec.expand("outputs", pd.velocity))
            except KeyError as exc:
                problems.append((path, str(exc.args[0])))
                continue
            if not (len(elems) == n_q == n_dq):
                problems.append((path, f"{len(elems)} inputs, {n_q} positions, {n_dq} velocities: sizes differ"))
            for gain in ("kp", "kd"):
                v = getattr(pd, gain)
                vals = v if isinstance(v, list) else [v]
                if len(vals) not in (1, len(elems)) or not all(math.isfinite(g) and g >= 0 for g in vals):
                    problems.append((f"{path}.{gain}", f"expected one or {len(elems)} finite gains >= 0, got {v}"))
            if pd.gravity:
                from hil.safety.projection import plant_module

                if not callable(getattr(plant_module(scenario.plant.load()), "gravity_hook", None)):
                    problems.append((f"{path}.gravity", f"plant {scenario.plant.model!r} has no gravity_hook"))
            for name in elems:
                if action_name(f"{path}.inputs", name):
                    if name in covered:
                        problems.append((f"{path}.inputs", f"{name!r} already driven by {covered[name]}"))
                    covered[name] = path
        for j, name in enumerate(self.fallback.hold):
            path = f"safety.fallback.hold[{j}]"
            if action_name(path, name):
                if name in covered:
                    problems.append((path, f"{name!r} already driven by {covered[name]}"))
                covered[name] = path
        for name, v in self.fallback.fixed.items():
            path = f"safety.fallback.fixed.{name}"
            if action_name(path, name):
                if name in covered:
                    problems.append((path, f"{name!r} already driven by {covered[name]}"))
                covered[name] = path
                if reason := outside_bounds(v, spec.quantity("inputs", name)):
                    problems.append((path, reason))
        loop_inputs = {loop.input: loop for loop in self.fallback.loops}
        for name, v in self.fallback.safe_output.items():
            path = f"safety.fallback.safe_output.{name}"
            if name not in loop_inputs:
                problems.append((path, f"{name!r} is not the input of a fallback loop"))
                continue
            loop = loop_inputs[name]
            q = spec.quantity("inputs", name)
            lo = q.low if loop.out_min is None else loop.out_min
            hi = q.high if loop.out_max is None else loop.out_max
            if not (math.isfinite(v) and lo <= v <= hi):
                problems.append((path, f"{v} is outside the loop's output range [{lo}, {hi}] {q.unit}"))
        for i, loop in enumerate(self.fallback.loops):
            if self.fallback.loop_on_bad(loop) == "safe" and loop.input not in self.fallback.safe_output:
                problems.append((f"safety.fallback.loops[{i}].on_bad",
                                 f"'safe' needs safety.fallback.safe_output.{loop.input}"))
        missing = [n for n in actions if n not in covered]
        if missing:
            problems.append(
                ("safety.fallback", f"no fallback for {', '.join(missing)}: add a loop or a fixed value")
            )
        for i, rule in enumerate(self.monitor.rules):
            signal(f"safety.monitor.rules[{i}].signal", rule.signal)
        names = [r.name for r in self.monitor.rules]
        if len(set(names)) != len(names):
            problems.append(("safety.monitor.rules", "rule names repeat"))
        from hil.bus.config import bus_input_names

        watched = [n for n in actions if n not in bus_input_names(scenario, spec)]
        if watched and MODES.index(self.rollout.max_mode) > MODES.index("advisory"):
            problems.append(("safety.rollout.max_mode", f"the policy cannot act on {', '.join(watched)} (driver is "
                             "not 'bus'): shadow or advisory only, or make the bus drive them"))
        cf = self.confidence
        if not (cf.mahalanobis or cf.disagreement or cf.consistency):
            for mode, gate in self.rollout.gates.items():
                if gate.max_fallback_rate is not None:
                    problems.append((f"safety.rollout.gates.{mode}.max_fallback_rate",
                                     "every confidence check is disabled ([safety.confidence] mahalanobis, "
                                     "disagreement, consistency), so the fallback rate would read 0 because "
                                     "nothing is gated: enable a check or drop this KPI"))
        problems += self._loop_fallback_problems(spec, scenario, actions)
        if MODES.index(self.mode) > MODES.index(self.rollout.max_mode):
            problems.append(("safety.mode", f"{self.mode!r} is above rollout.max_mode {self.rollout.max_mode!r}"))
        return problems

    def _loop_fallback_problems(self, spec, scenario, actions: list[str]) -> list[tuple[str, str]]:
        """The loop's own watchdog action must lie inside the envelope the wrapper enforces: the
        box (spec bounds and [safety.projection].box), the limited box when limited autonomy
        is reachable, and the linear limits evaluated at the scenario's initial state."""
        from hil.bus.config import bus_input_names, loop_fallback_action

        bus = scenario.bus
        if bus is None or not bus.enabled:
            return []
        names = [n for n in actions if n in bus_input_names(scenario, spec)]
        if not names:
            return []
        a = loop_fallback_action(bus, scenario, spec, names)
        problems: list[tuple[str, str]] = []

        def origin(name: str) -> str:
            if name in bus.fallback_action:
                return ""
            inp = scenario.inputs.get(name)
            return (f" (from inputs.{name}.value)" if inp is not None and inp.value is not None
                    else " (the input's nominal value)")

        limited = MODES.index(self.rollout.max_mode) >= MODES.index("limited")
        for i, name in enumerate(names):
            q = spec.quantity("inputs", name)
            v = float(a[i])
            if outside_bounds(v, q):
                continue  # reported by [bus] validation
            path = f"bus.fallback_action.{name}"
            lo, hi = self.projection.box.get(name, (q.low, q.high))
            if not lo <= v <= hi:
                problems.append((path, f"{v:g} {q.unit}{origin(name)} is outside the safety box [{lo:g}, {hi:g}] "
                                       f"{q.unit} (safety.projection.box)"))
            elif limited and name in self.rollout.limited_box:
                lo, hi = self.rollout.limited_box[name]
                if not lo <= v <= hi:
                    problems.append((path, f"{v:g} {q.unit}{origin(name)} is outside the limited-autonomy box "
                                           f"[{lo:g}, {hi:g}] {q.unit} (safety.rollout.limited_box)"))
        if not self.projection.linear:
            return problems
        try:
            y0, u0 = initial_signals(spec, scenario)
        except Exception as exc:  # a plant whose outputs cannot be evaluated outside its kernel
            return problems + [("bus.fallback_action", f"cannot evaluate the plant's outputs at the initial "
                                                       f"state to check the linear limits: {exc}")]
        for i, name in enumerate(names):
            u0[spec.index("inputs", name)] = a[i]
        for lim in self.projection.linear:
            involved = [n for n, w in lim.w.items() if w != 0 and n in names]
            if not involved:
                continue
            path = f"bus.fallback_action.{involved[0]}"
            try:
                b = lim.b0
                for sig, coef in lim.b.items():
                    if coef != 0:
                        kind, j = signal_index(spec, sig)
                        b += coef * (u0[j] if kind == "u" else y0[j])
                lhs = sum(w * u0[spec.index("inputs", n)] for n, w in lim.w.items())
            except KeyError:
                continue  # an unknown signal or input: reported above
            terms = " + ".join(f"{w:g} * {n}" for n, w in lim.w.items())
            if not math.isfinite(b):
                problems.append((path, f"linear limit {lim.name!r}: b(state) cannot be evaluated at the initial "
                                       f"state, so the loop's fallback action cannot be checked against it"))
            elif lhs > b + 1e-9 * (1.0 + abs(b)):
                problems.append((path, f"the loop's fallback action violates linear limit {lim.name!r} at the "
                                       f"initial state: {terms} = {lhs:g} > b = {b:g}"))
        return problems


def initial_signals(spec, scenario):
    """(outputs, inputs) of the scenario's plant at its initial state (plant units): states and
    parameters from the spec's nominal values overridden by [plant], inputs by their configured
    value. The outputs come from the plant's own `outputs` kernel, run as plain Python."""
    from plants.base import Plant

    plant = Plant(scenario.plant.load())
    x, u, p = plant.x, plant.u, plant.p
    for name, v in scenario.plant.parameters.items():
        p[spec.index("params", name)] = v
    for name, v in scenario.plant.initial_state.items():
        if spec.has("states", name):
            x[spec.index("states", name)] = v
        else:
            plant.d[spec.index("discrete", name)] = int(v)
    for name, inp in scenario.inputs.items():
        if inp.value is not None:
            u[spec.index("inputs", name)] = inp.value
    y = plant.compute_outputs(python=True).copy()
    return y, u.copy()


def _register_signal_tables() -> None:
    """Nested TOML keys spell dotted signal names in the wrapper's per-input tables
    (hil.scenario.config.flatten_signal_tables): box.heater_3.duty = box."heater_3.duty"."""
    from hil.scenario.config import register_signal_table

    for path in (("projection", "box"), ("projection", "rate"), ("fallback", "fixed"),
                 ("fallback", "safe_output"), ("rollout", "limited_max_deviation"),
                 ("rollout", "limited_box"), ("confidence", "scale")):
        register_signal_table(("safety",) + path, None)


_register_signal_tables()
