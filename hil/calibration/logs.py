"""Logs of the real unit (or of a hil run) as arrays in plant units, through a column map.

A log is a CSV or Parquet file with a time column, or a hil recording directory (its
`_meta.json` + parts; `app.<input>` are the inputs, `meas.<output>` the measured outputs).
Sampling may be irregular, with gaps and NaNs; NaN in an input holds the previous value, NaN
in an output is a missing measurement (left out of the fit).

Column map (TOML), every key optional:

    [time]
    column = "time_h"          # default "t_s" (hil recordings) or "time"
    unit = "h"                 # s | min | h | d | ms, or "datetime" (ISO strings / timestamps)

    [columns]                  # log column -> plant signal
    DO_pct = "dissolved_oxygen"                    # output of that name (or input, if none)
    feed_Lph = { to = "feed_rate", unit = "L/h" }  # unit converted to the plant unit
    temp_C = { to = "temperature", role = "state", unit = "degC" }  # prescribed state
    pH_raw = { to = "ph", scale = 0.01, offset = 0.0 }  # plant = scale * raw + offset
    pump_cmd = { to = "feed_rate", lag_s = 600.0 }  # known actuator lag: the plant sees the
                                                    # command through a first-order lag
    antifoam_mL = { role = "extra" }               # kept for the residual model and audit
    X_lab = { to = "biomass", role = "reference" } # an independent reference of an output
                                                   # (lab assay): judges that output's sensor

    [inputs.base_flow]         # an input the log does not carry
    value = 0.0                # fixed, plant unit ... or
    profile = [[0.0, 0.0], [3600.0, 0.002]]   # piecewise constant from t_s on (s since start)

    [states.temperature]       # a state held by the unit's own controller, not logged:
    value = 298.0              # held at a value (plant unit) ... or a profile as above

Roles: "output" (a measured output compared with the model), "input" (drives the model),
"state" (the state is set to the logged value before every step: e.g. temperature held
by a jacket controller the model need not simulate), "reference" (an independent
measurement of an output, e.g. offline lab samples: sensor bias and drift are fitted against
these only), "extra" (kept, not used by the model; read by the residual model and the
findings). Logs may be gzip-compressed (`.csv.gz`, `.tsv.gz`).
Columns neither mapped nor named like a signal are kept as extras too.

Bad files raise `LogError` naming the file, the column and the (1-based data) row.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hil.errors import ConfigError


class LogError(ConfigError):
    """A log or column map that cannot be used; names file, column and row."""


# unit conversions into plant units: (from, to) -> (scale, offset), plant = scale * raw + offset
_TIME_S = {"s": 1.0, "ms": 1e-3, "min": 60.0, "h": 3600.0, "d": 86400.0}
_CONVERSIONS: dict[tuple[str, str], tuple[float, float]] = {
    ("degC", "K"): (1.0, 273.15),
    ("K", "degC"): (1.0, -273.15),
    ("mL/h", "L/h"): (1e-3, 0.0),
    ("L/min", "L/h"): (60.0, 0.0),
    ("mL/min", "L/h"): (0.06, 0.0),
    ("L/s", "L/h"): (3600.0, 0.0),
    ("m3/h", "L/h"): (1000.0, 0.0),
    ("mg/L", "g/L"): (1e-3, 0.0),
    ("g/L", "mg/L"): (1e3, 0.0),
    ("mL", "L"): (1e-3, 0.0),
    ("kW", "W"): (1e3, 0.0),
    ("fraction", "%"): (100.0, 0.0),
    ("%", "fraction"): (0.01, 0.0),
    ("kPa", "Pa"): (1e3, 0.0),
    ("bar", "Pa"): (1e5, 0.0),
    ("MW", "W"): (1e6, 0.0),
    ("kV", "V"): (1e3, 0.0),
    ("deg", "rad"): (math.pi / 180.0, 0.0),
    ("rpm", "rad/s"): (2 * math.pi / 60.0, 0.0),
}


def conversion(unit_from: str, unit_to: str) -> tuple[float, float]:
    """(scale, offset) turning a value in unit_from into unit_to; ValueError if unknown."""
    if unit_from == unit_to:
        return 1.0, 0.0
    try:
        return _CONVERSIONS[(unit_from, unit_to)]
    except KeyError:
        raise ValueError(f"no conversion from {unit_from!r} to {unit_to!r} known: "
                         "give scale and offset instead") from None


@dataclass(frozen=True)
class ColumnSpec:
    """One mapped log column: plant = scale * raw + offset."""

    column: str
    signal: str
    role: str  # output | input | state | extra
    scale: float = 1.0
    offset: float = 0.0
    lag_s: float = 0.0   # inputs: a known first-order actuator lag between command and plant


@dataclass
class ColumnMap:
    """How a log's columns become plant signals (see module docstring)."""

    time_column: str | None = None
    time_unit: str = "s"
    columns: list[ColumnSpec] = field(default_factory=list)
    fixed_inputs: dict[str, float] = field(default_factory=dict)
    profile_inputs: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    held_states: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path, spec) -> "ColumnMap":
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise LogError("", f"cannot read column map: {exc.strerror}", source=str(path)) from None
        except tomllib.TOMLDecodeError as exc:
            raise LogError("", f"not valid TOML: {exc}", source=str(path)) from None
        return cls.from_dict(data, spec, source=str(path))

    @classmethod
    def from_dict(cls, data: dict, spec, source: str | None = None) -> "ColumnMap":
        problems: list[tuple[str, str]] = []
        cm = cls()
        unknown = set(data) - {"time", "columns", "inputs", "states"}
        for k in sorted(unknown):
            problems.append((k, "unknown section (expected time, columns, inputs, states)"))
        t = data.get("time", {})
        cm.time_column = t.get("column")
        cm.time_unit = t.get("unit", "s")
        if cm.time_unit not in _TIME_S and cm.time_unit != "datetime":
            problems.append(("time.unit", f"{cm.time_unit!r} is not one of {', '.join(_TIME_S)}, datetime"))
        outs, ins, sts = (set(spec.names(k)) for k in ("outputs", "inputs", "states"))
        for col, entry in data.get("columns", {}).items():
            key = f"columns.{col}"
            if isinstance(entry, str):
                entry = {"to": entry}
            if not isinstance(entry, dict):
                problems.append((key, "expected a signal name or a table {to, role, unit, scale, offset}"))
                continue
            role = entry.get("role")
            to = entry.get("to", col)
            if role is None:
                role = "output" if to in outs else "input" if to in ins else None
                if role is None:
                    problems.append((key, f"{to!r} is no output or input of {spec.name}; "
                                          "set role = \"state\" or \"extra\""))
                    continue
            if role not in ("output", "input", "state", "extra", "reference"):
                problems.append((f"{key}.role", f"{role!r} is not output, input, state, reference or extra"))
                continue
            kind = {"output": "outputs", "input": "inputs", "state": "states", "reference": "outputs"}.get(role)
            if kind is not None and to not in {"outputs": outs, "inputs": ins, "states": sts}[kind]:
                problems.append((f"{key}.to", f"{spec.name} has no {role} {to!r}"))
                continue
            scale, offset = float(entry.get("scale", 1.0)), float(entry.get("offset", 0.0))
            if "unit" in entry and kind is not None:
                target = spec.quantity(kind, to).unit
                try:
                    s2, o2 = conversion(entry["unit"], target)
                except ValueError as exc:
                    problems.append((f"{key}.unit", str(exc)))
                    continue
                scale, offset = scale * s2, offset * s2 + o2
            lag = float(entry.get("lag_s", 0.0))
            if lag < 0 or (lag and role != "input"):
                problems.append((f"{key}.lag_s", "a lag >= 0 s, on inputs only"))
                continue
            cm.columns.append(ColumnSpec(col, to, role, scale, offset, lag))
        for name, entry in data.get("states", {}).items():
            key = f"states.{name}"
            if name not in sts:
                problems.append((key, f"{spec.name} has no state {name!r} (states: {', '.join(sorted(sts))})"))
                continue
            if not isinstance(entry, dict) or ("value" in entry) == ("profile" in entry):
                problems.append((key, "give exactly one of value or profile (the state held by the unit's "
                                      "own controller)"))
                continue
            try:
                prof = ([(0.0, float(entry["value"]))] if "value" in entry
                        else [(float(a), float(b)) for a, b in entry["profile"]])
            except (TypeError, ValueError):
                problems.append((key, "value must be a number, profile a list of [t_s, value] pairs"))
                continue
            if not prof or any(b[0] < a[0] for a, b in zip(prof, prof[1:])):
                problems.append((f"{key}.profile", "times must be non-empty and non-decreasing"))
                continue
            cm.held_states[name] = prof
        for name, entry in data.get("inputs", {}).items():
            key = f"inputs.{name}"
            if name not in ins:
                hint = " (a state: declare it under [states." + name + "])" if name in sts else ""
                problems.append((key, f"{spec.name} has no input {name!r}{hint}"))
                continue
            if "value" in entry and "profile" not in entry:
                cm.fixed_inputs[name] = float(entry["value"])
            elif "profile" in entry and "value" not in entry:
                prof = [(float(a), float(b)) for a, b in entry["profile"]]
                if any(b[0] < a[0] for a, b in zip(prof, prof[1:])) or not prof:
                    problems.append((f"{key}.profile", "times must be non-empty and non-decreasing"))
                    continue
                cm.profile_inputs[name] = prof
            else:
                problems.append((key, "give exactly one of value or profile"))
        if problems:
            raise LogError("", problems=problems, source=source)
        return cm


