"""Real-time knobs of the loop's process: SCHED_FIFO, CPU pinning, memory locking, timer slack.

Each returns None on success or a warning string saying what failed and why, so that a
user without privileges gets a clear message and a run that still works (with worse
jitter), never an exception.

Trap: children inherit SCHED_FIFO. Start every helper process (servers, recorder, policy,
safety) first and raise the loop's priority last, or a spinning child starves the machine.
"""

from __future__ import annotations

import ctypes
import os

_MCL_CURRENT, _MCL_FUTURE = 1, 2
_PR_SET_TIMERSLACK = 29


def _libc():
    return ctypes.CDLL("libc.so.6", use_errno=True)


def set_fifo(priority: int) -> str | None:
    """SCHED_FIFO at `priority` (1..99) for the calling process; 0 leaves the policy alone."""
    if priority <= 0:
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (PermissionError, OSError) as exc:
        return (
            f"SCHED_FIFO {priority} not permitted ({exc.strerror or exc}); running at normal "
            "priority: expect lateness p99 of hundreds of us. Grant CAP_SYS_NICE or an rtprio "
            "limit (ulimit -r) to the user."
        )
    return None


def set_normal() -> None:
    """Back to SCHED_OTHER (used by children that must not inherit FIFO)."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass


def pin_cpu(cpu: int) -> str | None:
    """Pin the calling process to one CPU; -1 leaves the affinity alone."""
    if cpu < 0:
        return None
    try:
        os.sched_setaffinity(0, {cpu})
    except (OSError, ValueError) as exc:
        return f"cannot pin to CPU {cpu} ({exc}); available: {sorted(os.sched_getaffinity(0))}"
    return None


def lock_memory() -> str | None:
    """mlockall(MCL_CURRENT | MCL_FUTURE): no page faults in the loop after start-up."""
    libc = _libc()
    if libc.mlockall(_MCL_CURRENT | _MCL_FUTURE) != 0:
        return f"mlockall failed (errno {ctypes.get_errno()}); page faults may add latency"
    return None


def set_timer_slack(ns: int = 1) -> str | None:
    """Shrink the kernel's timer slack (default 50 us for normal threads) to `ns`."""
    libc = _libc()
    if libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0) != 0:
        return f"PR_SET_TIMERSLACK failed (errno {ctypes.get_errno()})"
    return None


def keep_off_cpu(pids, cpu: int) -> str | None:
    """Move every thread of the processes `pids` off `cpu` (the loop's), onto the others.

    With the loop pinned, its helpers (recorder, servers, policy, safety) wake up, fault
    pages and take interrupts elsewhere. Threads are moved one by one: affinity is per
    thread, and zmq, asyncio and Arrow start threads of their own.
    """
    if cpu < 0:
        return None
    others = set(os.sched_getaffinity(0)) - {cpu} or None
    if others is None:
        try:
            others = set(range(os.cpu_count() or 1)) - {cpu}
        except Exception:
            others = set()
    if not others:
        return f"no CPU left besides the loop's CPU {cpu}: helpers share it"
    failed = []
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, others)
            except OSError:
                failed.append(tid)
    return f"could not move threads {failed} off CPU {cpu}" if failed else None


_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = 15) -> bool:
    """Ask the kernel to send `sig` (default SIGTERM) to this process when its parent dies.

    For helper processes (protocol servers) that must not outlive a loop killed with
    SIGKILL. Returns False if the parent is already gone (the caller should exit).
    """
    parent = os.getppid()
    _libc().prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0)
    return os.getppid() == parent and parent != 1
