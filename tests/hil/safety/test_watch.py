"""hil/safety/watch.py without processes: a stand-in for the Popen and a status file whose age
the test sets (os.utime), so every branch is driven exactly."""

import os
import signal
from types import SimpleNamespace

from hil.health import Alarms
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
