"""Rate-limited one-line logging: a client cannot flood the server's log."""

import logging

from adapters.ratelog import RateLimitedLog


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_burst_then_counted_then_one_summary_line_per_window(caplog):
    clock = Clock()
    rl = RateLimitedLog(logging.getLogger("hil.test"), burst=3, interval_s=10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="hil.test"):
        logged = [rl.warning("fc", "request %d refused", k) for k in range(1000)]
        assert logged == [True] * 3 + [False] * 997
        rl.warning("other", "another kind of event")  # its own budget
        clock.t += 10.0
        assert rl.warning("fc", "request %d refused", 1000)
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["request 0 refused", "request 1 refused", "request 2 refused",
                    "further 'fc' events are counted, logged at most 3 per 10 s",
                    "another kind of event",
                    "997 more like 'fc' suppressed in the last 10 s",
                    "request 1000 refused"]
    assert rl.suppressed_total == 997
    assert not any(r.exc_info for r in caplog.records)


def test_the_key_table_is_bounded():
    rl = RateLimitedLog(logging.getLogger("hil.test"), max_keys=8, clock=Clock())
    for k in range(100):
        rl.info(f"peer{k}", "x")
    assert len(rl._windows) <= 8
