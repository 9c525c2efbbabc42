"""Entry policies for tests/integration/test_gym_shield_lockstep.py: deterministic functions of
the features ["dissolved_oxygen", "u.agitation_power"], actions [agitation_power, base_flow],
so the gym (calling them itself) and the policy process propose the same on the same observation."""

import math

import numpy as np

FEATURES = ["dissolved_oxygen", "u.agitation_power"]
ACTIONS = ["agitation_power", "base_flow"]


def wavy(x):
    """Push the agitation toward 40 % DO with steps the rate limit (2 W/s) often cuts; silent
    (NaN) on about 4 % of the observations, chosen by the DO reading itself."""
    do, ag = float(x[0]), float(x[1])
    if not (math.isfinite(do) and math.isfinite(ag)):
        return np.array([math.nan, math.nan])
    frac = (do * 8.0) % 1.0
    if frac < 0.04:
        return np.array([math.nan, math.nan])
    step = (6.0 if do < 40.0 else -1.5) * (1.0 if frac < 0.5 else 0.2)
    return np.array([ag + step, 0.0003 + 0.0004 * (frac - 0.5)])
