"""Latency profile files: format, loading, validation and builders from plain data.

A profile is a JSON object holding one or more named series of latencies (or intervals):

    {
      "format": "hil-latency-profile",
      "version": 1,
      "source": "what it was measured from (free text)",
      "series": {
        "plc1.read_interval": {
          "unit": "s",                          # s | ms | us | ns
          "description": "free text",
          "samples": [0.0101, 0.0098, ...]      # in order of occurrence (replayed in this order)
        },
        "plc1.write_to_effect": {
          "unit": "ms",
          "histogram": {"edges": [0, 1, 2, 5], "counts": [10, 80, 3]}   # len(edges) = len(counts)+1
        }
      }
    }

Each series has exactly one of "samples" (>= 1 finite values >= 0) or "histogram" (strictly
increasing edges >= 0, counts >= 0 with a positive sum). An optional "stats" object per series
(n, mean, std, min, p50, p90, p99, max; written by the builders) is informative only.

Sampling a histogram: pick a bin with probability counts / sum, then a uniform value inside it.
`hil profile` (hil/commands/profile.py) writes these files; the latency gap replays them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "hil-latency-profile"
VERSION = 1
UNIT_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


class ProfileError(ValueError):
    """A profile file is missing or malformed; the message says where and why."""


@dataclass(frozen=True)
class Series:
    """One latency series in seconds: either `samples` or a histogram (`edges`, `counts`)."""

    name: str
    samples: np.ndarray | None = None
    edges: np.ndarray | None = None
    counts: np.ndarray | None = None
    description: str = ""

    @property
    def low(self) -> float:
        return float(self.samples.min() if self.samples is not None else self.edges[0])

    @property
    def high(self) -> float:
        return float(self.samples.max() if self.samples is not None else self.edges[-1])

    def packed(self) -> tuple[np.ndarray, int]:
        """Kernel form: (float64 array, n). Samples: the n samples. Histogram with n bins:
        n normalized cumulative counts followed by the n+1 edges."""
        if self.samples is not None:
            return self.samples.astype(np.float64), self.samples.size
        cdf = np.cumsum(self.counts, dtype=np.float64)
        cdf /= cdf[-1]
        return np.concatenate([cdf, self.edges]).astype(np.float64), self.counts.size

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n independent draws (numpy, for analysis and tests)."""
        if self.samples is not None:
            return rng.choice(self.samples, n)
        p = self.counts / self.counts.sum()
        b = rng.choice(self.counts.size, n, p=p)
        return self.edges[b] + rng.random(n) * (self.edges[b + 1] - self.edges[b])


def _stats(x: np.ndarray) -> dict:
    q = np.percentile(x, [50, 90, 99])
    return {
        "n": int(x.size), "mean": float(x.mean()), "std": float(x.std()),
        "min": float(x.min()), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
        "max": float(x.max()),
    }


def _finite_array(value, where: str) -> np.ndarray:
    if not isinstance(value, list) or not value:
        raise ProfileError(f"{where}: must be a non-empty list of numbers")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ProfileError(f"{where}: must contain numbers only")
    a = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise ProfileError(f"{where}: contains a non-finite value")
    if np.any(a < 0):
        raise ProfileError(f"{where}: latencies must be >= 0 (found {a.min()})")
    return a


def parse_series(name: str, obj) -> Series:
    """Validate one series object of a profile; values converted to seconds."""
    where = f"series {name!r}"
    if not isinstance(obj, dict):
        raise ProfileError(f"{where}: must be an object")
    unknown = set(obj) - {"unit", "description", "samples", "histogram", "stats"}
    if unknown:
        raise ProfileError(f"{where}: unknown keys {sorted(unknown)}")
    unit = obj.get("unit", "s")
    if unit not in UNIT_SCALE:
        raise ProfileError(f"{where}.unit: {unit!r} is not one of {', '.join(UNIT_SCALE)}")
    scale = UNIT_SCALE[unit]
    has_s, has_h = "samples" in obj, "histogram" in obj
    if has_s == has_h:
        raise ProfileError(f"{where}: needs exactly one of 'samples' or 'histogram'")
    desc = str(obj.get("description", ""))
    if has_s:
        return Series(name, samples=_finite_array(obj["samples"], f"{where}.samples") * scale,
                      description=desc)
    h = obj["histogram"]
    if not isinstance(h, dict) or set(h) != {"edges", "counts"}:
        raise ProfileError(f"{where}.histogram: must be {{'edges': [...], 'counts': [...]}}")
    edges = _finite_array(h["edges"], f"{where}.histogram.edges")
    counts = _finite_array(h["counts"], f"{where}.histogram.counts")
    if edges.size != counts.size + 1:
        raise ProfileError(f"{where}.histogram: {edges.size} edges for {counts.size} counts "
                           "(need counts + 1)")
    if np.any(np.diff(edges) <= 0):
        raise ProfileError(f"{where}.histogram.edges: must be strictly increasing")
    if counts.sum() <= 0:
        raise ProfileError(f"{where}.histogram.counts: sum must be > 0")
    return Series(name, edges=edges * scale, counts=counts, description=desc)