@dataclass
class RunLog:
    """One run in plant units. t_s: seconds since the run's first sample (irregular allowed).

    U (n, n_inputs): inputs applied from t_s[k] to t_s[k+1] (zero-order hold).
    Y (n, n_outputs): measured outputs at t_s[k], NaN where not measured.
    X_presc (n, n_states): prescribed states at t_s[k], NaN where the model integrates.
    extras: name -> (n,) float array of the columns the model does not use.
    """

    name: str
    t_s: np.ndarray
    U: np.ndarray
    Y: np.ndarray
    X_presc: np.ndarray
    extras: dict[str, np.ndarray]
    source: str = ""
    refs: dict[str, np.ndarray] = field(default_factory=dict)  # output -> independent reference (NaN: none)
    t_origin_s: float = 0.0  # time of sample 0 since the logged run's start, s (non-zero for a slice)

    @property
    def duration_s(self) -> float:
        return float(self.t_s[-1] - self.t_s[0])

    def measured_outputs(self, spec) -> list[str]:
        return [n for i, n in enumerate(spec.names("outputs")) if np.isfinite(self.Y[:, i]).any()]

    def slice(self, k0: int, k1: int, name: str | None = None) -> "RunLog":
        """Samples k0..k1-1 as a run of their own (time re-based to 0)."""
        t = self.t_s[k0:k1] - self.t_s[k0]
        return RunLog(name or f"{self.name}[{k0}:{k1}]", t, self.U[k0:k1], self.Y[k0:k1],
                      self.X_presc[k0:k1], {k: v[k0:k1] for k, v in self.extras.items()}, self.source,
                      {k: v[k0:k1] for k, v in self.refs.items()}, self.t_origin_s + float(self.t_s[k0]))


