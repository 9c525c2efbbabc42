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


# ---- the loop's scheduling, as configured (loop.priority, loop.cpu) and as obtained ----

AUTO_PRIORITY = 80  # SCHED_FIFO priority of loop.priority = "auto": above kernel threads' default 50
_POLICY_NAMES = {getattr(os, n): n for n in ("SCHED_OTHER", "SCHED_FIFO", "SCHED_RR", "SCHED_BATCH", "SCHED_IDLE")
                 if hasattr(os, n)}


def current_scheduling(mlock: bool = False) -> dict:
    """What the calling thread actually has: policy, priority, cpus (affinity), mlock."""
    try:
        policy = _POLICY_NAMES.get(os.sched_getscheduler(0), str(os.sched_getscheduler(0)))
        priority = os.sched_getparam(0).sched_priority
    except OSError:
        policy, priority = "unknown", 0
    return {"policy": policy, "priority": priority, "cpus": sorted(os.sched_getaffinity(0)), "mlock": mlock}


def describe_scheduling(s: dict) -> str:
    """One short phrase: 'SCHED_FIFO 80 on CPU 1, memory locked' / 'SCHED_OTHER (normal) on CPUs 0-1'."""
    pol = s.get("policy", "?")
    head = f"{pol} {s.get('priority', 0)}" if pol in ("SCHED_FIFO", "SCHED_RR") else f"{pol} (normal)"
    cpus = s.get("cpus") or []
    if len(cpus) == 1:
        where = f"on CPU {cpus[0]}"
    elif cpus and cpus == list(range(cpus[0], cpus[-1] + 1)):
        where = f"on CPUs {cpus[0]}-{cpus[-1]}"
    else:
        where = f"on CPUs {','.join(map(str, cpus))}"
    return f"{head} {where}" + (", memory locked" if s.get("mlock") else "")


def _try_fifo(priority: int) -> OSError | None:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as exc:
        return exc
    return None


def apply_loop_scheduling(priority, cpu, child_pids=()) -> tuple[dict, list[str]]:
    """Give the calling (loop) thread its real-time scheduling; returns (obtained, warnings).

    priority: "auto" (SCHED_FIFO AUTO_PRIORITY, or the highest the rtprio limit allows, where
    permitted; else normal scheduling and ONE warning), an int 1..99 (SCHED_FIFO, a warning if
    refused) or 0 (normal scheduling, nothing tried).
    cpu: "auto" (with SCHED_FIFO and two CPUs or more: pin to the last CPU the process may use
    and move the helper processes `child_pids` off it; otherwise no pinning), an int >= 0
    (pin there, helpers kept off), or -1 (no pinning).
    Memory is locked (mlockall) whenever SCHED_FIFO is obtained.
    Call after every helper process has started: children inherit SCHED_FIFO.
    """
    warnings: list[str] = []
    slack = set_timer_slack(1)
    if slack:
        warnings.append(slack)
    fifo = False
    if priority == "auto":
        err = _try_fifo(AUTO_PRIORITY)
        if err is not None:
            try:
                import resource

                limit = resource.getrlimit(resource.RLIMIT_RTPRIO)[0]
            except (ImportError, OSError, ValueError):
                limit = 0
            if 0 < limit < AUTO_PRIORITY:
                err = _try_fifo(int(limit))
        fifo = err is None
        if not fifo:
            warnings.append(
                f"loop.priority = auto: SCHED_FIFO not permitted ({err.strerror or err}); the loop runs at "
                "normal priority, unpinned, so a busy Modbus/OPC UA master or any other load can make it "
                "overrun. Grant CAP_SYS_NICE or an rtprio limit (ulimit -r 80) to the user, or set "
                "loop.priority = 0 to choose normal scheduling without this warning.")
    elif int(priority) > 0:
        warn = set_fifo(int(priority))
        fifo = warn is None
        if warn:
            warnings.append(warn)
    pin = cpu
    if cpu == "auto":
        allowed = sorted(os.sched_getaffinity(0))
        pin = allowed[-1] if fifo and len(allowed) >= 2 else -1
    pin = int(pin)
    for warn in (keep_off_cpu(child_pids, pin), pin_cpu(pin)):
        if warn:
            warnings.append(warn)
    mlock = False
    if fifo:
        # Lock memory at normal priority, then take SCHED_FIFO back: mlockall faults in every
        # mapped page (seconds in a large process), and at SCHED_FIFO on the loop's CPU that
        # would starve every other real-time task there (seen: a 2.3 s stall of a second loop).
        prio = os.sched_getparam(0).sched_priority
        set_normal()
        warn = lock_memory()
        mlock = warn is None
        if warn:
            warnings.append(warn)
        err = _try_fifo(prio)
        if err is not None:
            warnings.append(f"SCHED_FIFO {prio} could not be restored after locking memory ({err.strerror or err})")
    obtained = current_scheduling(mlock)
    obtained["requested"] = {"priority": priority, "cpu": cpu}
    return obtained, warnings
