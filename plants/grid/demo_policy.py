"""The grid118 demo's greedy policy (`policies/grid118/v1`, kind "entry"): it wants throughput.

The playbook's story scaled to case118: a policy rewarded for cheap energy keeps shifting
generation from unit 29 (bus 66) to unit 11 (bus 25) until unit 11 is at its Pmax, a transfer
that would push about 113 MW through line 54 (bus 30 - bus 38, rated 104.5 MVA by the
scenario's base_flow ratings): 108 %, like 2.4 GW through a line rated 2.2 GW. Only the
safety wrapper's PTDF line limits stop it.

Features (measured, MW): gen_11.p_mw, gen_29.p_mw. Actions (MW): gen_11.p_set, gen_29.p_set.
Each step it proposes 10 MW more on unit 11 than it measures (up to Pmax) and takes the same
transfer off unit 29 (balanced: frequency stays put). A non-finite feature gives a NaN
proposal, which the wrapper treats as silence (baseline).
"""

from __future__ import annotations

import numpy as np

P11_0_MW, P11_MAX_MW = 220.0, 320.0   # unit 11: case118 schedule and Pmax
P29_0_MW = 392.0                      # unit 29: case118 schedule
RAMP_MW = 10.0                        # per step the policy asks for


class GreedyTransfer:
    """act(features) -> [gen_11.p_set, gen_29.p_set] in MW."""

    def act(self, x: np.ndarray) -> np.ndarray:
        p11 = float(x[0])
        up = min(P11_MAX_MW, p11 + RAMP_MW)
        moved = up - P11_0_MW
        return np.array([up, P29_0_MW - moved])