def _read_table(path: Path):
    import pandas as pd

    if path.is_dir():
        from hil.recorder import read_recording

        if not (path / "_meta.json").exists():
            raise LogError("", "a directory log must be a hil recording (no _meta.json)", source=str(path))
        return read_recording(path), True
    suffix = path.suffix.lower()
    compression = None
    if suffix == ".gz":
        compression = "gzip"
        suffix = Path(path.stem).suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path), False
        if suffix in (".csv", ".txt", ".tsv"):
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",", dtype=str,
                               keep_default_na=False, compression=compression), False
    except FileNotFoundError:
        raise LogError("", "no such file", source=str(path)) from None
    except Exception as exc:  # pandas/pyarrow parse errors
        raise LogError("", f"cannot parse: {exc}", source=str(path)) from None
    raise LogError("", f"unknown log format {path.suffix!r} (CSV, TSV (optionally .gz), Parquet or a hil "
                       "recording)", source=str(path))


_NA = {"", "nan", "NaN", "NA", "N/A", "null", "None", "-"}


def _numeric(df, col: str, source: str) -> np.ndarray:
    """A column as float64; a cell that is not a number raises LogError naming column and row."""
    import pandas as pd

    s = df[col]
    if not (pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s)):
        out = np.empty(len(s))
        for i, v in enumerate(s.to_numpy()):
            if v is None or (isinstance(v, str) and v.strip() in _NA):
                out[i] = np.nan
                continue
            try:
                out[i] = float(v)
            except (TypeError, ValueError):
                raise LogError(f"column {col!r}, row {i + 1}", f"{v!r} is not a number",
                               source=source) from None
        return out
    try:
        return s.to_numpy(dtype=np.float64, na_value=np.nan)
    except (TypeError, ValueError) as exc:
        raise LogError(f"column {col!r}", f"not numeric ({exc})", source=source) from None


