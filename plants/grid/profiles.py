"""Load and renewable profiles from CSV, interpolated per step into the model's scale arrays.

CSV layout (header row, comma separated, one row per time point, ``time_s`` ascending):

    time_s,load,load.14,gen.4
    0,1.00,1.00,0.80
    900,1.05,0.90,0.35

- ``time_s``: seconds from the start of the run (required);
- ``load``: multiplier of every bus load (default 1);
- ``load.<bus>``: multiplier of the load at MATPOWER bus number <bus>, on top of ``load``;
- ``gen.<k>``: multiplier of generator k's active-power setpoint (k = 1-based row of ``mpc.gen``):
  how a wind or solar unit follows its availability profile.

Values between rows are interpolated linearly; before the first and after the last row they are
held. Multipliers must be finite and >= 0.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from plants.grid.case import Case


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file, column/row and reason."""


@dataclass
class Profile:
    """Tabulated multipliers: ``load_scale`` (n_t x n_bus), ``gen_scale`` (n_t x n_gen)."""

    time_s: np.ndarray
    load_scale: np.ndarray
    gen_scale: np.ndarray

    def at(self, t_s: float, load_out: np.ndarray, gen_out: np.ndarray) -> None:
        """Write the multipliers at time ``t_s`` (s) into the given arrays (no allocation)."""
        interpolate_rows(self.time_s, self.load_scale, t_s, load_out)
        interpolate_rows(self.time_s, self.gen_scale, t_s, gen_out)


@njit(cache=True, nogil=True)
def interpolate_rows(times, table, t, out):
    """Linear interpolation of the rows of ``table`` at time t; held outside [times[0], times[-1]]."""
    n = times.shape[0]
    if t <= times[0]:
        out[:] = table[0]
        return
    if t >= times[n - 1]:
        out[:] = table[n - 1]
        return
    lo, hi = 0, n - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if times[mid] <= t:
            lo = mid
        else:
            hi = mid
    w = (t - times[lo]) / (times[hi] - times[lo])
    for j in range(out.shape[0]):
        out[j] = (1.0 - w) * table[lo, j] + w * table[hi, j]


def read_profile(path: str | Path, case: Case) -> Profile:
    """Read a profile CSV (see module doc) for ``case``."""
    path = Path(path)
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows or "time_s" not in [h.strip() for h in rows[0]]:
        raise ProfileError(f"{path}: header must contain a 'time_s' column")
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if any(cell.strip() for cell in r)]
    if not body:
        raise ProfileError(f"{path}: no data rows")
    try:
        data = np.array([[float(cell) for cell in r] for r in body], dtype=np.float64)
    except ValueError as exc:
        raise ProfileError(f"{path}: non-numeric cell ({exc})") from None
    if data.shape[1] != len(header):
        raise ProfileError(f"{path}: rows have {data.shape[1]} cells, header has {len(header)}")
    t = data[:, header.index("time_s")]
    if np.any(np.diff(t) <= 0):
        raise ProfileError(f"{path}: time_s must be strictly increasing")
    load = np.ones((len(t), case.n_bus))
    gen = np.ones((len(t), case.n_gen))
    for j, name in enumerate(header):
        col = data[:, j]
        if name == "time_s":
            continue
        if not np.all(np.isfinite(col)) or np.any(col < 0):
            raise ProfileError(f"{path}: column {name!r}: multipliers must be finite and >= 0")
        if name == "load":
            load *= col[:, None]
        elif name.startswith("load."):
            try:
                load[:, case.bus_index(int(name[5:]))] *= col
            except (KeyError, ValueError):
                raise ProfileError(f"{path}: column {name!r}: no bus {name[5:]!r} in case {case.name!r}") from None
        elif name.startswith("gen."):
            k = int(name[4:]) if name[4:].isdigit() else 0
            if not 1 <= k <= case.n_gen:
                raise ProfileError(f"{path}: column {name!r}: generator rows are 1..{case.n_gen}")
            gen[:, k - 1] *= col
        else:
            raise ProfileError(f"{path}: column {name!r}: expected load, load.<bus> or gen.<row>")
    return Profile(t, load, gen)
