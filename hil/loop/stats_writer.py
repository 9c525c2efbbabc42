"""The live-run stats file (hil/live_runs.py) written by a small child process, not by a thread
of the loop's process.

Why: in a real-time run every Python thread of the loop's process competes with the loop for
the GIL. The status thread (hil/loop/status.py) spent about 1 ms of GIL time per status tick
turning the lateness histogram into JSON and writing the file; at 10 kHz that made the loop
late by 100 to 700 us at every tick, and, at SCHED_OTHER, late by a whole scheduler tick
(4-5 ms) when the thread was preempted holding the GIL (hil/loop/rt.py, guard_threads). With
no user status callback (`hil run --quiet`, the benchmarks), the loop's process now has no
Python thread besides the loop: at the status tick the loop pickles the snapshot (tens of us)
and sends it, without blocking, over a Unix SEQPACKET socket to this writer (a snapshot that
does not fit is dropped and counted, as the status thread's are). The writer runs at normal
priority off the loop's CPU (hil/loop/children.py pids), exits at the socket's end or when its
parent dies.

    python -m hil.loop.stats_writer FD STATS_PATH
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys

_MAX_MESSAGE = 1 << 22  # bytes: a snapshot with a lateness histogram is ~25 kB


def stats_document(status: dict) -> dict:
    """The stats file's content for a status snapshot (live_runs.Announcement.update's format)."""
    from hil.live_runs import histogram_buckets

    out = {k: v for k, v in status.items() if k != "lateness_counts"}
    counts = status.get("lateness_counts")
    if counts is not None:
        out["lateness_hist_us"] = histogram_buckets(counts)
    return out


class StatsWriter:
    """Loop side: `offer(status)` never blocks; `close()` lets the writer finish and waits."""

    def __init__(self, stats_path: str):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "hil.loop.stats_writer", str(theirs.fileno()), str(stats_path)],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self.offered = 0
        self.dropped = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def offer(self, status: dict) -> None:
        """Send a snapshot (pickled); dropped (counted) if the writer is behind or gone."""
        self.offered += 1
        try:
            self._sock.send(pickle.dumps(status, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:  # BlockingIOError: the writer is behind; others: it is gone
            self.dropped += 1

    def close(self, timeout_s: float = 5.0) -> None:
        """End of the socket: the writer writes what it has and exits; killed after timeout_s."""
        if self._sock is None:
            return
        self._sock.close()
        self._sock = None
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def main(fd: int, stats_path: str) -> None:
    from hil.atomic import write_json_atomic
    from hil.loop.rt import die_with_parent

    if not die_with_parent():
        return
    sock = socket.socket(fileno=fd)
    while True:
        try:
            data = sock.recv(_MAX_MESSAGE)
        except InterruptedError:
            continue
        if not data:
            return
        status = pickle.loads(data)
        try:
            write_json_atomic(stats_path, stats_document(status))
        except OSError:
            pass  # a viewer misses one snapshot; the next tick writes again


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
    os._exit(0)