def _time(df, cm: ColumnMap, source: str, recording: bool) -> np.ndarray:
    import pandas as pd

    col = cm.time_column or ("t_s" if recording else next(
        (c for c in ("t_s", "time", "time_s", "timestamp") if c in df.columns), None))
    if col is None or col not in df.columns:
        raise LogError("time.column", f"no time column {col or '(t_s, time, time_s, timestamp)'} "
                       f"in the log (columns: {', '.join(map(str, df.columns))})", source=source)
    if cm.time_unit == "datetime":
        ts = pd.to_datetime(df[col], errors="coerce", utc=True)
        bad = np.flatnonzero(ts.isna().to_numpy())
        if bad.size:
            raise LogError(f"column {col!r}, row {bad[0] + 1}", f"{df[col].iloc[bad[0]]!r} is not a date-time",
                           source=source)
        t = (ts - ts.iloc[0]).dt.total_seconds().to_numpy(dtype=np.float64)
    else:
        t = _numeric(df, col, source) * _TIME_S[cm.time_unit]
        bad = np.flatnonzero(~np.isfinite(t))
        if bad.size:
            raise LogError(f"column {col!r}, row {bad[0] + 1}", "the time is missing or not finite", source=source)
    back = np.flatnonzero(np.diff(t) <= 0)
    if back.size:
        i = back[0] + 1
        raise LogError(f"column {col!r}, row {i + 1}",
                       f"time {t[i]:g} s does not increase (previous row {t[i - 1]:g} s)", source=source)
    if t.size < 2:
        raise LogError(f"column {col!r}", "a log needs at least two samples", source=source)
    return t - t[0], col


def _recording_map(df, spec) -> list[ColumnSpec]:
    out = []
    for n in spec.names("inputs"):
        if f"app.{n}" in df.columns:
            out.append(ColumnSpec(f"app.{n}", n, "input"))
    for n in spec.names("outputs"):
        if f"meas.{n}" in df.columns:
            out.append(ColumnSpec(f"meas.{n}", n, "output"))
    return out


def _profile_at(prof: list[tuple[float, float]], t: np.ndarray) -> np.ndarray:
    times = np.array([a for a, _ in prof])
    vals = np.array([b for _, b in prof])
    idx = np.searchsorted(times, t, side="right") - 1
    return np.where(idx >= 0, vals[np.clip(idx, 0, None)], vals[0])


