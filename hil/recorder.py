"""Recording: the loop appends one row per step to a shared-memory ring; a separate
recorder process drains it into Parquet parts.

Why a process: writing Parquet holds the GIL for stretches of Python code; in the loop's
interpreter that shows up as late wake-ups. The loop's per-step cost is one row copy.

On disk, a recording is a directory:

    _meta.json             scenario, plant spec (units), columns, drawn randomization, summary
    part-000000.parquet    rows, written every `flush_interval_s` of wall time
    part-000001.parquet    ...

Each part is written to a temporary name and renamed, so a run killed with SIGKILL leaves
only whole parts: it loses at most the last flush interval (default 1 s), and
`pandas.read_parquet(directory)` or `read_recording(directory)` reads the rest. If only the
loop is killed, the recorder notices its parent is gone, writes what the ring still
holds, and frees the ring and the dead loop's process image before it exits.

Columns: step, t_s (simulated s at the end of the step), wall_ns (monotonic ns at the
start of the step), lateness_us, cmd.<input> (commanded), app.<input> (applied to the
plant), x.<state> (true state), y.<output> (true output), meas.<output> (measured, as
served), z.<algebraic> (algebraic unknowns), d.<discrete> (discrete state, exact integers),
plant units. Types on disk (`_meta.json` "dtypes", `column_dtypes`): `step` and `wall_ns`
int64; each d.<discrete> column the smallest of int8/int16/int32/int64 that holds its bounds
(a breaker status 0/1 and an island label -1..117 are int8); every other column float64
(inputs, outputs and measurements can be non-finite: a dropout, a PLC's write). The ring
between loop and writer stays float64 (integers below 2**53 are exact in it); the writer
casts. Array signals are recorded per element (`y.node_3.temp`, ...);
`_meta.json` "groups" maps each array group (`outputs.node.temp`) to [start, size, unit].
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from hil.image import attach_untracked, unlink_image_of

# ring header (int64): write count, read count, closed flag, dropped rows, n_cols, capacity
R_WRITE, R_READ, R_CLOSED, R_DROPPED, R_NCOLS, R_CAP = range(6)
N_RING_HEADER = 8


def columns_for(spec) -> list[str]:
    """Column names of a recording of a plant with this spec, in row order."""
    return (
        ["step", "t_s", "wall_ns", "lateness_us"]
        + [f"cmd.{n}" for n in spec.names("inputs")]
        + [f"app.{n}" for n in spec.names("inputs")]
        + [f"x.{n}" for n in spec.names("states")]
        + [f"y.{n}" for n in spec.names("outputs")]
        + [f"meas.{n}" for n in spec.names("outputs")]
        + [f"z.{n}" for n in spec.names("algebraic")]
        + [f"d.{n}" for n in spec.names("discrete")]
    )


INT_DTYPES = ("int8", "int16", "int32", "int64")


def _int_dtype(low: float, high: float) -> str:
    for name in INT_DTYPES:
        info = np.iinfo(name)
        if info.min <= low and high <= info.max:
            return name
    return "int64"


def column_dtypes(spec) -> dict[str, str]:
    """Columns recorded with an integer type (see the module docstring); the rest are float64."""
    out = {"step": "int64", "wall_ns": "int64"}
    for q in spec.discrete:
        out[f"d.{q.name}"] = _int_dtype(q.low, q.high)
    return out


def _typed(col: np.ndarray, dtype: str) -> np.ndarray:
    """A float64 ring column as `dtype`: integers by construction (exact below 2**53); a value that
    is not (it cannot happen for these columns) reads as the type's minimum, never wraps."""
    info = np.iinfo(dtype)
    ok = np.isfinite(col) & (col >= info.min) & (col <= info.max)
    return np.where(ok, np.rint(np.where(ok, col, 0.0)), info.min).astype(dtype)


def _write_part(directory: Path, index: int, columns: list[str], rows: np.ndarray,
                dtypes: dict[str, str] | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    dtypes = dtypes or {}
    arrays = [pa.array(_typed(rows[:, j], dtypes[c]) if c in dtypes else rows[:, j]) for j, c in enumerate(columns)]
    table = pa.Table.from_arrays(arrays, names=columns)
    tmp = directory / f".part-{index:06d}.parquet.tmp"
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, directory / f"part-{index:06d}.parquet")


def _recorder_main(shm_name: str, directory: str, columns: list[str], flush_interval_s: float, parent_pid: int,
                   ready=None, dtypes: dict[str, str] | None = None) -> None:
    """Recorder process: drain the ring into parts until closed or orphaned."""
    import pyarrow.parquet  # noqa: F401  (load the libraries now, not at the first flush)

    from hil.loop.rt import set_normal

    set_normal()
    if ready is not None:
        ready.set()
    shm = attach_untracked(shm_name)
    header = np.ndarray((N_RING_HEADER,), dtype=np.int64, buffer=shm.buf)
    cap, ncols = int(header[R_CAP]), int(header[R_NCOLS])
    ring = np.ndarray((cap, ncols), dtype=np.float64, buffer=shm.buf, offset=N_RING_HEADER * 8)
    out = Path(directory)
    part = 0
    while True:
        closed = bool(header[R_CLOSED])
        orphaned = os.getppid() != parent_pid
        w, r = int(header[R_WRITE]), int(header[R_READ])
        if w > r:
            idx = np.arange(r, w) % cap
            rows = ring[idx].copy()
            header[R_READ] = w  # after the copy: the loop may reuse these slots now
            _write_part(out, part, columns, rows, dtypes)
            part += 1
        if closed or orphaned:
            break
        deadline = time.monotonic() + flush_interval_s
        while time.monotonic() < deadline and not header[R_CLOSED] and os.getppid() == parent_pid:
            # wake early if the ring is more than half full (fast lockstep runs)
            if int(header[R_WRITE]) - int(header[R_READ]) > cap // 2:
                break
            time.sleep(min(0.05, flush_interval_s))
    del header, ring
    shm.close()
    if orphaned:  # the loop died without closing: this process is the ring's last user
        try:
            shared_memory.SharedMemory(name=shm_name).unlink()
        except FileNotFoundError:
            pass
        unlink_image_of(parent_pid)


