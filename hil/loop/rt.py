"""Real-time knobs of the loop's process: SCHED_FIFO, CPU pinning, memory locking, timer slack,
and the process's other threads (guard_threads).

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


# ---- the loop process's other threads: no GIL holder left preempted ----
#
# The loop thread needs the GIL for the Python part of every period. Any other Python thread of
# its process (the status thread, hil/loop/status.py) takes the GIL whenever the loop sleeps.
# At SCHED_OTHER that thread can be preempted by any normal process while it holds the GIL; the
# loop, woken before its deadline, then waits until the CFS runs the holder again: a scheduler
# tick (4 ms at CONFIG_HZ=250). Seen with `perf sched` at 10 kHz: the loop blocked on the GIL,
# the status thread runnable holding it, another process running for 5.0 ms on the loop's CPU,
# at the status ticks. A shorter switch interval alone does not help (the holder is not running
# to see the drop request). So the other Python threads run at SCHED_FIFO one below the loop,
# off the loop's CPU: nothing but real-time work preempts them while they hold the GIL, and the
# GIL switch interval is shortened to half the spin (at least 20 us) so that the loop, woken a
# spin before its deadline, forces the GIL back soon. Tried and rejected: the same Python
# threads on the loop's own CPU (they would run only while the loop sleeps): at 10 kHz, 6 s
# runs, load ~11, 192 overruns and a 4.5 ms stall against 53 and 1.1 ms off the CPU; with a
# 5 us switch interval there the loop and the thread livelocked (a 6 s run still going after
# 13 min). Better still is no such thread: the live-run stats file is written by a child
# process in real time (hil/loop/stats_writer.py); only a caller's on_status keeps a thread.

_SWITCH_INTERVAL_MIN_S = 20e-6


def thread_ids() -> tuple[int, list[int], set[int]]:
    """(the calling thread's tid, every other thread's tid, those of them that run Python code)."""
    import threading

    me = threading.get_native_id()
    try:
        tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:
        tids = []
    python = {t.native_id for t in threading.enumerate() if t.native_id is not None} - {me}
    return me, [t for t in tids if t != me], python


def guard_threads(loop_priority: int, loop_cpu: int | None, spin_s: float) -> tuple[dict, list[str]]:
    """Called by the loop thread once it has SCHED_FIFO `loop_priority` (pinned to `loop_cpu`, or
    None): every other Python thread of the process gets SCHED_FIFO one below the loop (a GIL
    holder that normal processes cannot preempt); every other thread, Python or not (OpenBLAS),
    leaves the loop's CPU; the GIL switch interval drops to half the spin (at least 20 us), so
    that the loop, woken `spin_s` before its deadline, takes the GIL back soon (see above).
    Returns (saved, warnings); `release_threads(saved)` undoes it all."""
    import sys

    _, others, python = thread_ids()
    saved: dict = {"switch_interval_s": sys.getswitchinterval(), "threads": []}
    warnings: list[str] = []
    helper_priority = max(1, int(loop_priority) - 1)
    every_cpu = set(range(os.cpu_count() or 1))
    failed = []
    for tid in others:
        try:
            state = (tid, os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority,
                     os.sched_getaffinity(tid))
        except OSError:
            continue  # gone
        saved["threads"].append(state)
        if loop_cpu is None:
            cpus = None
        else:
            cpus = (state[3] - {loop_cpu}) or (every_cpu - {loop_cpu})
        try:
            if cpus:
                os.sched_setaffinity(tid, cpus)
            if tid in python:
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(helper_priority))
        except OSError:
            failed.append(tid)
    if failed:
        warnings.append(f"threads {failed} of the loop's process could not be given their CPUs or SCHED_FIFO "
                        f"{helper_priority}: a Python thread among them may hold the GIL while preempted")
    sys.setswitchinterval(max(_SWITCH_INTERVAL_MIN_S, min(saved["switch_interval_s"], spin_s / 2)))
    return saved, warnings


def release_threads(saved: dict | None) -> None:
    """Undo guard_threads: the threads' policy, priority and CPUs, and the switch interval."""
    if not saved:
        return
    import sys

    sys.setswitchinterval(saved["switch_interval_s"])
    for tid, policy, priority, cpus in saved["threads"]:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(priority))
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass  # ended meanwhile

