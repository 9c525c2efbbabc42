"""The recording digest of a campaign run: sha256 over every deterministic column (all but
the wall-clock ones), which `hil campaign replay` compares bit for bit."""

from __future__ import annotations

import hashlib

import numpy as np

NONDETERMINISTIC = ("wall_ns", "lateness_us")


def recording_digest(df) -> str:
    """sha256 over the deterministic columns (name + float64 bytes), in column order."""
    h = hashlib.sha256()
    for col in df.columns:
        if col in NONDETERMINISTIC:
            continue
        h.update(col.encode())
        h.update(np.ascontiguousarray(df[col].to_numpy(dtype=np.float64)).tobytes())
    return h.hexdigest()
