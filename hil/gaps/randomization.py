"""Domain randomization: plant and gap parameters drawn per episode, reproducible by seed.

Draws happen once per episode (not in the per-step path) with numpy's Generator seeded from
SeedSequence([seed, episode, stream]), so episode k gets the same values whatever ran before.
Stream 0 draws plant parameters (in sorted name order), stream 1 the table row, stream 2 gap
parameters (in sorted key order): adding a gap draw never changes the plant draws.

Distributions (`Dist` in config.py), values in plant units or, with relative = true, as factors
of the base value (the nominal or scenario override passed to `GapPipeline.build`):

    uniform(low, high)  normal(mean, std)  lognormal(median, sigma)  choice(values)

Truncation: every draw must fall in [lo, hi] = [Dist.min, Dist.max] intersected with the plant
parameter's physical bounds (or a gap field's own limits, e.g. std >= 0); draws outside are
rejected and redrawn (exact truncated distribution), up to 10000 tries, then ValueError.

A table of fitted samples (CSV, header = parameter names, one joint sample per row) gives
whole rows: row = uniform random ("random") or episode % n_rows ("sequential").

`batch_parameters` builds P (N, n_params) for the batch plant form (`plants.<plant>.run_batch`):
row i holds exactly the plant parameters that `GapPipeline.randomize(p, first_episode + i)`
draws, so a batch of N randomized instances is N episodes of the single-instance loop.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from hil.gaps.config import Dist, GapsSection

MAX_TRIES = 10_000
STREAM_PLANT, STREAM_TABLE, STREAM_GAPS, STREAM_HOOK = 0, 1, 2, 3


def episode_rng(seed: int, episode: int, stream: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, episode, stream])))


def natural_support(d: Dist, base: float = 1.0) -> tuple[float, float]:
    """Interval the untruncated distribution can produce (absolute units)."""
    s = base if d.relative else 1.0
    if d.dist == "uniform":
        a, b = d.low * s, d.high * s
    elif d.dist == "choice":
        a, b = min(d.values) * s, max(d.values) * s
    elif d.dist == "lognormal":
        a, b = (0.0, math.inf) if s >= 0 else (-math.inf, 0.0)
    else:
        a, b = -math.inf, math.inf
    return (min(a, b), max(a, b))


def dist_problems(d: Dist) -> list[tuple[str, str]]:
    """(sub_key, reason) for missing or inconsistent parameters of a Dist."""
    need = {"uniform": ("low", "high"), "normal": ("mean", "std"),
            "lognormal": ("median", "sigma"), "choice": ("values",)}[d.dist]
    out = [(k, f"required for dist = {d.dist!r}") for k in need if getattr(d, k) is None]
    if out:
        return out
    if d.dist == "uniform" and d.low > d.high:
        out.append(("low", f"lower bound {d.low} > upper bound {d.high}"))
    if d.dist == "choice" and (not d.values or not all(map(math.isfinite, d.values))):
        out.append(("values", "must be a non-empty list of finite numbers"))
    if d.min is not None and d.max is not None and d.min > d.max:
        out.append(("min", f"lower bound {d.min} > upper bound {d.max}"))
    return out


def truncation(d: Dist, lo: float, hi: float) -> tuple[float, float]:
    """The truncation interval: Dist.min/max intersected with [lo, hi]."""
    if d.min is not None:
        lo = max(lo, d.min)
    if d.max is not None:
        hi = min(hi, d.max)
    return lo, hi


def feasible(d: Dist, lo: float, hi: float, base: float = 1.0) -> str | None:
    """Reason why no draw can land in [lo, hi] (after truncation), or None."""
    lo, hi = truncation(d, lo, hi)
    if lo > hi:
        return f"truncation interval is empty ([{lo:g}, {hi:g}])"
    a, b = natural_support(d, base)
    if d.dist == "choice":
        s = base if d.relative else 1.0
        if not any(lo <= v * s <= hi for v in d.values):
            return f"no value lies within [{lo:g}, {hi:g}]"
    elif b < lo or a > hi:
        return f"the distribution's support [{a:g}, {b:g}] misses [{lo:g}, {hi:g}]"
    return None


def draw(d: Dist, rng: np.random.Generator, lo: float, hi: float, base: float = 1.0) -> float:
    """One draw, truncated to [lo, hi] (and Dist.min/max) by rejection."""
    lo, hi = truncation(d, lo, hi)
    s = base if d.relative else 1.0
    for _ in range(MAX_TRIES):
        if d.dist == "uniform":
            v = rng.uniform(d.low, d.high)
        elif d.dist == "normal":
            v = rng.normal(d.mean, d.std)
        elif d.dist == "lognormal":
            v = d.median * math.exp(d.sigma * rng.standard_normal())
        else:
            v = d.values[int(rng.integers(len(d.values)))]
        v *= s
        if lo <= v <= hi:
            return float(v)
    raise ValueError(f"no draw of {d.dist} fell within [{lo:g}, {hi:g}] in {MAX_TRIES} tries")


def read_table(path: str | Path, columns: list[str] | None = None) -> dict[str, np.ndarray]:
    """A CSV of fitted samples: {column: float64 array}; raises ValueError on bad content."""
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise ValueError(f"cannot read {path}: no such file") from None
    except Exception as exc:  # pandas raises many parser error types
        raise ValueError(f"cannot parse {path} as CSV: {exc}") from None
    if df.empty:
        raise ValueError(f"{path} has no rows")
    cols = list(df.columns) if columns is None else columns
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{path} has no column(s) {missing}")
    out = {}
    for c in cols:
        try:
            a = df[c].to_numpy(dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{path}: column {c!r} is not numeric") from None
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{path}: column {c!r} has missing or non-finite values")
        out[c] = a
    return out


class PlantRandomizer:
    """Resolved plant-parameter randomization of one GapsSection for one PlantSpec."""

    def __init__(self, section: GapsSection | None, spec, seed: int,
                 base: np.ndarray | None = None):
        self.spec = spec
        self.seed = int(seed)
        self.base = spec.nominal("params") if base is None else np.asarray(base, np.float64).copy()
        if section is not None:  # array groups -> their elements
            from hil.gaps.groups import expand_groups

            section = expand_groups(section, spec)[0]
        rz = section.randomize if section is not None else None
        self.dists = [] if rz is None else [
            (spec.index("params", name), name, d) for name, d in sorted(rz.plant.items())
        ]
        self.table: dict[str, np.ndarray] = {}
        self.table_rows = "random"
        if rz is not None and rz.table is not None:
            self.table = read_table(rz.table.file, rz.table.columns)
            self.table_rows = rz.table.rows
        self.table_idx = [(spec.index("params", c), c) for c in self.table]
        self.n_rows = len(next(iter(self.table.values()))) if self.table else 0

        self.spread = None if rz is None else rz.plant_spread
        self.hook = spec.randomize if self.spread is not None else None

    @property
    def active(self) -> bool:
        return bool(self.dists or self.table or self.hook)

    def draw_into(self, p: np.ndarray, episode: int) -> dict[str, float]:
        """Write this episode's parameter draws into p (plant units); return them by name.

        With [gaps.randomize] plant_spread, the plant's own hook `spec.randomize(p, rng,
        spread)` draws first (from the base values, stream 3), then the table and the named
        distributions override it. A hook that leaves a value non-finite or outside its
        bounds is a ValueError naming it (fail closed: no unphysical plant runs)."""
        drawn: dict[str, float] = {}
        if self.hook is not None:
            q = np.array(self.base, dtype=np.float64)
            self.hook(q, episode_rng(self.seed, episode, STREAM_HOOK), float(self.spread))
            lo, hi = self.spec.lows("params"), self.spec.highs("params")
            bad = np.flatnonzero(~(np.isfinite(q) & (q >= lo) & (q <= hi)))
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"{self.spec.name}'s randomization hook drew {self.spec.params[i].name} = {q[i]}, "
                                 f"outside [{lo[i]}, {hi[i]}] {self.spec.params[i].unit}")
            for i in np.flatnonzero(q != self.base):
                drawn[f"plant.{self.spec.params[i].name}"] = float(q[i])
            p[:] = q
        if self.table:
            if self.table_rows == "sequential":
                row = episode % self.n_rows
            else:
                row = int(episode_rng(self.seed, episode, STREAM_TABLE).integers(self.n_rows))
            drawn["plant.table_row"] = float(row)
            for i, name in self.table_idx:
                p[i] = self.table[name][row]
                drawn[f"plant.{name}"] = float(p[i])
        rng = episode_rng(self.seed, episode, STREAM_PLANT)
        for i, name, d in self.dists:
            q = self.spec.params[i]
            p[i] = draw(d, rng, q.low, q.high, self.base[i])
            drawn[f"plant.{name}"] = float(p[i])
        return drawn


def batch_parameters(section: GapsSection | None, spec, n: int, seed: int,
                     first_episode: int = 0, base: np.ndarray | None = None) -> np.ndarray:
    """P (n, n_params) for `run_batch`: row i = the plant draws of episode first_episode + i
    (parameters not randomized keep `base`, default the spec nominal)."""
    r = PlantRandomizer(section, spec, seed, base)
    P = np.repeat(r.base[None, :], n, axis=0)
    for i in range(n):
        r.draw_into(P[i], first_episode + i)
    return P
