"""hil.loop.rt.apply_loop_scheduling: what loop.priority / loop.cpu ask for, and what is obtained.

The system calls are replaced by fakes, so these tests change nothing on the machine; the real
calls are exercised by tests/integration/test_run_cli.py (with and without CAP_SYS_NICE).
"""

import errno
import os

import pytest

from hil.loop import rt


@pytest.fixture
def fake_os(monkeypatch):
    state = {"policy": os.SCHED_OTHER, "priority": 0, "affinity": {0, 1}, "permitted": True, "moved": [],
             "mlock": 0}

    def setscheduler(pid, policy, param):
        if policy == os.SCHED_FIFO and not state["permitted"]:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        state["policy"], state["priority"] = policy, param.sched_priority

    def setaffinity(pid, cpus):
        if pid == 0:
            state["affinity"] = set(cpus)
        else:
            state["moved"].append((pid, set(cpus)))

    monkeypatch.setattr(os, "sched_setscheduler", setscheduler)
    monkeypatch.setattr(os, "sched_getscheduler", lambda pid: state["policy"])
    monkeypatch.setattr(os, "sched_getparam", lambda pid: os.sched_param(state["priority"]))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(state["affinity"]))
    monkeypatch.setattr(os, "sched_setaffinity", setaffinity)
    monkeypatch.setattr(os, "listdir", lambda path: ["4242"] if path.endswith("/task") else [])
    monkeypatch.setattr(rt, "lock_memory", lambda: state.__setitem__("mlock", state["mlock"] + 1))
    monkeypatch.setattr(rt, "set_timer_slack", lambda ns=1: None)
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (0, 0))
    return state


def test_auto_where_permitted_is_fifo_80_pinned_to_the_last_cpu_helpers_off_it(fake_os):
    got, warnings = rt.apply_loop_scheduling("auto", "auto", child_pids=[1234])
    assert warnings == []
    assert (got["policy"], got["priority"], got["cpus"], got["mlock"]) == ("SCHED_FIFO", 80, [1], True)
    assert fake_os["moved"] == [(4242, {0})]  # the helper's thread was moved off CPU 1
    assert got["requested"] == {"priority": "auto", "cpu": "auto"}


def test_auto_where_not_permitted_falls_back_with_one_warning_and_no_pinning(fake_os):
    fake_os["permitted"] = False
    got, warnings = rt.apply_loop_scheduling("auto", "auto", child_pids=[1234])
    assert len(warnings) == 1 and "SCHED_FIFO not permitted" in warnings[0] and "loop.priority = 0" in warnings[0]
    assert (got["policy"], got["cpus"], got["mlock"]) == ("SCHED_OTHER", [0, 1], False)
    assert fake_os["moved"] == [] and fake_os["mlock"] == 0


def test_auto_uses_a_lower_rtprio_limit(fake_os, monkeypatch):
    import resource

    def setscheduler(pid, policy, param):
        if param.sched_priority > 40:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        fake_os["policy"], fake_os["priority"] = policy, param.sched_priority

    monkeypatch.setattr(os, "sched_setscheduler", setscheduler)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (40, 40))
    got, warnings = rt.apply_loop_scheduling("auto", -1)
    assert warnings == [] and (got["policy"], got["priority"], got["cpus"]) == ("SCHED_FIFO", 40, [0, 1])


def test_explicit_values_keep_working(fake_os):
    got, warnings = rt.apply_loop_scheduling(0, -1)
    assert warnings == [] and got["policy"] == "SCHED_OTHER" and fake_os["mlock"] == 0
    got, warnings = rt.apply_loop_scheduling(50, 0)
    assert (got["policy"], got["priority"], got["cpus"], got["mlock"]) == ("SCHED_FIFO", 50, [0], True)
    fake_os["permitted"] = False
    got, warnings = rt.apply_loop_scheduling(70, -1)
    assert len(warnings) == 1 and "SCHED_FIFO 70 not permitted" in warnings[0]


def test_auto_on_one_cpu_does_not_pin(fake_os):
    fake_os["affinity"] = {0}
    got, _ = rt.apply_loop_scheduling("auto", "auto")
    assert got["policy"] == "SCHED_FIFO" and got["cpus"] == [0] and fake_os["moved"] == []


