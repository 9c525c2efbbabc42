"""The loop watches its safety process as it watches its servers: dead or hung raises an alarm,
and with `[safety] restart` a new safety process takes over.

    watch = SafetyWatch(handles, alarms, required=sc.safety.required, hang_s=sc.safety.hang_s,
                        restart=sc.safety.restart, respawn=launch.respawn_safety)
    stop = watch.check(step, t_s)      # every status tick: a message when the run must stop
    watch.dead()                       # {"safety": "killed by SIGKILL"} for dead_processes
    watch.lost                         # the run lost its safety (see below)

Dead: the process exited (any code, any signal) while the loop ran. Hung: its status file,
rewritten at least every 0.5 s of wall time while its loop turns (its heartbeat), is older than
`[safety] hang_s` wall s (a SIGSTOP, a deadlock, a machine that starves it). Both raise an alarm
(`safety_died`, `safety_hung`); meanwhile the loop's own fallback action holds, ramped at the
rate limits (its watchdog: no fresh signed action).

Without `[safety] restart` (the default) a dead safety stays dead: with `[safety] required`
(the default) the run stops at once with EXIT_SAFETY_LOST, otherwise it goes on under the
fallback with the alarm. A hung one keeps its alarm until the heartbeat comes back; a required
safety that hung makes the run exit EXIT_SAFETY_LOST at the end.

With `[safety] restart = { max_restarts, backoff_s, backoff_max_s }` a dead safety (or a hung one,
which is SIGKILLed) is started again after backoff_s wall s, doubling per restart up to
backoff_max_s, at most max_restarts times per run. The new process gets the same run secret over
its bootstrap pipe and signs with a newer session id (its start time in ns), so the loop takes its
actions and a replay of the dead one's stays refused. It resumes in the LOWER of the configured
mode and the mode its predecessor last wrote in its status file (shadow if that file cannot be
read): a restart never promotes. Its rollout gates start over; the decision log gets a `restart`
record. The alarm stays active until the new heartbeat; a restart that does not come up (no CPU
progress for readiness.STALL_S, or not up within readiness.MAX_S) counts as a failed restart.
When the budget is spent, a required safety stops the run with EXIT_SAFETY_LOST.
`lost` (the end-of-run verdict for a required safety): without restart, it died or hung at some
point; with restart, it is not up as the run ends or it was given up on. A recovered safety
leaves its alarms (inactive) and counters (`deaths`, `hangs`, `restarts`) in the summary and a
warning, with exit code 0.
All checks are a non-blocking poll and one stat: cheap at the status tick; a restart is one
spawn (the policy's restart does the same).
"""

from __future__ import annotations

import os
import signal
import time

from hil.loop.health import Alarm, Alarms, describe_exit

NAME = "safety"  # the key in the run summary's dead_processes