def parse_profile(data) -> dict[str, Series]:
    if not isinstance(data, dict):
        raise ProfileError("a profile is a JSON object")
    if data.get("format") != FORMAT:
        raise ProfileError(f"'format' must be {FORMAT!r} (found {data.get('format')!r})")
    if data.get("version") != VERSION:
        raise ProfileError(f"unsupported 'version' {data.get('version')!r} (this is {VERSION})")
    series = data.get("series")
    if not isinstance(series, dict) or not series:
        raise ProfileError("'series' must be a non-empty object of named series")
    return {name: parse_series(name, obj) for name, obj in series.items()}


def load_profile(path: str | Path) -> dict[str, Series]:
    """Read and validate a profile file. Raises ProfileError (missing file, bad JSON, schema)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path} is not valid JSON: {exc}") from None
    return parse_profile(data)


def select_series(series: dict[str, Series], name: str | None) -> Series:
    if name is None:
        if len(series) != 1:
            raise ProfileError(f"the file has {len(series)} series; name one with 'series' "
                               f"(known: {', '.join(series)})")
        return next(iter(series.values()))
    if name not in series:
        raise ProfileError(f"no series {name!r} (known: {', '.join(series)})")
    return series[name]


# ---- building profiles ----


def series_entry(samples_s: np.ndarray, description: str = "", bins: int = 0) -> dict:
    """JSON object of one series from latencies in seconds; `bins` > 0 stores a histogram."""
    x = np.asarray(samples_s, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        raise ProfileError(f"series '{description}' has no finite samples")
    if np.any(x < 0):
        raise ProfileError(f"negative latency in series '{description}' (min {x.min()})")
    entry: dict = {"unit": "s", "description": description}
    if bins > 0:
        lo, hi = float(x.min()), float(x.max())
        if hi <= lo:
            hi = lo + max(abs(lo) * 1e-9, 1e-12)
        counts, edges = np.histogram(x, bins=bins, range=(lo, hi))
        entry["histogram"] = {"edges": edges.tolist(), "counts": counts.tolist()}
    else:
        entry["samples"] = x.tolist()
    entry["stats"] = _stats(x)
    return entry


def make_profile(series: dict[str, dict], source: str = "") -> dict:
    """A profile object from {name: series_entry(...)}."""
    return {"format": FORMAT, "version": VERSION, "source": source, "series": series}


def from_latencies(values, unit: str = "s", name: str = "latency", bins: int = 0,
                   source: str = "") -> dict:
    """Profile from a plain list of latencies in `unit`."""
    x = np.asarray(values, dtype=np.float64) * UNIT_SCALE[unit]
    return make_profile({name: series_entry(x, "latency samples", bins)}, source)


def from_timestamps(values, unit: str = "s", name: str = "interval", bins: int = 0,
                    source: str = "") -> dict:
    """Profile of the intervals between successive event timestamps in `unit` (sorted first)."""
    t = np.sort(np.asarray(values, dtype=np.float64)) * UNIT_SCALE[unit]
    if t.size < 2:
        raise ProfileError("need at least two timestamps")
    return make_profile({name: series_entry(np.diff(t), "intervals between events", bins)}, source)


def save_profile(profile: dict, path: str | Path) -> None:
    parse_profile(json.loads(json.dumps(profile)))  # never write a file we could not read back
    Path(path).write_text(json.dumps(profile, indent=1) + "\n")

