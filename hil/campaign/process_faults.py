"""Faults inside the policy and safety processes, keyed on the simulated time of the
observation each process receives (so a lockstep run stays deterministic).

The campaign runner puts one JSON object in the environment of the run (inherited by the
processes hil/safety/launch.py starts):

    HIL_FAULT_POLICY = {"kind": "policy_nan", "start_s": 600.0, "end_s": 900.0, "args": {...}}
    HIL_FAULT_SAFETY = {"kind": "safety_crash", "start_s": 600.0, "end_s": inf}

Policy kinds (applied to the model's output, before the runner's own checks, as a faulty
model would; the chain policy runner -> safety -> loop is what is under test):
    policy_crash        the process exits (status 70) at the first observation at or after start_s
    policy_hang         no answer to observations inside the window (lockstep: a hang is
                        seen as silence; the heartbeat keeps going so the supervisor's wall
                        clock cannot make the run non-deterministic. Real time: the runner
                        SIGSTOPs the process for the window instead.)
    policy_nan          the action is NaN
    policy_wrong_shape  the action has one element too many
    policy_ood          every action element at `value` (or `factor` x its magnitude + 1)
Safety kinds:
    safety_crash        the safety process exits (status 70) at the first observation at or after start_s
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

ENV = {"policy": "HIL_FAULT_POLICY", "safety": "HIL_FAULT_SAFETY"}
CRASH_STATUS = 70


class ProcessFault:
    def __init__(self, role: str, kind: str, start_s: float, end_s: float, args: dict | None = None):
        self.role, self.kind = role, kind
        self.start_s, self.end_s = float(start_s), float(end_s)
        self.args = dict(args or {})

    def active(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s

    def on_observation(self, t_s: float) -> bool:
        """Called on each accepted observation (simulated time t_s): crashes the process when
        due; returns True if the observation must go unanswered (hang)."""
        if self.kind.endswith("_crash") and t_s >= self.start_s:
            print(f"{self.role}: injected fault {self.kind} at t = {t_s:g} s", file=sys.stderr, flush=True)
            os._exit(CRASH_STATUS)
        return self.kind == "policy_hang" and self.active(t_s)

    def corrupt(self, t_s: float, a: np.ndarray) -> np.ndarray:
        """The policy's action as the faulty model returns it."""
        if not self.active(t_s):
            return a
        if self.kind == "policy_nan":
            return np.full(a.shape, math.nan)
        if self.kind == "policy_wrong_shape":
            return np.append(np.asarray(a, dtype=np.float64).reshape(-1), 0.0)
        if self.kind == "policy_ood":
            v = self.args.get("value", math.nan)
            if v is not None and math.isfinite(v):
                return np.full(a.shape, float(v))
            return np.asarray(a, dtype=np.float64) * float(self.args.get("factor", 10.0)) + np.sign(a) + 1.0
        return a

    def to_env(self) -> tuple[str, str]:
        return ENV[self.role], json.dumps({"kind": self.kind, "start_s": self.start_s, "end_s": self.end_s,
                                          "args": self.args})


def from_env(role: str) -> ProcessFault | None:
    """The fault this process must inject, from its environment (None: no fault)."""
    raw = os.environ.get(ENV[role])
    if not raw:
        return None
    d = json.loads(raw)
    return ProcessFault(role, d["kind"], d["start_s"], d["end_s"], d.get("args"))
