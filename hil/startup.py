"""Undoing a start that failed: what a run that never stepped leaves behind is removed.

A run whose servers or policy processes could not start has recorded no row; its recording
directory holds only the files written at start (`_meta.json`) or at the servers' shutdown
(request log, client counters). Those are removed, and the directory if it is then empty;
anything else in it (a directory the user named that already held files, parts of rows) is
left alone.
"""

from __future__ import annotations

from pathlib import Path

START_FILES = ("_meta.json", "._meta.json.tmp", "_modbus_requests.jsonl", "_modbus_clients.json",
               "_dual_writable.txt")


def discard_recording(directory: str | Path) -> bool:
    """Remove a recording that has no rows; True if the directory is gone."""
    d = Path(directory)
    if not d.is_dir() or any(d.glob("part-*.parquet")):
        return False
    for name in START_FILES:
        try:
            (d / name).unlink()
        except FileNotFoundError:
            pass
    try:
        d.rmdir()
    except OSError:  # not empty: not ours to remove
        return False
    return True
