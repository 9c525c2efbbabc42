"""The FaultStage: the per-step hooks the loop calls (Runtime.hooks) to start, apply and end the
faults of one run at their steps (hil/campaign/faults.py for the kinds and the hook points).

Per step the stage compares one integer (the step of the next fault event) and runs only the
faults active at that step: with no fault active a hook is a method call over an empty list.
"""

from __future__ import annotations

import numpy as np


class FaultStage:
    """The runtime hooks for one run: faults started and ended at their steps, applied in
    between; plus the lockstep PLC, if the run has one. See the module docstring."""

    def __init__(self, faults: list, plant, n_steps: int, step_s: float, seed: int,
                 stop_at_k: int | None = None, plc=None, request_stop=None, y_served: np.ndarray | None = None,
                 external=None):
        """y_served: the loop's served-output array (Runtime.y_meas), updated in place every step;
        at the top of step k it holds what step k-1 served (the value a stuck sensor keeps).
        The applied inputs of step k-1 are the plant's input array (plant.u) at that point."""
        self.faults = list(faults)
        self.plant, self.n_steps, self.step_s, self.seed = plant, int(n_steps), float(step_s), int(seed)
        self.plc = plc
        self.external = external  # callback(fault, begin: bool) for faults outside this process
        self._own_y = y_served is None
        self.y_last = np.zeros(plant.spec.n_outputs) if y_served is None else y_served
        self.u_last = plant.u
        self._events: list[tuple] = []  # (step, 0 = end | 1 = begin, fault)
        for f in self.faults:
            self._events.append((max(0, f.start_k - f.lead_k), 1, f))
            if f.end_k < 1 << 60:
                self._events.append((f.end_k, 0, f))
        self._events.sort(key=lambda e: (e[0], e[1]))
        self._ev = 0
        self._next_k = self._events[0][0] if self._events else 1 << 62
        self._active = {"pre": [], "actuate": [], "sense": []}
        self.stop_at_k = stop_at_k if stop_at_k is not None else 1 << 62
        self.request_stop = request_stop
        self.stopped_run = False  # True once stop_after_s ended the run
        self.log: list[dict] = []  # fault begin / end events: {"fault", "kind", "event", "step", "t_s"}

    def fault_no(self, f) -> int:
        return self.faults.index(f)

    def pre(self, k: int, t: float) -> None:
        if k >= self._next_k:
            self._run_events(k)
        if k >= self.stop_at_k and self.request_stop is not None:
            self.request_stop()
            self.stop_at_k = 1 << 62
            self.stopped_run = True
        for f in self._active["pre"]:
            f.apply(self, k, None)
        if self.plc is not None:
            self.plc.tick(k)

    def _run_events(self, k: int) -> None:
        ev = self._events
        while self._ev < len(ev) and ev[self._ev][0] <= k:
            _, begin, f = ev[self._ev]
            self._ev += 1
            if begin:
                f.begin(self, k)
                if f.hook != "none":
                    self._active[f.hook].append(f)
                self.log.append({"fault": f.name, "kind": f.kind, "event": "begin", "step": f.start_k,
                                     "t_s": f.start_k * self.step_s})
            else:
                if f.hook != "none" and f in self._active[f.hook]:
                    self._active[f.hook].remove(f)
                f.end(self, k)
                self.log.append({"fault": f.name, "kind": f.kind, "event": "end", "step": k,
                                 "t_s": k * self.step_s})
        self._next_k = ev[self._ev][0] if self._ev < len(ev) else 1 << 62

    def actuate(self, k: int, t: float, u_app: np.ndarray) -> None:
        for f in self._active["actuate"]:
            f.apply(self, k, u_app)

    def sense(self, k: int, t_end: float, y: np.ndarray) -> None:
        for f in self._active["sense"]:
            f.apply(self, k, y)
        if self._own_y:  # (standalone use; in the loop y_last is the loop's own array)
            self.y_last[:] = y