class RecorderDied(RuntimeError):
    """The recorder process is gone while the loop still appends rows."""


START_METHOD = "spawn"  # multiprocessing start method of the writer; hil.campaign's warm lockstep
#                         workers (single-threaded, modules loaded) use "fork": ~1 s less per run


class Recorder:
    """Loop-side handle: `append(row)` per step; `close()` flushes and waits for the writer.

    capacity: ring rows; in real time a full ring drops rows (counted), in lockstep the loop
    waits for the writer (back-pressure), so lockstep recordings are complete.
    """

    def __init__(self, directory: str | Path, columns: list[str], meta: dict, *, flush_interval_s: float = 1.0,
                 capacity: int = 1 << 16, block_when_full: bool = False, dtypes: dict[str, str] | None = None):
        if START_METHOD == "spawn":
            from hil.spawn_guard import check_main_guard

            check_main_guard("the recorder")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.columns = columns
        self.dtypes = {c: t for c, t in (dtypes or {}).items() if c in columns}
        self.meta = dict(meta, columns=columns, dtypes=self.dtypes)
        self.block_when_full = block_when_full
        self.write_meta()
        ncols = len(columns)
        size = N_RING_HEADER * 8 + capacity * ncols * 8
        self._shm = shared_memory.SharedMemory(create=True, size=size,
                                               name=f"hil_rec_{os.getpid()}_{time.monotonic_ns() % 10**9}")
        self.header = np.ndarray((N_RING_HEADER,), dtype=np.int64, buffer=self._shm.buf)
        self.header[:] = 0
        self.header[R_NCOLS] = ncols
        self.header[R_CAP] = capacity
        self.ring = np.ndarray((capacity, ncols), dtype=np.float64, buffer=self._shm.buf, offset=N_RING_HEADER * 8)
        self.capacity = capacity
        ctx = mp.get_context(START_METHOD)
        ready = ctx.Event()
        self._proc = ctx.Process(
            target=_recorder_main,
            args=(self._shm.name, str(self.directory), columns, flush_interval_s, os.getpid(), ready, self.dtypes),
            name="hil-recorder",
            daemon=False,
        )
        self._proc.start()
        # up, with its libraries loaded, before the loop's clock starts: as long as it lives and
        # makes progress (hil/readiness.py; a dead one is the children registry's to report)
        from hil import readiness

        readiness.wait_ready(ready.is_set, [self._proc.pid], self._proc.is_alive, wait=ready.wait, poll_s=0.1)
        self._w = 0

    def write_meta(self, **extra) -> None:
        self.meta.update(extra)
        tmp = self.directory / "._meta.json.tmp"
        tmp.write_text(json.dumps(self.meta, indent=1, default=_json_default))
        os.replace(tmp, self.directory / "_meta.json")

    def append(self, row: np.ndarray) -> bool:
        """Copy one row into the ring; False if it was dropped (ring full, real time)."""
        h = self.header
        if self._w - int(h[R_READ]) >= self.capacity:
            if not self.block_when_full:
                h[R_DROPPED] += 1
                return False
            while self._w - int(h[R_READ]) >= self.capacity:
                if not self._proc.is_alive():
                    raise RecorderDied("recorder process died")
                time.sleep(0.001)
        self.ring[self._w % self.capacity] = row
        self._w += 1
        h[R_WRITE] = self._w  # publish after the row is written (x86 store order)
        return True

    @property
    def dropped(self) -> int:
        return int(self.header[R_DROPPED])

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def process(self):
        """The recorder's multiprocessing.Process (liveness: is_alive(), exitcode)."""
        return self._proc

    def close(self, timeout_s: float = 60.0, **meta) -> None:
        """Flush everything, wait for the writer, finalize meta.json."""
        if self.header is None:
            return
        self.header[R_CLOSED] = 1
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.terminate()
        meta.setdefault("dropped_rows", self.dropped)
        self.write_meta(**meta)
        self.header = None
        self.ring = None
        self._shm.close()
        self._shm.unlink()


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def read_recording(path: str | Path):
    """A recording directory as a pandas DataFrame sorted by step (whole parts only)."""
    import pandas as pd
    import pyarrow.parquet as pq

    path = Path(path)
    parts = sorted(path.glob("part-*.parquet"))
    if not parts:
        cols = json.loads((path / "_meta.json").read_text()).get("columns", [])
        return pd.DataFrame(columns=cols)
    frames = [pq.read_table(p).to_pandas() for p in parts]
    df = pd.concat(frames, ignore_index=True).sort_values("step", kind="stable").reset_index(drop=True)
    df["step"] = df["step"].astype("int64")
    return df


def read_meta(path: str | Path) -> dict:
    return json.loads((Path(path) / "_meta.json").read_text())
