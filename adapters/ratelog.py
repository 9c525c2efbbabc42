"""Rate-limited one-line logging for the protocol servers.

Anything a client can trigger at will (an unserved function code, a refused connection,
an undecodable frame) must not let that client flood the log: each kind of event logs at
most `burst` lines per `interval_s` seconds, then is only counted; when the window rolls
over one line says how many were suppressed. Never a traceback: callers pass the
exception's class and message as arguments.

    rl = RateLimitedLog(logging.getLogger("hil.modbus"), burst=5, interval_s=10.0)
    rl.warning("fc", "modbus: %s asked for function code %d: ILLEGAL FUNCTION", peer, fc)

The key ("fc" above) groups events; at most `max_keys` keys are tracked (the table is
cleared beyond that, so a client cannot grow it either).
"""

from __future__ import annotations

import logging
import time

DEFAULT_BURST = 5
DEFAULT_INTERVAL_S = 10.0


class RateLimitedLog:
    """At most `burst` lines per key per `interval_s` (seconds, monotonic clock)."""

    def __init__(self, logger: logging.Logger, burst: int = DEFAULT_BURST,
                 interval_s: float = DEFAULT_INTERVAL_S, max_keys: int = 256, clock=time.monotonic):
        self.logger = logger
        self.burst = burst
        self.interval_s = interval_s
        self.max_keys = max_keys
        self.clock = clock
        self._windows: dict[str, list] = {}  # key -> [window start s, lines logged, suppressed]
        self.suppressed_total = 0

    def log(self, level: int, key: str, msg: str, *args) -> bool:
        """Log one line unless the key's budget is spent; returns whether it was logged."""
        now = self.clock()
        w = self._windows.get(key)
        if w is None:
            if len(self._windows) >= self.max_keys:
                self._windows.clear()
            w = self._windows[key] = [now, 0, 0]
        elif now - w[0] >= self.interval_s:
            if w[2]:
                self.logger.log(level, "%d more like %r suppressed in the last %.0f s", w[2], key,
                                now - w[0])
            w[0], w[1], w[2] = now, 0, 0
        if w[1] < self.burst:
            w[1] += 1
            self.logger.log(level, msg, *args)
            if w[1] == self.burst:
                self.logger.log(level, "further %r events are counted, logged at most %d per %.0f s",
                                key, self.burst, self.interval_s)
            return True
        w[2] += 1
        self.suppressed_total += 1
        return False

    def warning(self, key: str, msg: str, *args) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def info(self, key: str, msg: str, *args) -> bool:
        return self.log(logging.INFO, key, msg, *args)

    def error(self, key: str, msg: str, *args) -> bool:
        return self.log(logging.ERROR, key, msg, *args)
