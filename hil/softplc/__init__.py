"""SoftPLC: a Modbus TCP master with a fixed scan cycle running PID loops.

It is the hand-written baseline controller a policy is compared with, and it behaves
like a PLC, not like a function call: it only sees the plant through the Modbus map, on
its own scan clock, over one TCP connection, and it goes to safe outputs when the link
is lost. Configuration: hil/softplc/config.py; scan engine: hil/softplc/scan.py.

    stats = run_softplc(scenario, duration_s=60.0)        # blocks; returns counters
"""

from __future__ import annotations

import logging
import signal
import threading

from hil.softplc.scan import SoftPlc

__all__ = ["SoftPlc", "run_softplc"]


def run_softplc(scenario, duration_s: float | None = None, stop=None, *, record_path: str | None = None,
                host: str | None = None, port: int | None = None, on_scan=None) -> dict:
    """Run the scenario's SoftPLC until `duration_s` (wall s), `stop` (an Event) or SIGTERM/SIGINT.

    Returns the counters (scans, overruns, comm_errors, comm_losses, recoveries, ...);
    with `record_path` (or [softplc].record) the scan log is written there (.csv or
    .parquet) and its path returned under "record_path".
    """
    plc = SoftPlc(scenario, host=host, port=port)
    stop = stop if stop is not None else threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        stats = plc.run(duration_s, stop, on_scan)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    path = record_path or scenario.softplc.record
    if path:
        stats["record_path"] = plc.write_log(path)
    logging.getLogger("hil.softplc").info("softplc: %s", stats)
    return stats
