"""Small statistics shared by the calibration fits: the 95 % normal quantile, a robust
white-noise level from first differences, and the long-run variance factor of correlated
residuals (dimensionless unless stated)."""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054


def _robust_sigma_from_diffs(y: np.ndarray) -> float:
    d = np.diff(y[np.isfinite(y)])
    if d.size < 3:
        return math.nan
    mad = np.median(np.abs(d - np.median(d)))
    return float(1.4826 * mad / math.sqrt(2.0))


def long_run_factor(r: np.ndarray) -> float:
    """Long-run variance / variance of a residual series (Bartlett window, bandwidth
    2 sqrt(n)): how much less information correlated residuals carry than white ones, >= 1."""
    n = r.size
    if n < 8:
        return 1.0
    a = r - r.mean()
    g0 = float(a @ a)
    if g0 <= 0:
        return 1.0
    L = min(int(2 * math.sqrt(n)), n // 4)
    f = 1.0
    for lag in range(1, L + 1):
        f += 2.0 * (1.0 - lag / (L + 1)) * float(a[:-lag] @ a[lag:]) / g0
    return max(f, 1.0)


def _lag1(r: np.ndarray) -> float:
    if r.size < 4:
        return 0.0
    a = r - r.mean()
    den = float(a @ a)
    return float(np.clip((a[:-1] @ a[1:]) / den, -0.99, 0.99)) if den > 0 else 0.0
