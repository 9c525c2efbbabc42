"""The scenario's SoftPLC program stepped in simulated time: the lockstep stand-in for the
SoftPLC process (hil/softplc/scan.py), so a PLC-controlled scenario runs in a lockstep campaign.

Same program as the process: every scan, read each loop's measurement (the value served in
the process image, gaps and faults included), run its PID, write the loop outputs and the
fixed outputs into the image's commanded inputs (the loop takes them as a PLC write). The
scan period in simulated seconds is what the real-time SoftPLC scans at the scenario's time
scale: `scan_ms / 1000 * loop.time_scale` (pid_clock "sim"; with "wall" the PID's dt is the
wall scan period, as the process does), rounded to whole loop steps (at least one).

A measurement that is not finite (a dropout served as Bad) holds the loop's output, as the
PID block does. halt() stops scanning (a crashed or hung PLC: its last writes stay in the
image, as registers in a server do); resume(restart=True) starts it again from scratch
(bumpless from the outputs it reads back, like the process's init state).
"""

from __future__ import annotations

import math

import numpy as np

from hil.control.pid import pid_from_config


class LockstepPlc:
    def __init__(self, scenario, spec, image, y_served: np.ndarray, step_s: float):
        cfg = scenario.softplc
        if cfg is None:
            raise ValueError(f"scenario {scenario.name!r} has no [softplc] section")
        self.cfg, self.spec, self.image, self.y = cfg, spec, image, y_served
        wall_scan_s = cfg.scan_ms / 1000.0
        sim_scan_s = wall_scan_s * scenario.loop.time_scale
        self.every_k = max(1, int(round(sim_scan_s / step_s)))
        self.pid_dt = self.every_k * step_s if cfg.pid_clock == "sim" else wall_scan_s
        self.loops = []
        for lp in cfg.loops:
            pid = pid_from_config(lp, spec.quantity("inputs", lp.output))
            self.loops.append((pid, lp.setpoint, spec.index("outputs", lp.measurement),
                               spec.index("inputs", lp.output), lp.kp, lp.reverse))
        self.fixed = [(spec.index("inputs", n), float(v)) for n, v in cfg.outputs.items()]
        self.out_idx = np.array([lp[3] for lp in self.loops] + [i for i, _ in self.fixed], dtype=np.intp)
        self.values = np.zeros(self.out_idx.size)
        self.running = True
        self.started = False
        self.next_k = 0
        self.scans = 0

    def halt(self) -> None:
        self.running = False

    def resume(self, restart: bool, k: int) -> None:
        self.running = True
        if restart:
            self.started = False
        self.next_k = k

    def tick(self, k: int) -> None:
        """Called at the top of every loop step; scans when one is due."""
        if not self.running or k < self.next_k:
            return
        self.next_k = k + self.every_k
        self.scans += 1
        y = self.y
        if not self.started:  # bumpless start from the commanded values in the image
            u = np.zeros(self.spec.n_inputs)
            self.image.read_inputs_into(u, mark_applied=False)
            for pid, sp, mi, oi, kp, rev in self.loops:
                pv = y[mi]
                e = (sp - pv) * (-1.0 if rev else 1.0)
                p = kp * e if math.isfinite(pv) else 0.0
                pid.reset(output=min(max(u[oi], pid.out_min), pid.out_max) - p,
                          measurement=pv if math.isfinite(pv) else None)
            self.started = True
        vals = self.values
        for j, (pid, sp, mi, _oi, _kp, _rev) in enumerate(self.loops):
            pv = y[mi]
            if math.isfinite(pv):
                vals[j] = pid.update(sp, pv, self.pid_dt)
            else:
                pid.hold()
                vals[j] = pid.update(sp, pv, self.pid_dt)  # holds its output on a bad input
        for j, (_i, v) in enumerate(self.fixed):
            vals[len(self.loops) + j] = v
        self.image.write_inputs(self.out_idx, vals)
