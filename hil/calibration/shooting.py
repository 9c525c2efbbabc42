"""Multiple shooting for SysIdProblem (hil/calibration/sysid.py).

Each run is cut into segments of `shooting_s` seconds; the state at every segment start is a
free variable (scaled by the state's nominal magnitude) and the continuity defects
(x_end(segment s) - x_start(segment s+1)) / scale * DEFECT_WEIGHT are residuals beside the
output residuals. The Jacobian's sparsity (a node touches its own segment and one defect)
lets scipy's finite differences perturb many columns per simulation.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares
from scipy.sparse import lil_matrix

from hil.calibration.simulate import BAD_RESIDUAL

DEFECT_WEIGHT = 100.0  # factor on a continuity defect in state scales (output residuals are in sigmas)


def segments(problem, shooting_s: float):
    """Per run, the sample indices where segments start (plus the last sample)."""
    segs = []
    for run in problem.runs:
        nodes = [0]
        t_next = shooting_s
        for k in range(1, run.t_s.size - 1):
            if run.t_s[k] >= t_next:
                nodes.append(k)
                t_next = run.t_s[k] + shooting_s
        nodes.append(run.t_s.size - 1)
        segs.append(nodes)
    return segs


def multiple_shooting(self, theta0, shooting_s: float, max_nfev: int = 15, verbose: int = 0):
    """Fit with free states at every segment start (`self`: a SysIdProblem); returns
    (theta, scipy result), theta = parameters + initial states + sensor offsets, to be polished
    by single shooting (which alone adds the reference residuals: this stage only seeds it)."""
    spec = self.spec
    segs = segments(self, shooting_s)
    nx = spec.n_states
    xs = np.array([max(abs(q.nominal), 1e-3 * (q.high - q.low)) for q in spec.states])
    # node initial guesses from a single-shooting simulation at theta0 (clipped to bounds)
    sims = self.simulate(theta0)
    node_vals = []
    for r, nodes in enumerate(segs):
        X = sims[r][1]
        for k in nodes[1:-1]:
            v = X[k].copy()
            bad = ~np.isfinite(v)
            v[bad] = spec.nominal("states")[bad]
            node_vals.append(np.clip(v, spec.lows("states"), spec.highs("states")))
    n_nodes = len(node_vals)
    nth = self.n_theta
    z0 = np.concatenate([theta0] + [v / xs for v in node_vals]) if n_nodes else np.array(theta0)
    lo, hi = self.bounds()
    lo = np.concatenate([lo] + [spec.lows("states") / xs] * n_nodes)
    hi = np.concatenate([hi] + [spec.highs("states") / xs] * n_nodes)
    z0 = np.clip(z0, lo, hi)
    # row layout and sparsity
    row_blocks = []  # (run, seg, n_out_rows, has_defect)
    n_rows = 0
    for r, nodes in enumerate(segs):
        m = self.masks[r]
        for s in range(len(nodes) - 1):
            k0, k1 = nodes[s], nodes[s + 1]
            last = s == len(nodes) - 2
            n_out = int(m[k0:(k1 + 1 if last else k1)].sum())
            row_blocks.append((r, s, n_out, not last, n_rows))
            n_rows += n_out + (0 if last else nx)
    sparsity = lil_matrix((n_rows, z0.size), dtype=np.int8)
    node_base = {}
    c = nth
    for r, nodes in enumerate(segs):
        for s in range(1, len(nodes) - 1):
            node_base[(r, s)] = c
            c += nx
    ns = len(self.init_states)
    for (r, s, n_out, has_def, row0) in row_blocks:
        n_here = n_out + (nx if has_def else 0)
        sparsity[row0:row0 + n_here, :len(self.params)] = 1
        if self.n_sensor:
            sparsity[row0:row0 + n_out, nth - self.n_sensor:nth] = 1
        if s == 0 and ns:
            off = len(self.params) + r * ns
            sparsity[row0:row0 + n_here, off:off + ns] = 1
        if s > 0:
            b = node_base[(r, s)]
            sparsity[row0:row0 + n_here, b:b + nx] = 1
        if has_def:
            b = node_base[(r, s + 1)]
            for i in range(nx):
                sparsity[row0 + n_out + i, b + i] = 1

    bufs = [(np.full((r.t_s.size, spec.n_outputs), np.nan), np.empty((r.t_s.size, nx))) for r in self.runs]

    def fun(z):
        theta = z[:nth]
        p = self.p_of(theta)
        out = np.empty(n_rows)
        for (r, s, n_out, has_def, row0) in row_blocks:
            run = self.runs[r]
            nodes = segs[r]
            k0, k1 = nodes[s], nodes[s + 1]
            x0 = self.x0_of(theta, r) if s == 0 else z[node_base[(r, s)]:node_base[(r, s)] + nx] * xs
            Ysim, Xsim = bufs[r]
            _, _, x_end, _ = self.sim.run(self.run_at(theta, r), p, x0, k0, k1, Ysim, Xsim)
            last = not has_def
            kk = slice(k0, k1 + 1 if last else k1)
            m = self.masks[r][kk]
            d = ((Ysim[kk][:, self.o_idx] + self.offset_of(theta, run, kk) - run.Y[kk][:, self.o_idx])
                 / self.sigma[self.o_idx])[m]
            out[row0:row0 + n_out] = d
            if has_def:
                nxt = z[node_base[(r, s + 1)]:node_base[(r, s + 1)] + nx] * xs
                out[row0 + n_out:row0 + n_out + nx] = DEFECT_WEIGHT * (x_end - nxt) / xs
        out[~np.isfinite(out)] = BAD_RESIDUAL
        return out

    sol = least_squares(fun, z0, bounds=(lo, hi), jac_sparsity=sparsity, method="trf",
                        x_scale="jac", max_nfev=max_nfev, verbose=verbose)
    return sol.x[:nth], sol
