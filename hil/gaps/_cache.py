"""Keep Numba's on-disk cache of the gap kernels consistent across source edits.

Numba keys a cached function by its own source file only, but the gap kernels compile in
functions of other modules (pipeline._sense inlines sensor, latency, rng and arena code;
sensor inlines rng ...). After an edit of rng.py, say, a cached sensor_apply would keep the old
generator. `drop_stale()` runs when hil.gaps is imported, before anything is compiled: it
hashes the kernel modules' sources and removes this package's cache entries if they changed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

KERNEL_MODULES = ("rng", "arena", "sensor", "actuator", "latency", "pipeline")


def drop_stale() -> None:
    here = Path(__file__).parent
    try:
        digest = hashlib.sha256(b"".join(
            (here / f"{m}.py").read_bytes() for m in KERNEL_MODULES)).hexdigest()
        cache = here / "__pycache__"
        stamp = cache / "gap_kernels.sha256"
        if stamp.exists() and stamp.read_text() == digest:
            return
        for f in cache.glob("*.nb[ic]"):
            f.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:  # read-only tree: numba then compiles in memory as usual
        pass
