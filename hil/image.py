"""The process image: current inputs and outputs in shared memory, as in a PLC.

The image is the one exchange point between the loop and everything else (protocol
servers, bus bridge, tests). It lives in a POSIX shared-memory block, so processes that
did not start each other can attach by name.

Layout (all little-endian, 8-byte aligned):

    header   int64[16]   counters and timestamps (see H_* below)
    clock    float64[2]  sim time of the published outputs (s), spare
    inputs   float64[n_inputs]   commanded inputs, written by the drivers (PLC side)
    outputs  float64[n_outputs]  measured outputs, written by the loop only
    applied  float64[n_inputs]   inputs as applied to the plant, written by the loop only
    undo     float64[n_inputs]   inputs as they were before the write in progress (writers only)

Consistency: two seqlocks. `outputs`+`applied`+clock have one writer (the loop): it makes
the sequence odd, writes, makes it even; a reader copies and retries if the sequence was
odd or changed. `inputs` may have several writers (Modbus and OPC UA server processes, a
test): writers serialize on an `flock` of the image's own file (/dev/shm/<name>, mode 0600
as the block is: no separate lock file that a killed run would leave behind or another user
could lock), then use the inputs seqlock so that
the loop never takes a lock and never sees a torn multi-register write. The loop retries a
torn read a bounded number of times and otherwise keeps its previous inputs (counted), so a
writer descheduled mid-write can never stall the loop.

Dead or failed writers. A writer copies the inputs into `undo` (sequence even, under the
lock) before it makes the sequence odd, so an odd sequence always has the last complete
inputs beside it. A write that raises rolls back from `undo` and makes the sequence even
again before the exception leaves `write_inputs`. A writer that dies between the two
increments (SIGKILL) releases its `flock` by dying: whoever next holds the lock and finds
the sequence odd knows that writer is gone, rolls the inputs back from `undo` (the dead
write is all-or-nothing: nothing of it is kept) and makes the sequence even (counted in
H_IN_REPAIRS). Every writer does this before writing; the loop does it with a non-blocking
lock attempt (`repair_inputs`) once its reads have stayed torn for a few periods, so it
never waits for the next write; `read_inputs` does it while it waits, and gives up with
`InputsStale` after a bounded time when a live writer holds the lock (hung, stopped).

Ordering relies on x86-64's total store order and on every access being an opaque numpy
call from Python (no compiler reordering across them).
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from multiprocessing import shared_memory, resource_tracker

import numpy as np

from hil.processes import process_alive

MAGIC = 0x48494C494D414745  # "HILIMAGE"
VERSION = 2

H_MAGIC = 0
H_VERSION = 2
H_N_INPUTS = 2
H_N_OUTPUTS = 3
H_OUT_SEQ = 4  # seqlock of outputs/applied/clock
H_IN_SEQ = 5  # seqlock of inputs
H_STEP = 6  # loop step index of the published outputs
H_PUBLISH_NS = 7  # time.monotonic_ns() when the outputs were published
H_IN_WRITES = 8  # number of completed input writes
H_IN_WRITE_NS = 9  # time.monotonic_ns() of the last completed input write
H_IN_APPLIED_WRITES = 10  # H_IN_WRITES value the loop saw at its last input read
H_LOOP_STATE = 11  # one of LOOP_STATES
H_TORN_READS = 12  # loop input reads that gave up after retries
H_PERIOD_NS = 13  # loop wall period (ns), 0 in lockstep
H_IN_REPAIRS = 14  # odd input sequences left by a dead writer and rolled back
N_HEADER = 16
N_CLOCK = 2

LOOP_STATES = ("configured", "running", "stopped", "failed")


LOCK_TIMEOUT_S = 0.25  # wall s a writer waits for the writers' lock before giving up


class InputsStale(TimeoutError):
    """The inputs stayed mid-write past a reader's bound: a live writer holds the lock and
    does not finish (hung, stopped). A dead writer never causes this: it is repaired."""


def attach_untracked(name: str) -> shared_memory.SharedMemory:
    """Attach to an existing block without registering it with the resource tracker.

    Python 3.11 registers attached blocks too (bpo-39959): an unrelated process's tracker
    would unlink the block when that process exits, and a child sharing its parent's
    tracker would make the parent's later unlink fail. Only the creator tracks the block.
    """
    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None
    try:
        return shared_memory.SharedMemory(name=name, create=False)
    finally:
        resource_tracker.register = register


def unlink_image_of(pid: int) -> None:
    """Remove the images a process that died without closing had created (and the lock files
    hil versions before the in-image lock left beside them).

    Image names start with `hil_<creator pid>_`, so the block of a SIGKILLed loop can be
    found and freed by whoever outlives it (its recorder does this when orphaned).
    """
    import glob

    for path in glob.glob(f"/dev/shm/hil_{int(pid)}_*"):
        try:
            os.unlink(path)
        except OSError:
            pass


def remove_stale_lock_files() -> list[str]:
    """Remove `/dev/shm/hil_<pid>_*.lock` files of this user whose creator is dead.

    hil up to this version kept the writers' lock in such a file beside each image and
    removed it on a clean close only: every SIGKILLed run left one. Images lock their own
    file now; each new image sweeps what older runs left. Returns the paths removed.
    """
    import glob
    import re

    removed = []
    for path in glob.glob("/dev/shm/hil_*_*.lock"):
        m = re.fullmatch(r"/dev/shm/hil_(\d+)_\d+\.lock", path)
        if m is None:
            continue
        try:
            if os.lstat(path).st_uid != os.getuid() or process_alive(int(m.group(1))):
                continue
            os.unlink(path)
            removed.append(path)
        except OSError:
            continue
    return removed
    return True


@dataclass(frozen=True)
class OutputSnapshot:
    """A consistent copy of what the loop last published."""

    step: int
    sim_time_s: float
    publish_ns: int
    outputs: np.ndarray
    applied: np.ndarray


class ProcessImage:
    """Attach to (or create) the shared-memory image named `name`."""

    def __init__(self, shm: shared_memory.SharedMemory, owner: bool):
        self._shm = shm
        self.owner = owner
        self.name = shm.name
        buf = shm.buf
        self.header = np.ndarray((N_HEADER,), dtype=np.int64, buffer=buf, offset=0)
        if self.header[H_MAGIC] != MAGIC:
            raise ValueError(f"shared memory {shm.name!r} is not a hil process image")
        n_in = int(self.header[H_N_INPUTS])
        n_out = int(self.header[H_N_OUTPUTS])
        off = N_HEADER * 8
        self.clock = np.ndarray((N_CLOCK,), dtype=np.float64, buffer=buf, offset=off)
        off += N_CLOCK * 8
        self.inputs = np.ndarray((n_in,), dtype=np.float64, buffer=buf, offset=off)
        off += n_in * 8
        self.outputs = np.ndarray((n_out,), dtype=np.float64, buffer=buf, offset=off)
        off += n_out * 8
        self.applied = np.ndarray((n_in,), dtype=np.float64, buffer=buf, offset=off)
        off += n_in * 8
        self.undo = np.ndarray((n_in,), dtype=np.float64, buffer=buf, offset=off)
        self.n_inputs = n_in
        self.n_outputs = n_out
        # the writers' lock is an flock of the block's own file (each user opens it anew: flock
        # excludes per open file description); gone with the block, never a file of its own
        self._lock_path = f"/dev/shm/{self.name.lstrip('/')}"
        self._lock_fd: int | None = None
        self._repair_fd: int | None = None  # the loop's own open file: excludes this process's writers too

    # ---- life cycle ----
    @staticmethod
    def nbytes(n_inputs: int, n_outputs: int) -> int:
        return (N_HEADER + N_CLOCK + 3 * n_inputs + n_outputs) * 8

    @classmethod
    def create(cls, n_inputs: int, n_outputs: int, name: str | None = None) -> "ProcessImage":
        """Create a new image (the runtime does this once); `name` defaults to a unique one."""
        name = name or f"hil_{os.getpid()}_{time.monotonic_ns() % 10**9}"
        shm = shared_memory.SharedMemory(
            name=name, create=True, size=cls.nbytes(n_inputs, n_outputs)
        )
        header = np.ndarray((N_HEADER,), dtype=np.int64, buffer=shm.buf, offset=0)
        header[:] = 0
        header[H_VERSION] = VERSION
        header[H_N_INPUTS] = n_inputs
        header[H_N_OUTPUTS] = n_outputs
        header[H_MAGIC] = MAGIC
        del header
        img = cls(shm, owner=True)
        img.clock[:] = 0.0
        img.inputs[:] = 0.0
        img.undo[:] = 0.0
        img.outputs[:] = np.nan
        img.applied[:] = np.nan
        remove_stale_lock_files()
        return img

    @classmethod
    def attach(cls, name: str) -> "ProcessImage":
        """Attach to an image another process created."""
        return cls(attach_untracked(name), owner=False)

    def close(self) -> None:
        """Detach; the creator also removes the block."""
        for attr in ("header", "clock", "inputs", "outputs", "applied", "undo"):
            setattr(self, attr, None)
        for attr in ("_lock_fd", "_repair_fd"):
            fd = getattr(self, attr)
            if fd is not None:
                os.close(fd)
                setattr(self, attr, None)
        try:
            self._shm.close()
        except BufferError:
            return  # a caller still holds a view; the OS frees it at exit
        if self.owner:
            try:
                self._shm.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> "ProcessImage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- loop side (single writer of outputs) ----
    def publish(self, outputs: np.ndarray, applied: np.ndarray, step: int, sim_time_s: float) -> None:
        """Write measured outputs and applied inputs atomically for readers."""
        h = self.header
        h[H_OUT_SEQ] += 1  # odd: write in progress
        self.outputs[:] = outputs
        self.applied[:] = applied
        self.clock[0] = sim_time_s
        h[H_STEP] = step
        h[H_PUBLISH_NS] = time.monotonic_ns()
        h[H_OUT_SEQ] += 1  # even: stable

    def read_inputs_into(self, dst: np.ndarray, max_tries: int = 64, mark_applied: bool = True) -> bool:
        """Copy the commanded inputs into dst; False (dst untouched) if every try was torn.

        The loop reads with mark_applied=True: it records which input write it has taken
        (write-to-effect measurement) and counts torn reads; other readers must not.
        """
        h = self.header
        for _ in range(max_tries):
            s0 = int(h[H_IN_SEQ])
            if s0 & 1:
                continue
            writes = int(h[H_IN_WRITES])
            np.copyto(dst, self.inputs)
            if int(h[H_IN_SEQ]) == s0:
                if mark_applied:
                    h[H_IN_APPLIED_WRITES] = writes
                return True
        if mark_applied:
            h[H_TORN_READS] += 1
        return False

    def set_loop_state(self, state: str) -> None:
        self.header[H_LOOP_STATE] = LOOP_STATES.index(state)

    @property
    def loop_state(self) -> str:
        return LOOP_STATES[int(self.header[H_LOOP_STATE])]

    # ---- driver side (many writers of inputs) ----
    def _lock(self, timeout_s: float = LOCK_TIMEOUT_S) -> int:
        """The writers' lock, waited for at most `timeout_s` (wall s): a writer that hangs holding
        it (stopped, deadlocked) must not freeze every other writer, e.g. a protocol server's event
        loop. Raises InputsStale when the wait runs out."""
        if self._lock_fd is None:
            self._lock_fd = os.open(self._lock_path, os.O_RDWR)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self._lock_fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise InputsStale(f"process image {self.name}: another writer has held the inputs' lock "
                                      f"for more than {timeout_s:g} s (hung or stopped); write refused") from None
                time.sleep(0.0005)

    def _repair_locked(self) -> bool:
        """With the writers' lock held: an odd sequence was left by a writer that died
        mid-write (a live one would hold the lock). Roll its write back; True if repaired."""
        h = self.header
        if not int(h[H_IN_SEQ]) & 1:
            return False
        np.copyto(self.inputs, self.undo)
        h[H_IN_SEQ] += 1
        h[H_IN_REPAIRS] += 1
        return True

    def write_inputs(self, indices, values) -> int:
        """Write values to the inputs at `indices` as one atomic update; returns write count.

        All or nothing: if the assignment raises (bad index, shape), the inputs are rolled
        back, the sequence is made even again and the exception propagates. Validation
        (bounds, ownership, finiteness) is the caller's job: the image stores what it is given.
        """
        fd = self._lock()
        try:
            h = self.header
            self._repair_locked()  # a previous writer died mid-write
            np.copyto(self.undo, self.inputs)
            h[H_IN_SEQ] += 1  # odd: write in progress
            try:
                self.inputs[np.asarray(indices, dtype=np.intp)] = values
            except BaseException:
                np.copyto(self.inputs, self.undo)
                h[H_IN_SEQ] += 1
                raise
            h[H_IN_SEQ] += 1  # even: stable
            h[H_IN_WRITES] += 1
            h[H_IN_WRITE_NS] = time.monotonic_ns()
            return int(h[H_IN_WRITES])
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def repair_inputs(self) -> bool | None:
        """Roll back a write whose writer died, without ever blocking (the loop's call).

        Returns True if an odd sequence was repaired, False if there was nothing to repair,
        None if a live writer holds the lock (it may be mid-write; it is not dead).
        """
        if self._repair_fd is None:
            self._repair_fd = os.open(self._lock_path, os.O_RDWR)
        try:
            fcntl.flock(self._repair_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        try:
            return self._repair_locked()
        finally:
            fcntl.flock(self._repair_fd, fcntl.LOCK_UN)

    def read_inputs(self, timeout_s: float = 0.25) -> np.ndarray:
        """A consistent copy of the commanded inputs (readers other than the loop).

        Waits at most `timeout_s` (s) for a write in progress, repairing one a dead writer
        left; raises `InputsStale` if a live writer keeps the inputs mid-write that long.
        """
        dst = np.empty(self.n_inputs)
        deadline = time.monotonic() + timeout_s
        tries = 0
        while not self.read_inputs_into(dst, mark_applied=False):
            tries += 1
            if tries % 16 == 0 and self.repair_inputs():
                continue
            if time.monotonic() >= deadline:
                raise InputsStale(
                    f"process image {self.name}: inputs stayed mid-write for {timeout_s:g} s "
                    "(a writer holds the lock and does not finish: hung or stopped)")
            time.sleep(0 if tries < 64 else 0.001)
        return dst

    def set_period(self, period_s: float) -> None:
        """Record the loop's wall period (0 in lockstep) for servers that pace themselves."""
        self.header[H_PERIOD_NS] = int(round(period_s * 1e9))

    @property
    def period_s(self) -> float:
        return int(self.header[H_PERIOD_NS]) * 1e-9

    # ---- reader side (servers, tests) ----
    def snapshot(self, max_tries: int = 10_000) -> OutputSnapshot:
        """A consistent copy of the last published outputs, applied inputs and clock."""
        h = self.header
        out = np.empty(self.n_outputs)
        app = np.empty(self.n_inputs)
        for i in range(max_tries):
            s0 = int(h[H_OUT_SEQ])
            if s0 & 1:
                if i > 100:
                    time.sleep(0)
                continue
            np.copyto(out, self.outputs)
            np.copyto(app, self.applied)
            t = float(self.clock[0])
            step = int(h[H_STEP])
            ns = int(h[H_PUBLISH_NS])
            if int(h[H_OUT_SEQ]) == s0:
                return OutputSnapshot(step, t, ns, out, app)
        raise TimeoutError("process image: outputs stayed torn (writer died mid-publish?)")

    def counters(self) -> dict[str, int]:
        h = self.header
        return {
            "step": int(h[H_STEP]),
            "input_writes": int(h[H_IN_WRITES]),
            "input_writes_applied": int(h[H_IN_APPLIED_WRITES]),
            "torn_input_reads": int(h[H_TORN_READS]),
            "input_repairs": int(h[H_IN_REPAIRS]),
            "loop_state": LOOP_STATES[int(h[H_LOOP_STATE])],
        }
