"""Latency profiles measured from a run: the Modbus request log and the loop's recording.

Inputs (any combination):
- the Modbus server's request log (adapters/modbus_log.py: JSONL or Parquet with t_ns,
  dur_ns, peer, fc, wrote, exc, publish_ns, ... on the monotonic clock);
- a recording directory (hil/recorder.py: wall_ns = monotonic ns at the start of each step,
  lateness_us); a request log named _modbus_requests.jsonl / .parquet inside it is used too
  (leading underscore: pandas.read_parquet(recording) skips it).

Series written per client ("<peer>.<name>", wall seconds times `time_scale` = simulated s):

    request_interval   between successive requests of the client (its polling cadence)
    read_interval      between successive reads (the PLC's scan/poll period and its jitter)
    write_interval     between successive writes
    response           server handling time of a request (dur_ns)
    observation_age    age of the served outputs at a read: served_ns - publish_ns
                       (t_ns - publish_ns in logs without served_ns)
    read_to_write      from a write back to the client's latest read before it (PLC compute)
    write_to_effect    from a write to the start of the first loop step after it (needs the
                       recording): when the plant starts seeing the new command
    loop_delay         write_to_effect + read_to_write + observation_age of that read: plant
                       publish -> command applied, the whole closed-loop dead time

and, from a recording: loop.step_interval (successive wall_ns) and loop.lateness.

For a lockstep replay of a real PLC: observation latency ~ observation_age (or loop_delay
split as you see fit), actuation latency ~ read_to_write + write_to_effect.
Reads are function codes 1-4 (and 23); writes 5, 6, 15, 16 (and 23 when it wrote);
requests answered with an exception are left out.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hil.gaps.profile import ProfileError, make_profile, series_entry

READ_FCS = {1, 2, 3, 4, 23}
WRITE_FCS = {5, 6, 15, 16}
LOG_NAMES = ("_modbus_requests.parquet", "_modbus_requests.jsonl")


def read_log(path: Path):
    """The request log as a DataFrame; ProfileError if it lacks the needed columns."""
    import pandas as pd

    try:
        df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_json(path, lines=True)
    except Exception as exc:  # parser errors of several types
        raise ProfileError(f"cannot read request log {path}: {exc}") from None
    need = {"t_ns", "peer", "fc"}
    if df.empty:
        raise ProfileError(f"request log {path} has no records")
    missing = need - set(df.columns)
    if missing:
        raise ProfileError(f"request log {path} lacks column(s) {sorted(missing)}")
    return df


def _diffs(t_ns: np.ndarray) -> np.ndarray:
    return np.diff(np.sort(t_ns)).astype(np.float64) * 1e-9


def client_series(df, step_wall_ns: np.ndarray | None, time_scale: float, bins: int) -> dict:
    """{"<peer>.<name>": series entry} from a request log (see module docstring)."""
    out: dict[str, dict] = {}
    if "exc" in df.columns:
        df = df[df["exc"] == 0]
    for peer, g in df.groupby("peer", sort=True):
        g = g.sort_values("t_ns", kind="stable")
        t = g["t_ns"].to_numpy(np.int64)
        fc = g["fc"].to_numpy(np.int64)
        wrote = g["wrote"].to_numpy(bool) if "wrote" in g.columns else np.zeros(t.size, bool)
        is_write = np.isin(fc, list(WRITE_FCS)) | ((fc == 23) & wrote)
        is_read = np.isin(fc, list(READ_FCS))
        ser: dict[str, np.ndarray] = {
            "request_interval": _diffs(t),
            "read_interval": _diffs(t[is_read]),
            "write_interval": _diffs(t[is_write]),
        }
        if "dur_ns" in g.columns:
            ser["response"] = g["dur_ns"].to_numpy(np.float64) * 1e-9
        age = np.full(t.size, np.nan)
        if "publish_ns" in g.columns:
            pub = g["publish_ns"].to_numpy(np.int64)
            # the snapshot's own instant when logged (t_ns is when the request was decoded, and the
            # loop may publish between that and the snapshot: t_ns - publish_ns can go negative)
            served = g["served_ns"].to_numpy(np.int64) if "served_ns" in g.columns else t
            at = np.where(served > 0, served, t)
            ok = is_read & (pub > 0)
            age[ok] = (at[ok] - pub[ok]) * 1e-9
            ser["observation_age"] = age[ok]
        # the latest read before each write
        read_pos = np.flatnonzero(is_read)
        w_pos = np.flatnonzero(is_write)
        k = np.searchsorted(read_pos, w_pos) - 1
        has = k >= 0
        r_of_w = read_pos[k[has]]
        w_has = w_pos[has]
        ser["read_to_write"] = (t[w_has] - t[r_of_w]) * 1e-9
        if step_wall_ns is not None and step_wall_ns.size and w_pos.size:
            j = np.searchsorted(step_wall_ns, t[w_pos], side="left")
            eff = j < step_wall_ns.size
            effect = np.full(w_pos.size, np.nan)
            effect[eff] = (step_wall_ns[j[eff]] - t[w_pos][eff]) * 1e-9
            ser["write_to_effect"] = effect[eff]
            total = effect[has] + ser["read_to_write"] + age[r_of_w]
            ser["loop_delay"] = total[np.isfinite(total)]
        for name, x in ser.items():
            x = x[np.isfinite(x)] * time_scale
            if x.size:
                out[f"{peer}.{name}"] = series_entry(x, f"{name} of client {peer}", bins)
    return out


def recording_series(directory: Path, time_scale: float, bins: int):
    """(series, step wall_ns array) from a recording directory."""
    from hil.recorder import read_recording

    if not (directory / "_meta.json").exists():
        raise ProfileError(f"{directory} is not a recording (no _meta.json)")
    df = read_recording(directory)
    if df.empty:
        raise ProfileError(f"recording {directory} has no rows")
    wall = np.sort(df["wall_ns"].to_numpy(np.int64))
    out = {}
    if wall.size > 1:
        out["loop.step_interval"] = series_entry(np.diff(wall) * 1e-9 * time_scale,
                                                 "wall interval between loop steps", bins)
    if "lateness_us" in df.columns:
        late = df["lateness_us"].to_numpy(np.float64) * 1e-6
        late = np.clip(late[np.isfinite(late)], 0.0, None)
        if late.size:
            out["loop.lateness"] = series_entry(late * time_scale, "loop wake-up lateness", bins)
    return out, wall


def profile_from_run(path: str | Path, time_scale: float = 1.0, bins: int = 0) -> dict:
    """A profile object from a request log file or a recording directory (see docstring)."""
    path = Path(path)
    series: dict[str, dict] = {}
    wall = None
    log = path
    if path.is_dir():
        series, wall = recording_series(path, time_scale, bins)
        log = next((path / n for n in LOG_NAMES if (path / n).exists()), None)
    elif not path.exists():
        raise ProfileError(f"{path}: no such file or directory")
    if log is not None:
        series.update(client_series(read_log(log), wall, time_scale, bins))
    if not series:
        raise ProfileError(f"{path}: nothing to measure")
    src = f"{path} (wall seconds x time_scale {time_scale:g} = simulated seconds)"
    return make_profile(series, source=src)


def read_plain(path: str | Path, column: str | None = None) -> np.ndarray:
    """Numbers from a plain file: JSON list, or text/CSV with one value per line (first or
    named column, header optional)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"cannot read {path}: {exc.strerror}") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(data, list):
            raise ProfileError(f"{path}: expected a JSON list of numbers")
        try:
            return np.asarray(data, dtype=np.float64)
        except (TypeError, ValueError):
            raise ProfileError(f"{path}: expected a JSON list of numbers") from None
    import pandas as pd

    first = text.lstrip().split("\n", 1)[0]
    header = 0 if any(c.isalpha() for c in first.replace("e", "").replace("E", "")) else None
    try:
        df = pd.read_csv(path, header=header)
    except Exception as exc:
        raise ProfileError(f"cannot parse {path}: {exc}") from None
    col = df.columns[0] if column is None else column
    if col not in df.columns:
        raise ProfileError(f"{path} has no column {column!r}")
    try:
        return df[col].to_numpy(np.float64)
    except (TypeError, ValueError):
        raise ProfileError(f"{path}: column {col!r} is not numeric") from None
