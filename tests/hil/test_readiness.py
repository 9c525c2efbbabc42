"""hil/readiness.py: readiness by handshake; fail at once on a dead child, on a stuck one (no CPU
progress), never on a slow one that keeps working."""

import os
import subprocess
import sys

from hil import readiness


def test_cpu_seconds_counts_this_process_and_is_none_for_a_gone_one():
    before = readiness.cpu_seconds(os.getpid())
    x = 0
    while readiness.cpu_seconds(os.getpid()) == before:  # burn CPU until the counter moves (10 ms ticks)
        x += sum(range(10000))
    assert readiness.cpu_seconds(os.getpid()) > before
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert readiness.cpu_seconds(p.pid) is None  # reaped: no /proc entry


def test_ready_at_once():
    assert readiness.wait_ready(lambda: True, [os.getpid()], lambda: True) is None


def test_a_dead_child_fails_at_once_whatever_the_bound():
    p = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    why = readiness.wait_ready(lambda: False, [p.pid], lambda: p.poll() is None, stall_s=1e9, max_s=1e9)
    assert why is not None and "exited" in why


def test_a_child_that_makes_no_progress_is_stuck(monkeypatch):
    """CPU time frozen (the fake clock of the process's counter): stuck after stall_s."""
    monkeypatch.setattr(readiness, "cpu_seconds", lambda pid: 1.0)
    why = readiness.wait_ready(lambda: False, [12345], lambda: True, stall_s=0.2, max_s=1e9, poll_s=0.01)
    assert why is not None and "no progress" in why


def test_a_slow_child_that_keeps_working_is_waited_for_past_the_stall_bound(monkeypatch):
    """CPU time moving on every look: not stuck; ready on the 60th look (> stall_s of waiting)."""
    cpu = iter(range(1, 10**6))
    monkeypatch.setattr(readiness, "cpu_seconds", lambda pid: float(next(cpu)))
    looks = iter(range(10**6))
    why = readiness.wait_ready(lambda: next(looks) >= 60, [12345], lambda: True, stall_s=0.2, max_s=1e9,
                               poll_s=0.01)
    assert why is None


def test_max_s_bounds_a_child_that_works_and_never_answers(monkeypatch):
    cpu = iter(range(1, 10**6))
    monkeypatch.setattr(readiness, "cpu_seconds", lambda pid: float(next(cpu)))
    why = readiness.wait_ready(lambda: False, [12345], lambda: True, stall_s=1e9, max_s=0.3, poll_s=0.01)
    assert why is not None and "max_s" in why


def test_progress_of_a_real_sleeping_child_stalls():
    p = subprocess.Popen(["sleep", "30"])
    try:
        why = readiness.wait_ready(lambda: False, [p.pid], lambda: p.poll() is None, stall_s=0.5, max_s=1e9)
        assert why is not None and "no progress" in why
    finally:
        p.kill()
        p.wait()


def test_descendants_and_the_progress_of_a_tree():
    """A parent that only waits while its child works: stuck alone, moving as a tree."""
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'while True: pass']); "
            "print(p.pid, flush=True); p.wait()")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert child in readiness.descendants(parent.pid)
        alive = lambda: parent.poll() is None  # noqa: E731
        why = readiness.wait_ready(lambda: False, [parent.pid], alive, stall_s=1.0, max_s=3.0, tree=True)
        assert why is not None and "max_s" in why, why  # the busy child kept the tree moving
        why = readiness.wait_ready(lambda: False, [parent.pid], alive, stall_s=1.0, max_s=30.0)
        assert why is not None and "no progress" in why, why  # the parent alone sleeps in wait()
    finally:
        for pid in readiness.descendants(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()
