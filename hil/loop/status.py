"""The status line, off the loop's path.

The loop hands a snapshot (a small dict built at the status tick) to `StatusReporter.offer`,
which never blocks: the newest snapshot replaces one not yet shown (counted as dropped). A
daemon thread calls the user's callback (e.g. a write to stderr). A callback that blocks
(a full pipe nobody reads, a hung terminal) blocks only that thread; the loop keeps its
deadlines and the run ends at its duration. The thread is started before the loop raises
its priority and pins itself, so it keeps normal scheduling (Linux scheduling attributes
are per thread and inherited at creation).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable


class StatusReporter:
    def __init__(self, callback: Callable[[dict], None], name: str = "hil-status"):
        self.callback = callback
        self._slot: deque = deque(maxlen=1)
        self._wake = threading.Event()
        self._closed = False
        self.offered = 0
        self.shown = 0
        self.errors = 0
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def offer(self, status: dict) -> None:
        """Queue a snapshot for display; never blocks (a pending older one is replaced)."""
        self.offered += 1
        self._slot.append(status)
        self._wake.set()

    @property
    def dropped(self) -> int:
        """Snapshots never shown: replaced while the callback was busy, or left at close."""
        return self.offered - self.shown - self.errors

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                status = self._slot.popleft()
            except IndexError:
                if self._closed:
                    return
                continue
            try:
                self.callback(status)
                self.shown += 1
            except Exception as exc:  # a broken status sink must not end the run
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"

    def close(self, timeout_s: float = 1.0) -> bool:
        """Let the thread show what is pending, wait at most timeout_s (s); True if it ended.
        A thread stuck in its callback is left behind (daemon: it does not hold the exit)."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
