"""Scalar parameters of the grid step (per-element arrays such as H, droop and thermal constants
live on :class:`~plants.grid.network.GridModel`). Units in the field names or comments."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class GridParams:
    """Scalars of the step; per-element arrays (H, droop, thermal) live on the model."""

    f0_hz: float = 50.0
    load_damping: float = 1.0         # pu load change per pu frequency change
    governor_tg_s: float = 0.5        # governor-turbine time constant
    agc_ki: float = 0.0               # AGC integral gain, pu power per (pu frequency * s); 0 = off
    freq_trip_hz: float = 2.5         # |f - f0| beyond which an island blacks out
    soft_limit: float = 1.0           # loading above which overflow steps count (Grid2Op: 100 %)
    hard_limit: float = 2.0           # loading that trips at once (Grid2Op HARD_OVERFLOW_THRESHOLD)
    overflow_allowed_steps: int = 2   # Grid2Op NB_TIMESTEP_OVERFLOW_ALLOWED: trips on the 3rd step
    cooldown_steps: int = 3           # steps a tripped line stays open before it may reclose
    temp_trip_c: float = np.inf       # conductor temperature trip
    t_amb_c: float = 25.0
    tol_pu: float = 1e-8              # Newton mismatch tolerance
    max_iter: int = 10
    max_cascade_rounds: int = 20
    share_tol_mw: float = 1e-3        # inertial sharing: slack residual left on the slack bus
    max_share_rounds: int = 8
    enforce_q_limits: bool = False    # PV -> PQ at a unit's Qmax/Qmin (MATPOWER ENFORCE_Q_LIMS)
    max_q_rounds: int = 10
    continuation_steps: int = 5       # recovery: load continuation in this many steps (and bisections)
    blackout_served_fraction: float = 0.5  # grid.blackout = 1 below this served share of the demand

    def __post_init__(self):
        positive = ("f0_hz", "governor_tg_s", "freq_trip_hz", "soft_limit", "tol_pu", "min_inertia_pu_s",
                    "share_tol_mw")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"grid.{name}: {getattr(self, name)!r} must be > 0")
        for name in ("load_damping", "agc_ki", "overflow_allowed_steps", "cooldown_steps", "max_share_rounds",
                     "max_q_rounds"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"grid.{name}: {getattr(self, name)!r} must be >= 0")
        for name in ("max_iter", "max_cascade_rounds", "continuation_steps"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"grid.{name}: {getattr(self, name)!r} must be >= 1")
        if not 0.0 <= self.blackout_served_fraction <= 1.0:
            raise ValueError(f"grid.blackout_served_fraction: {self.blackout_served_fraction!r} is not in 0..1")
        if not self.hard_limit >= self.soft_limit:
            raise ValueError(f"grid.hard_limit: {self.hard_limit!r} must be >= soft_limit ({self.soft_limit!r})")
    min_inertia_pu_s: float = 0.01    # floor for an island of inverter-only generation