def read_run(path: str | Path, spec, column_map: ColumnMap | None = None,
             initial_inputs: np.ndarray | None = None) -> RunLog:
    """Read one log into a RunLog (plant units). `initial_inputs`: values for inputs neither
    logged nor in the map (default: the spec's nominal inputs), and for leading NaNs."""
    path = Path(path)
    source = str(path)
    cm = column_map or ColumnMap()
    df, recording = _read_table(path)
    if len(df) == 0:
        raise LogError("", "the log has no rows", source=source)
    t, tcol = _time(df, cm, source, recording)
    mapped = list(cm.columns)
    if recording and not mapped:
        mapped = _recording_map(df, spec)
    if not mapped:  # columns named like signals map to themselves
        outs, ins = set(spec.names("outputs")), set(spec.names("inputs"))
        mapped = [ColumnSpec(c, c, "output" if c in outs else "input")
                  for c in df.columns if c in outs or c in ins]
    for c in mapped:
        if c.column not in df.columns:
            raise LogError(f"columns.{c.column}", f"the log has no column {c.column!r} "
                           f"(columns: {', '.join(map(str, df.columns))})", source=source)
    n = t.size
    U = np.tile(initial_inputs if initial_inputs is not None else spec.nominal("inputs"), (n, 1))
    Y = np.full((n, spec.n_outputs), np.nan)
    X = np.full((n, spec.n_states), np.nan)
    extras: dict[str, np.ndarray] = {}
    refs: dict[str, np.ndarray] = {}
    used = {tcol}
    for c in mapped:
        used.add(c.column)
        raw = _numeric(df, c.column, source)
        if c.role != "extra":
            inf = np.flatnonzero(np.isinf(raw))
            if inf.size:
                raise LogError(f"column {c.column!r}, row {inf[0] + 1}", "infinite value", source=source)
        v = c.scale * raw + c.offset
        if c.role == "output":
            Y[:, spec.index("outputs", c.signal)] = v
        elif c.role == "state":
            X[:, spec.index("states", c.signal)] = _hold(v, np.nan)
        elif c.role == "reference":
            refs[c.signal] = v
        elif c.role == "input":
            j = spec.index("inputs", c.signal)
            U[:, j] = _hold(v, U[0, j])
            if c.lag_s > 0:
                U[:, j] = lag_filter(t, U[:, j], c.lag_s)
        else:
            extras[c.signal if c.signal != c.column else c.column] = v
    for name, value in cm.fixed_inputs.items():
        U[:, spec.index("inputs", name)] = value
    for name, prof in cm.profile_inputs.items():
        U[:, spec.index("inputs", name)] = _profile_at(prof, t)
    for name, prof in cm.held_states.items():
        i = spec.index("states", name)
        if np.isfinite(X[:, i]).any():
            raise LogError(f"states.{name}", "the state is both logged (role = \"state\") and declared held",
                           source=source)
        X[:, i] = _profile_at(prof, t)
    for col in df.columns:
        if col in used or (recording and str(col).split(".")[0] in ("step", "wall_ns", "lateness_us",
                                                                     "cmd", "app", "x", "y", "meas")):
            continue
        try:
            extras[str(col)] = _numeric(df, col, source)
        except LogError:
            pass  # non-numeric extra columns (comments, operator notes) are dropped
    if not np.isfinite(Y).any():
        raise LogError("columns", "no measured output in the log: map at least one column to an output",
                       source=source)
    name = path.stem if not path.is_dir() else path.name
    if name.endswith((".csv", ".tsv")):
        name = name[:-4]
    return RunLog(name, t, U, Y, X, extras, source, refs)


def lag_filter(t_s: np.ndarray, v: np.ndarray, tau_s: float) -> np.ndarray:
    """What a first-order lag (time constant tau_s, s) makes of the command v held between
    samples t_s: the mean of the applied input over each interval [t_k, t_k+1) (exact for
    a ZOH command: the lag state z moves from z_k towards v_k, the mean is
    v_k + (z_k - v_k) tau/dt (1 - exp(-dt/tau))), which the plant then sees held over that
    interval (the log keeps the command). Continuous in tau: tau -> 0 gives v itself."""
    out = np.empty_like(v)
    if not tau_s > 0:
        out[:] = v
        return out
    z = v[0]
    for k in range(v.size):
        dt = t_s[k + 1] - t_s[k] if k + 1 < v.size else (t_s[k] - t_s[k - 1] if k else 1.0)
        a = math.exp(-dt / tau_s)
        out[k] = v[k] + (z - v[k]) * tau_s / dt * (1.0 - a)
        z = a * z + (1.0 - a) * v[k]
    return out


def _hold(v: np.ndarray, first: float) -> np.ndarray:
    """Forward-fill NaNs (a missing input sample holds the last value; before any: `first`)."""
    out = v.copy()
    last = first
    for i in range(out.size):
        if math.isnan(out[i]):
            out[i] = last
        else:
            last = out[i]
    return out


def read_runs(paths, spec, column_map: ColumnMap | None = None, initial_inputs=None) -> list[RunLog]:
    runs = [read_run(p, spec, column_map, initial_inputs) for p in paths]
    names = [r.name for r in runs]
    for i, r in enumerate(runs):
        if names.count(r.name) > 1:
            r.name = f"{r.name}#{i}"
    return runs
