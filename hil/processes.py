"""Whether a process exists: the one check the bus peers, the process image's stale-lock
sweep and the run-directory index share."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """True while process `pid` exists, ours or another user's (signal 0 is refused with
    EPERM for another user's process, which still exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
