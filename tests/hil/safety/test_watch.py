"""hil/safety/watch.py without processes: a stand-in for the Popen and a status file whose age
the test sets (os.utime), so every branch is driven exactly."""

import os
import signal
from types import SimpleNamespace

from hil.loop.health import Alarms
from hil.safety.watch import SafetyWatch


class FakeProc:
    pid = 4242

    def __init__(self):
        self.code = None

    def poll(self):
        return self.code


def _watch(tmp_path, **kw):
    status = tmp_path / "safety-status.json"
    status.write_text("{}")
    proc = FakeProc()
    alarms = Alarms()
    return SafetyWatch(SimpleNamespace(safety=proc, status_path=str(status)), alarms, **kw), proc, alarms, status


def _age(path, seconds, now):
    os.utime(path, (now - seconds, now - seconds))


def test_dead_required_safety_returns_the_stop_message_once_with_one_alarm(tmp_path):
    w, proc, alarms, _ = _watch(tmp_path)
    assert w.check(10, 10.0) is None and not w.lost
    proc.code = -signal.SIGKILL
    msg = w.check(11, 11.0)
    assert msg and "killed by SIGKILL" in msg and "step 11" in msg
    assert w.check(12, 12.0) is None  # said once
    assert [a.kind for a in alarms.items] == ["safety_died"] and w.lost
    assert w.dead() == {"safety": "killed by SIGKILL"}


def test_dead_optional_safety_alarms_without_stopping(tmp_path):
    w, proc, alarms, _ = _watch(tmp_path, required=False)
    proc.code = 70
    assert w.check(5, 5.0) is None
    assert w.dead() == {"safety": "exited with code 70"} and alarms.items[0].kind == "safety_died"


def test_hang_raises_one_alarm_inactive_when_the_heartbeat_returns(tmp_path):
    w, proc, alarms, status = _watch(tmp_path, hang_s=2.0)
    now = 1_000_000.0
    _age(status, 1.5, now)
    assert w.check(1, 1.0, now_wall=now) is None and not alarms.items  # within hang_s
    _age(status, 2.5, now)
    assert w.check(2, 2.0, now_wall=now) is None  # hung: an alarm, never a stop
    assert w.check(3, 3.0, now_wall=now) is None
    assert [a.kind for a in alarms.items] == ["safety_hung"] and alarms.items[0].active and w.hangs == 1
    _age(status, 0.1, now)
    w.check(4, 4.0, now_wall=now)
    assert not alarms.items[0].active and "answers again at step 4" in alarms.items[0].message
    assert w.lost and w.dead() == {}


def test_missing_status_file_counts_as_no_heartbeat(tmp_path):
    w, proc, alarms, status = _watch(tmp_path)
    status.unlink()
    w.check(1, 1.0)
    assert [a.kind for a in alarms.items] == ["safety_hung"]  # fail closed


# ---- [safety] restart ----

class FakeRestart:
    def __init__(self, max_restarts=2, backoff_s=0.5, backoff_max_s=30.0):
        self.max_restarts, self.backoff_s, self.backoff_max_s = max_restarts, backoff_s, backoff_max_s

    def model_dump(self):
        return dict(vars(self))


class KillableProc(FakeProc):
    def __init__(self, pid):
        super().__init__()
        self.pid = pid
        self.signals = []

    def send_signal(self, sig):
        self.signals.append(sig)
        self.code = -sig


def _restarting(tmp_path, max_restarts=2, required=True, modes=None):
    """A watch with [safety] restart whose respawn records the mode it was asked for."""
    status = tmp_path / "safety-status.json"
    status.write_text('{"mode": "full"}')
    handles = SimpleNamespace(safety=KillableProc(100), status_path=str(status), safety_mode="limited")
    spawned = []

    def respawn(h, mode):
        spawned.append(mode)
        return KillableProc(101 + len(spawned))

    alarms = Alarms()
    w = SafetyWatch(handles, alarms, required=required, hang_s=2.0, restart=FakeRestart(max_restarts),
                    respawn=respawn)
    return w, handles, alarms, status, spawned


def test_restart_after_death_resumes_no_higher_than_configured_and_clears_the_alarm(tmp_path):
    w, h, alarms, status, spawned = _restarting(tmp_path)
    h.safety.code = -signal.SIGKILL
    assert w.check(10, 10.0, now=0.0) is None  # not a stop: a restart is due
    assert w.state == "down" and [a.kind for a in alarms.items] == ["safety_died"] and alarms.items[0].active
    assert w.check(11, 11.0, now=0.2) is None and not spawned  # within backoff_s (0.5 s)
    assert w.check(12, 12.0, now=0.6) is None
    # predecessor wrote "full", the scenario says "limited": the lower one; its status file is gone
    assert spawned == ["limited"] and w.state == "starting" and h.safety.pid == 102
    assert w.lost  # not up yet
    status.write_text('{"mode": "limited"}')  # the new process's first heartbeat
    w.check(13, 13.0, now=0.7)
    assert w.state == "up" and not w.lost and not alarms.items[0].active
    assert "restart #1" in alarms.items[0].message and "up again at step 13" in alarms.items[0].message
    assert w.dead() == {} and w.summary()["restarts"] == 1 and w.summary()["deaths"] == 1


def test_restart_budget_spent_stops_a_required_run(tmp_path):
    w, h, alarms, status, spawned = _restarting(tmp_path, max_restarts=1)
    h.safety.code = 1
    w.check(1, 1.0, now=0.0)
    w.check(2, 2.0, now=1.0)
    assert spawned == ["limited"]
    status.write_text("{}")
    w.check(3, 3.0, now=1.1)
    assert w.state == "up"
    h.safety.code = 1  # the second death: no restart left
    msg = w.check(4, 4.0, now=2.0)
    assert msg and "max_restarts = 1" in msg and w.state == "gave_up" and w.lost
    assert w.dead() == {"safety": "exited with code 1"}


def test_hung_safety_with_restart_is_killed_and_replaced_without_counting_a_death(tmp_path):
    w, h, alarms, status, spawned = _restarting(tmp_path)
    now_wall = 1_000_000.0
    _age(status, 3.0, now_wall)
    old = h.safety
    assert w.check(1, 1.0, now_wall=now_wall, now=0.0) is None
    assert old.signals == [signal.SIGKILL] and w.hangs == 1
    w.check(2, 2.0, now_wall=now_wall, now=0.1)  # its exit: scheduled, no new alarm
    assert w.deaths == 0 and [a.kind for a in alarms.items] == ["safety_hung"] and w.state == "down"
    w.check(3, 3.0, now_wall=now_wall, now=1.0)
    assert spawned == ["limited"]  # its last status said "full": no higher than the configured "limited"


def test_unreadable_predecessor_status_resumes_in_shadow(tmp_path):
    w, h, alarms, status, spawned = _restarting(tmp_path)
    status.write_text("not json")
    h.safety.code = -signal.SIGSEGV
    w.check(1, 1.0, now=0.0)
    w.check(2, 2.0, now=1.0)
    assert spawned == ["shadow"]


def test_final_look_starts_nothing(tmp_path):
    w, h, alarms, status, spawned = _restarting(tmp_path)
    h.safety.code = 1
    w.check(1, 1.0, now=0.0)
    w.check(2, 2.0, now=5.0, final=True)
    assert not spawned and w.lost and w.dead() == {"safety": "exited with code 1"}
