"""The loop watches its safety process as it watches its servers: dead or hung raises an alarm.

    watch = SafetyWatch(handles, alarms, required=sc.safety.required, hang_s=sc.safety.hang_s)
    stop = watch.check(step, t_s)      # every status tick: a message when the run must stop
    watch.dead()                       # {"safety": "killed by SIGKILL"} for dead_processes
    watch.lost                         # it died or hung at some point of the run

Dead: the process exited (any code, any signal) while the loop ran; the safety is never
restarted (its replacement would sign with a new session, and the decision log and rollout
state would start over): with `[safety] required` (the default) the run stops at once with
EXIT_SAFETY_LOST, otherwise it goes on under the loop's own fallback action with the alarm.
Hung: its status file, rewritten at least every 0.5 s of wall time while its loop turns (its
heartbeat), is older than `[safety] hang_s` wall s (a SIGSTOP, a deadlock, a machine that
starves it). The alarm stays active until the heartbeat comes back; a required safety that hung
makes the run exit with EXIT_SAFETY_LOST at the end (the loop's fallback acted meanwhile).
Both checks are a non-blocking poll and one stat: cheap at the status tick.
"""

from __future__ import annotations

import os
import time

from hil.health import Alarm, Alarms, describe_exit

NAME = "safety"  # the key in the run summary's dead_processes


class SafetyWatch:
    def __init__(self, handles, alarms: Alarms, *, required: bool = True, hang_s: float = 5.0):
        self.h = handles
        self.alarms = alarms
        self.required = bool(required)
        self.hang_s = float(hang_s)
        self.died: str | None = None  # describe_exit of the dead process
        self.hangs = 0  # times it was found hung
        self._hung: Alarm | None = None

    @property
    def lost(self) -> bool:
        return self.died is not None or self.hangs > 0

    def heartbeat_age_s(self, now_wall: float | None = None) -> float | None:
        """Wall s since the safety process last wrote its status file; None if there is none."""
        try:
            mtime = os.stat(self.h.status_path).st_mtime
        except OSError:
            return None
        return max(0.0, (time.time() if now_wall is None else now_wall) - mtime)

    def check(self, step: int, t_s: float, now_wall: float | None = None) -> str | None:
        """One look (status tick). Returns the message of a death that stops the run (required),
        else None; alarms are raised in any case."""
        if self.died is not None:
            return None
        proc = self.h.safety
        code = proc.poll()
        if code is not None:
            self.died = describe_exit(code)
            if self._hung is not None:
                self._hung.active = False
            msg = (f"safety process {proc.pid} died ({self.died}) at step {step}: no action is checked any more, "
                   "the loop's fallback action holds")
            self.alarms.raise_("safety_died", "safety process", msg, step, t_s)
            return msg if self.required else None
        age = self.heartbeat_age_s(now_wall)
        if age is None:
            age = float("inf")  # its status file gone: no heartbeat (fail closed)
        if age > self.hang_s and self._hung is None:
            self.hangs += 1
            self._hung = self.alarms.raise_(
                "safety_hung", "safety process",
                f"safety process {proc.pid} hung: no heartbeat for {age:.1f} s (hang_s {self.hang_s:g}) "
                f"at step {step}; the loop's fallback action holds", step, t_s)
        elif age <= self.hang_s and self._hung is not None:
            self._hung.active = False
            self._hung.message += f" (answers again at step {step})"
            self._hung = None
        return None

    def dead(self) -> dict[str, str]:
        return {NAME: self.died} if self.died is not None else {}

    def summary(self) -> dict:
        return {"required": self.required, "hang_s": self.hang_s, "died": self.died, "hangs": self.hangs,
                "hung_at_end": self._hung is not None}
