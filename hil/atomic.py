"""Atomic file writes: a reader sees the previous file or the new one, never a torn one.

The text goes to a temporary file beside the target (same directory, so same filesystem),
then `os.replace` swaps it in (atomic on POSIX). The temporary name carries the writer's pid,
so two processes writing the same target never share a temporary file. No fsync: these are
status and result files, rewritten or recomputed after a crash, not a database.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically (parent directories created)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f"{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike, data, *, indent: int | None = None, default=None) -> None:
    """json.dumps(data) written atomically; `default` as json.dumps's (objects it cannot encode)."""
    write_text_atomic(path, json.dumps(data, indent=indent, default=default))