class SafetyWatch:
    def __init__(self, handles, alarms: Alarms, *, required: bool = True, hang_s: float = 5.0,
                 restart=None, respawn=None):
        """`restart`: hil.safety.config.SafetyRestartSection or None (never restart).
        `respawn(handles, mode) -> Popen`: starts a new safety process resuming at `mode`."""
        self.h = handles
        self.alarms = alarms
        self.required = bool(required)
        self.hang_s = float(hang_s)
        self.restart = restart if respawn is not None else None
        self._respawn = respawn
        self.died: str | None = None  # describe_exit of the last death
        self.deaths = 0
        self.hangs = 0  # times it was found hung
        self.restarts = 0
        self.restart_failures = 0
        self.state = "up"  # up | down (waiting for its restart) | starting | gave_up
        self._hung: Alarm | None = None
        self._down: Alarm | None = None  # the alarm of the death/hang a restart should clear
        self._killed = False  # we SIGKILLed it (hung): its exit is not a new death
        self._restart_at = 0.0  # monotonic s
        self._spawned_wall = 0.0
        self._spawned = 0.0
        self._progress = None
        self._gave_up_reason = ""

    @property
    def lost(self) -> bool:
        if self.restart is None:
            return self.died is not None or self.hangs > 0
        return self.state != "up"

    def heartbeat_age_s(self, now_wall: float | None = None) -> float | None:
        """Wall s since the safety process last wrote its status file; None if there is none
        (or, for a restarted one, only its predecessor's)."""
        try:
            mtime = os.stat(self.h.status_path).st_mtime
        except OSError:
            return None
        if self._spawned_wall and mtime < self._spawned_wall - 1.0:
            return None
        return max(0.0, (time.time() if now_wall is None else now_wall) - mtime)

    def check(self, step: int, t_s: float, now_wall: float | None = None, now: float | None = None,
              final: bool = False) -> str | None:
        """One look (status tick). Returns the message of a loss that stops the run (required,
        nothing left to restart), else None; alarms are raised in any case. `final`: the look as
        the run ends (starts nothing)."""
        now = time.monotonic() if now is None else now
        if self.state == "gave_up":
            return None
        if self.state == "down":
            if not final and now >= self._restart_at and self.h.safety.poll() is not None:
                return self._spawn(step, t_s, now)
            return None
        proc = self.h.safety
        code = proc.poll()
        if code is not None:
            return self._exited(code, step, t_s, now)
        if self.state == "starting":
            return self._starting(step, t_s, now, now_wall)
        age = self.heartbeat_age_s(now_wall)
        if age is None:
            age = float("inf")  # its status file gone: no heartbeat (fail closed)
        if age > self.hang_s and self._hung is None:
            self.hangs += 1
            self._hung = self.alarms.raise_(
                "safety_hung", "safety process",
                f"safety process {proc.pid} hung: no heartbeat for {age:.1f} s (hang_s {self.hang_s:g}) "
                f"at step {step}; the loop's fallback action holds", step, t_s)
            if self.restart is not None:  # killed; its exit schedules the restart
                self._down, self._hung = self._hung, None
                self._killed = True
                try:
                    proc.send_signal(signal.SIGKILL)
                except ProcessLookupError:
                    pass
        elif age <= self.hang_s and self._hung is not None:
            self._hung.active = False
            self._hung.message += f" (answers again at step {step})"
            self._hung = None
        return None

    def _exited(self, code: int, step: int, t_s: float, now: float) -> str | None:
        proc = self.h.safety
        if self._hung is not None:
            self._hung.active = False
            self._hung = None
        if self._killed:  # the hung one we killed: its alarm stands for it
            self._killed = False
        else:
            self.deaths += 1
            self.died = describe_exit(code)
            alarm = self.alarms.raise_(
                "safety_died", "safety process",
                f"safety process {proc.pid} died ({self.died}) at step {step}: no action is checked "
                "any more, the loop's fallback action holds", step, t_s)
            if self._down is not None:
                self._down.active = False
            self._down = alarm
        return self._schedule(step, t_s, now)

    def _schedule(self, step: int, t_s: float, now: float) -> str | None:
        r = self.restart
        if r is None:
            self.state = "gave_up"
            msg = self._down.message if self._down is not None else "safety process lost"
        elif self.restarts >= r.max_restarts:
            self.state = "gave_up"
            self._gave_up_reason = f"max_restarts = {r.max_restarts} reached"
            msg = self.alarms.raise_("safety_died", "safety process",
                                     f"safety process not restarted: {self._gave_up_reason}", step, t_s).message
        else:
            self.state = "down"
            self._restart_at = now + min(r.backoff_s * 2.0 ** self.restarts, r.backoff_max_s)
            return None
        return msg if self.required else None

    def _spawn(self, step: int, t_s: float, now: float) -> str | None:
        from hil.safety.launch import resume_mode

        mode = resume_mode(self.h)
        self._spawned_wall, self._spawned, self._progress = time.time(), now, None
        self.restarts += 1
        try:
            self.h.safety = self._respawn(self.h, mode)
        except OSError as exc:
            self.restart_failures += 1
            self.alarms.raise_("safety_died", "safety process", f"safety restart failed: {exc}", step, t_s)
            return self._schedule(step, t_s, now)
        self.state = "starting"
        if self._down is not None:
            self._down.message += f" (restart #{self.restarts} at step {step}, pid {self.h.safety.pid}, mode {mode})"
        return None

    def _starting(self, step: int, t_s: float, now: float, now_wall: float | None) -> str | None:
        from hil import readiness

        if self.heartbeat_age_s(now_wall) is not None:
            self.state = "up"
            if self._down is not None:
                self._down.active = False
                self._down.message += f" (up again at step {step})"
                self._down = None
            return None
        if self._progress is None:
            self._progress = readiness.Progress([self.h.safety.pid], self._spawned)
        why = None
        if now - self._spawned > readiness.MAX_S:
            why = f"not up after {now - self._spawned:.0f} s"
        elif self._progress.stalled_s(now) > readiness.STALL_S:
            why = f"no progress for {readiness.STALL_S:g} s"
        if why is None:
            return None
        self.restart_failures += 1
        self.alarms.raise_("safety_died", "safety process",
                           f"restarted safety process {self.h.safety.pid} did not come up: {why}", step, t_s)
        self._killed = True
        try:
            self.h.safety.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.state = "up"  # its exit (next tick) schedules the next restart
        return None

    def dead(self) -> dict[str, str]:
        """For the summary's dead_processes: the safety, if it is dead as the run ends."""
        if self.died is not None and self.state != "up":
            return {NAME: self.died}
        return {}

    def summary(self) -> dict:
        return {"required": self.required, "hang_s": self.hang_s, "died": self.died, "deaths": self.deaths,
                "hangs": self.hangs, "hung_at_end": self._hung is not None, "restarts": self.restarts,
                "restart_failures": self.restart_failures, "state": self.state,
                "restart": None if self.restart is None else self.restart.model_dump()}