def test_describe():
    assert rt.describe_scheduling({"policy": "SCHED_FIFO", "priority": 80, "cpus": [1], "mlock": True}) == \
        "SCHED_FIFO 80 on CPU 1, memory locked"
    assert rt.describe_scheduling({"policy": "SCHED_OTHER", "priority": 0, "cpus": [0, 1]}) == \
        "SCHED_OTHER (normal) on CPUs 0-1"


def test_memory_is_locked_at_normal_priority_then_fifo_is_restored(fake_os, monkeypatch):
    """mlockall faults in every page (seconds in a big process): done at SCHED_FIFO on the loop's
    CPU it would starve any other real-time task there, so it runs at normal priority."""
    seen = []
    monkeypatch.setattr(rt, "lock_memory", lambda: seen.append(fake_os["policy"]))
    got, warnings = rt.apply_loop_scheduling("auto", "auto")
    assert seen == [os.SCHED_OTHER]
    assert warnings == [] and (got["policy"], got["priority"], got["mlock"]) == ("SCHED_FIFO", 80, True)


# ---- guard_threads: the loop process's other threads while it runs at SCHED_FIFO ----


@pytest.fixture
def fake_threads(monkeypatch):
    """Two other threads: 4242 runs Python (the status thread), 4243 does not (OpenBLAS)."""
    import sys

    threads = {4242: [os.SCHED_OTHER, 0, {0, 1}], 4243: [os.SCHED_OTHER, 0, {0, 1}]}

    def setscheduler(tid, policy, param):
        threads[tid][0], threads[tid][1] = policy, param.sched_priority

    def setaffinity(tid, cpus):
        threads[tid][2] = set(cpus)

    monkeypatch.setattr(rt, "thread_ids", lambda: (4241, [4242, 4243], {4242}))
    monkeypatch.setattr(os, "sched_setscheduler", setscheduler)
    monkeypatch.setattr(os, "sched_getscheduler", lambda tid: threads[tid][0])
    monkeypatch.setattr(os, "sched_getparam", lambda tid: os.sched_param(threads[tid][1]))
    monkeypatch.setattr(os, "sched_getaffinity", lambda tid: set(threads[tid][2]))
    monkeypatch.setattr(os, "sched_setaffinity", setaffinity)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    old = sys.getswitchinterval()
    yield threads
    sys.setswitchinterval(old)


def test_guard_threads_makes_python_threads_fifo_below_the_loop_and_moves_all_off_its_cpu(fake_threads):
    import sys

    before = sys.getswitchinterval()
    saved, warnings = rt.guard_threads(80, 1, spin_s=50e-6)
    assert warnings == []
    assert fake_threads[4242] == [os.SCHED_FIFO, 79, {0}]  # a GIL holder only real-time work preempts
    assert fake_threads[4243] == [os.SCHED_OTHER, 0, {0}]  # no Python: policy left alone, off the CPU
    assert sys.getswitchinterval() == pytest.approx(25e-6)  # half the spin: the GIL back before the deadline
    rt.release_threads(saved)
    assert fake_threads[4242] == [os.SCHED_OTHER, 0, {0, 1}]
    assert fake_threads[4243] == [os.SCHED_OTHER, 0, {0, 1}]
    assert sys.getswitchinterval() == pytest.approx(before)


def test_guard_threads_switch_interval_has_a_floor_and_no_pinning_moves_nothing(fake_threads):
    import sys

    saved, _ = rt.guard_threads(1, None, spin_s=10e-6)
    assert sys.getswitchinterval() == pytest.approx(20e-6)  # never below 20 us (livelock seen at 5 us)
    assert fake_threads[4242] == [os.SCHED_FIFO, 1, {0, 1}]  # priority at least 1; CPUs untouched
    assert fake_threads[4243][2] == {0, 1}
    rt.release_threads(saved)
    rt.release_threads(None)  # nothing guarded: a no-op


def test_guard_threads_reports_a_thread_it_cannot_change(fake_threads, monkeypatch):
    def refuse(tid, policy, param):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    _, warnings = rt.guard_threads(80, 1, spin_s=50e-6)
    assert len(warnings) == 1 and "4242" in warnings[0] and "GIL" in warnings[0]


def test_thread_ids_finds_a_python_thread():
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        me, others, python = rt.thread_ids()
        assert me == threading.get_native_id() and me not in others
        assert t.native_id in others and t.native_id in python
    finally:
        stop.set()
        t.join()
