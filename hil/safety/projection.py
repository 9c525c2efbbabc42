"""Bounded action projection: the closest action (Euclidean, plant units) inside the envelope.

Envelope, per call:
1. box: the spec's input bounds intersected with [safety.projection].box (hard);
2. rate: [prev - rate * dt_s, prev + rate * dt_s] around the previous action (the wrapper
   passes the APPLIED value from the observation and one loop step as dt_s);
3. band: limited-autonomy envelope (baseline +/- max deviation, limited box), optional;
   intervals are intersected in this order of priority: when a later interval does not meet
   the current one, the current one collapses to its point nearest to it (the box always holds);
4. state-dependent linear limits W a <= b(state), b = b0 + By @ y_meas + Bu @ u_applied,
   projected onto together with the box of steps 1-3: exactly for one limit (piecewise-linear
   root of the multiplier), by Dykstra's alternating projections for several. Only the
   signals with a non-zero coefficient enter b; a b that cannot be computed (one of them
   Bad: NaN) is reported by `unknown_limits`, and the caller must not let the policy act
   (fail closed): the fallback is then projected with `linear=False` (box, rate, band).
   Plant limits ([[safety.projection.plant]]): rows whose weights AND bound depend on the
   state, rebuilt every call by a family the plant module provides (`SAFETY_LIMITS[kind]`,
   e.g. plants/panda.py's Cartesian box for the end effector, linearised each step):
   `factory(model, action_names, options)` returns an object with `m` (rows, fixed: a row
   that does not apply this step is W = 0, b = 0), `reads` (output indices it uses),
   `fill(y, u, W, b)` writing W (m, n_actions) and b (m,) in plant units, and optionally
   `row_names` (m names). They join the configured limits (same kernel, same clip reasons
   `linear:<name>`, `linear:<name>.<row name>` with row_names); a Bad output among `reads`
   makes them unknown (fail closed, as above); a `fill` that raises or writes a non-finite
   value holds the action at its applied value for that decision (clipped to the box; clip
   reason `linear:<name>.failed`, counted in `fill_failures`).
   E.g. plants/grid's `line_rating`: PTDF rows of the current topology per line.

The result minimises sum(((a - proposal) / span)^2) over the envelope, span = each input's
physical range (so a W and an L/h count alike whatever their units). If the linear limits
cannot hold inside the box, the result is the box point nearest to them and `infeasible` is
set. Every
clip is reported with its reason (`box_high`, `rate_up`, `band_low`, `linear:<name>`, ...).

The kernel is Numba-compiled and allocates nothing but the breakpoint sort of the one-limit
case; building the clip list (Python) happens only when something was clipped.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from numba import njit

SRC_BOX, SRC_RATE, SRC_BAND = 0, 1, 2
_SRC_NAMES = ("box", "rate", "band")
_TOL = 1e-9
log = logging.getLogger("hil.safety")


@njit(cache=True, nogil=True, inline="always")
def _intersect(l, h, sl, sh, nl, nh, code):
    """Intersect [l, h] with [nl, nh]; if disjoint, collapse to the nearest point of [l, h]."""
    if nl > h:  # wholly above: keep h
        return h, h, sh, sh
    if nh < l:  # wholly below: keep l
        return l, l, sl, sl
    if nl > l:
        l, sl = nl, code
    if nh < h:
        h, sh = nh, code
    return l, h, sl, sh


@njit(cache=True, nogil=True)
def _g(a, w, lo, hi, lam, b):
    s = 0.0
    for i in range(a.size):
        v = a[i] - lam * w[i]
        if v < lo[i]:
            v = lo[i]
        elif v > hi[i]:
            v = hi[i]
        s += w[i] * v
    return s - b


@njit(cache=True, nogil=True)
def _one_halfspace(a, w, b, lo, hi, out, bp):
    """out = argmin ||x - a|| s.t. lo <= x <= hi, w.x <= b. Returns False if infeasible."""
    n = a.size
    g0 = _g(a, w, lo, hi, 0.0, b)
    if g0 <= 0.0:
        for i in range(n):
            out[i] = min(max(a[i], lo[i]), hi[i])
        return True
    m = 0
    for i in range(n):
        if w[i] != 0.0:
            for edge in (lo[i], hi[i]):
                lam = (a[i] - edge) / w[i]
                if lam > 0.0:
                    bp[m] = lam
                    m += 1
    bps = np.sort(bp[:m])
    lam_prev, g_prev = 0.0, g0
    lam_star = -1.0
    for j in range(m):
        gj = _g(a, w, lo, hi, bps[j], b)
        if gj <= 0.0:
            if g_prev - gj > 0.0:
                lam_star = lam_prev + g_prev * (bps[j] - lam_prev) / (g_prev - gj)
            else:
                lam_star = bps[j]
            break
        lam_prev, g_prev = bps[j], gj
    feasible = lam_star >= 0.0
    if not feasible:
        lam_star = bps[m - 1] if m > 0 else 0.0
    for i in range(n):
        out[i] = min(max(a[i] - lam_star * w[i], lo[i]), hi[i])
    return feasible


@njit(cache=True, nogil=True)
def project_kernel(a, prev, dt_s, y, u, lo, hi, rate, band_lo, band_hi, Wz, b0, By, Bu, scale,
                   out, lo_eff, hi_eff, src, bvec, work, max_iter):
    """Fill out (projected action), lo_eff/hi_eff/src (effective bounds and their sources),
    bvec (b(state)). Returns 0 unchanged, 1 clipped, 2 clipped and linear limits infeasible.

    dt_s < 0 means no previous action (no rate limit). Wz = W * scale (columns): the linear
    part is solved in span-scaled coordinates z = x / scale. work: (m + 6, 2n) scratch.
    By, Bu may have fewer rows than Wz (m_b <= m): rows from m_b on have b = b0 (a plant
    family's rows, their b written by its fill), and their zero coefficients are not scanned
    (m_b x (n_outputs + n_inputs) tests a call otherwise).
    """
    n = a.size
    m = Wz.shape[0]
    m_b = By.shape[0]
    for i in range(n):
        l = lo[i]
        h = hi[i]
        sl = SRC_BOX
        sh = SRC_BOX
        if dt_s >= 0.0 and rate[i] < np.inf:
            l, h, sl, sh = _intersect(l, h, sl, sh, prev[i] - rate[i] * dt_s, prev[i] + rate[i] * dt_s, SRC_RATE)
        if band_lo[i] > -np.inf or band_hi[i] < np.inf:
            l, h, sl, sh = _intersect(l, h, sl, sh, band_lo[i], band_hi[i], SRC_BAND)
        lo_eff[i] = l
        hi_eff[i] = h
        src[i] = sl
        src[n + i] = sh
        out[i] = min(max(a[i], l), h)
    for k in range(m_b, m):
        bvec[k] = b0[k]
    for k in range(m_b):
        s = b0[k]
        for j in range(y.size):
            if By[k, j] != 0.0:  # 0 * NaN is NaN: a Bad signal b does not use must not count
                s += By[k, j] * y[j]
        for j in range(u.size):
            if Bu[k, j] != 0.0:
                s += Bu[k, j] * u[j]
        bvec[k] = s
    status = 0
    for i in range(n):
        if out[i] != a[i]:
            status = 1
            break
    if m == 0:
        return status
    # early exit: the box-clipped proposal inside every row (the common case: no Dykstra).
    # The scaled point z = out / scale once (work row m+5), then each row's Wz . z: n
    # divisions per call instead of m n (a rounding of 1e-16 relative against the per-term
    # form; the test's tolerance is _TOL)
    outz = work[m + 5]
    for i in range(n):
        outz[i] = out[i] / scale[i]
    violated = False
    for k in range(m):
        s = 0.0
        for i in range(n):
            s += Wz[k, i] * outz[i]
        if s > bvec[k] + _TOL * (1.0 + abs(bvec[k])):
            violated = True
            break
    if not violated:
        return status
    # scaled coordinates: az, loz, hiz in work rows m+2.., the result x in `out` (scaled)
    az = work[m + 2]
    loz = work[m + 3]
    hiz = work[m + 4]
    for i in range(n):
        az[i] = a[i] / scale[i]
        loz[i] = lo_eff[i] / scale[i]
        hiz[i] = hi_eff[i] / scale[i]
    x = out
    ok = True
    if m == 1:
        ok = _one_halfspace(az[:n], Wz[0], bvec[0], loz[:n], hiz[:n], x, work[m + 5])
    else:
        # Dykstra: sets 0 (box) and 1..m (halfspaces); work[k] holds the increment of set k.
        for i in range(n):
            x[i] = az[i]
        for k in range(m + 1):
            for i in range(n):
                work[k, i] = 0.0
        for k in range(m):  # |row|^2 once (the same sum, same order, as it was per iteration); zero rows
            # are skipped: their projection step leaves x as it is (a zero row with b < 0 cannot hold:
            # the final check below reports it infeasible). So are the rows no point of the box can
            # violate (max over the box of Wz . z <= b: the box lies inside their halfspace, so
            # the intersection, hence its projection, is the same without them; Dykstra's path
            # differs, its limit does not). The final check below still tests every row.
            ww = 0.0
            top = 0.0
            for i in range(n):
                w = Wz[k, i]
                ww += w * w
                if w > 0.0:
                    top += w * hiz[i]
                elif w < 0.0:
                    top += w * loz[i]
            work[k + 1, n] = ww if top > bvec[k] else 0.0
        for _ in range(max_iter):
            change = 0.0
            for i in range(n):
                v = x[i] + work[0, i]
                p = min(max(v, loz[i]), hiz[i])
                work[0, i] = v - p
                change = max(change, abs(p - x[i]))
                x[i] = p
            for k in range(m):
                if work[k + 1, n] == 0.0:  # a zero row (an inactive plant row: W = 0, b = 0): its step is x
                    continue
                s = 0.0
                for i in range(n):
                    s += Wz[k, i] * (x[i] + work[k + 1, i])
                over = (s - bvec[k]) / work[k + 1, n] if s > bvec[k] else 0.0
                for i in range(n):
                    v = x[i] + work[k + 1, i]
                    p = v - over * Wz[k, i]
                    work[k + 1, i] = v - p
                    change = max(change, abs(p - x[i]))
                    x[i] = p
            if change <= 1e-13:
                break
        for i in range(n):  # end on the box (hard)
            x[i] = min(max(x[i], loz[i]), hiz[i])
        for k in range(m):
            s = 0.0
            wn = 0.0
            for i in range(n):
                s += Wz[k, i] * x[i]
                wn += abs(Wz[k, i])
            if s > bvec[k] + 1e-7 * (abs(bvec[k]) + wn):
                ok = False
    for i in range(n):
        out[i] = min(max(x[i] * scale[i], lo_eff[i]), hi_eff[i])
    return 1 if ok else 2


@dataclass(frozen=True)
class Clip:
    """One clipped action component: input, reason, proposed and resulting value (plant units)."""

    input: str
    reason: str
    proposed: float
    applied: float

    def as_dict(self) -> dict:
        return {"input": self.input, "reason": self.reason, "proposed": self.proposed, "applied": self.applied}


class Projector:
    """The projection configured for one set of action inputs (names resolved once)."""

    def __init__(self, section, spec, action_names: list[str], plant=None):
        """plant: the PlantModel (needed for [[safety.projection.plant]] limits)."""
        from hil.safety.config import signal_index

        self.names = list(action_names)
        n = len(self.names)
        self.lo = np.array([spec.quantity("inputs", a).low for a in self.names])
        self.hi = np.array([spec.quantity("inputs", a).high for a in self.names])
        self.rate = np.full(n, np.inf)
        for i, name in enumerate(self.names):
            if name in section.box:
                lo, hi = section.box[name]
                self.lo[i], self.hi[i] = max(self.lo[i], lo), min(self.hi[i], hi)
            if name in section.rate:
                self.rate[i] = section.rate[name]
        self.families = []  # (name, family object, first row)
        m_static = len(section.linear)
        m = m_static
        for i, pl in enumerate(getattr(section, "plant", ())):
            fam = plant_limit_family(plant, pl.kind, self.names, pl.options, f"safety.projection.plant[{i}]")
            self.families.append((pl.name, fam, m))
            m += int(fam.m)
        self.linear_names = [lim.name for lim in section.linear]   # per row: its clip reason
        self.limit_names = list(self.linear_names)                    # per row: its limit's name
        for name, fam, _ in self.families:
            rows = getattr(fam, "row_names", None)
            if rows is not None and len(rows) != int(fam.m):
                raise ValueError(f"plant limit {name!r}: {len(rows)} row_names for {fam.m} rows")
            self.linear_names += [f"{name}.{r}" for r in rows] if rows is not None else [name] * int(fam.m)
            self.limit_names += [name] * int(fam.m)
        self._action_u = np.array([spec.index("inputs", a) for a in self.names], dtype=np.intp)
        self.fill_failures = 0
        self.W = np.zeros((m, n))
        self.b0 = np.zeros(m)
        self.By = np.zeros((m, spec.n_outputs))
        self.Bu = np.zeros((m, spec.n_inputs))
        for k, lim in enumerate(section.linear):
            for name, w in lim.w.items():
                self.W[k, self.names.index(name)] = w
            self.b0[k] = lim.b0
            for sig, coef in lim.b.items():
                kind, j = signal_index(spec, sig)
                (self.Bu if kind == "u" else self.By)[k, j] += coef
        self._By_b, self._Bu_b = self.By[:m_static], self.Bu[:m_static]  # the families' b reads no signal
        self.scale = np.array([max(spec.quantity("inputs", a).high - spec.quantity("inputs", a).low, 1e-12)
                               for a in self.names])
        self.Wz = self.W * self.scale[None, :]
        self._fam_reads = np.zeros((m, spec.n_outputs), dtype=bool)
        for _, fam, r0 in self.families:
            self._fam_reads[r0:r0 + fam.m, np.asarray(fam.reads, dtype=np.intp)] = True
        self._nolin = (np.zeros((0, n)), np.zeros(0), np.zeros((0, spec.n_outputs)), np.zeros((0, spec.n_inputs)),
                       np.zeros(0))
        self._uses_y = self.By != 0.0  # (m, n_outputs): which outputs each b reads
        self._uses_u = self.Bu != 0.0
        self.max_iter = int(section.max_iter)
        self.out = np.zeros(n)
        self.lo_eff = np.zeros(n)
        self.hi_eff = np.zeros(n)
        self.src = np.zeros(2 * n, dtype=np.int64)
        self.bvec = np.zeros(m)
        self.work = np.zeros((m + 6, 2 * n))
        self.no_band_lo = np.full(n, -np.inf)
        self.no_band_hi = np.full(n, np.inf)
        self._nan = np.full(n, np.nan)
        self.infeasible = False
        self._linear_used = True

    def unknown_limits(self, y: np.ndarray, u: np.ndarray) -> list[str]:
        """Names of the linear limits whose b(state) cannot be computed: a signal it reads
        (non-zero coefficient) is not finite (Bad). Empty in the common case, cheaply."""
        if not self.linear_names:
            return []
        bad_y = ~np.isfinite(y)
        bad_u = ~np.isfinite(u)
        if not (bad_y.any() or bad_u.any()):
            return []
        hit = (self._uses_y[:, bad_y].any(axis=1) | self._uses_u[:, bad_u].any(axis=1)
               | self._fam_reads[:, bad_y].any(axis=1))
        return list(dict.fromkeys(self.limit_names[k] for k in np.flatnonzero(hit)))

    def _fill_families(self, y, u) -> str | None:
        """Rebuild the plant limits' rows (weights and bounds) at this observation; the name
        of the first family that failed (raised, or wrote a non-finite value), else None."""
        for name, fam, r0 in self.families:
            r1 = r0 + fam.m
            W, b = self.W[r0:r1], self.b0[r0:r1]
            try:
                fam.fill(y, u, W, b)
                if not (np.isfinite(W).all() and np.isfinite(b).all()):
                    raise ValueError("non-finite row")
            except Exception as exc:  # fail closed: the caller holds the applied action
                self.fill_failures += 1
                log.warning("safety: plant limit %r failed (%s): action held at its applied value", name, exc)
                W[:] = 0.0
                b[:] = 0.0
                return name
            np.multiply(W, self.scale[None, :], out=self.Wz[r0:r1])
        return None

    def project(self, a, prev, dt_s, y, u, band_lo=None, band_hi=None,
                linear: bool = True) -> tuple[np.ndarray, list[Clip]]:
        """(projected action, clips). prev=None or dt_s < 0: no rate limit. linear=False: box,
        rate and band only (the linear limits cannot be computed). Returns a copy."""
        a = np.asarray(a, dtype=np.float64)
        if prev is None:
            prev, dt_s = self._nan, -1.0
        if linear and self.families:
            failed = self._fill_families(y, u)
            if failed is not None:  # nothing moves: the applied value, inside the box
                held = np.minimum(np.maximum(np.asarray(u, dtype=np.float64)[self._action_u], self.lo), self.hi)
                self.infeasible = False
                return held, [Clip(self.names[i], f"linear:{failed}.failed", float(a[i]), float(held[i]))
                              for i in range(held.size) if held[i] != a[i]]
        Wz, b0, By, Bu, bvec = (self.Wz, self.b0, self._By_b, self._Bu_b, self.bvec) if linear else self._nolin
        self._linear_used = linear
        status = project_kernel(
            a, prev, float(dt_s), y, u, self.lo, self.hi, self.rate,
            self.no_band_lo if band_lo is None else band_lo,
            self.no_band_hi if band_hi is None else band_hi,
            Wz, b0, By, Bu, self.scale,
            self.out, self.lo_eff, self.hi_eff, self.src, bvec, self.work, self.max_iter,
        )
        self.infeasible = status == 2
        out = self.out.copy()
        if status == 0:
            return out, []
        return out, self._clips(a, out, status == 2)

    def _clips(self, a: np.ndarray, out: np.ndarray, infeasible: bool) -> list[Clip]:
        n = len(self.names)
        clips: list[Clip] = []
        active = []
        for k in range(self.W.shape[0] if self._linear_used else 0):
            if float(self.W[k] @ a) > self.bvec[k] and float(self.W[k] @ out) >= self.bvec[k] - 1e-6 * (1 + abs(self.bvec[k])):
                active.append(k)
        for i in range(n):
            if math.isclose(out[i], a[i], rel_tol=1e-12, abs_tol=1e-12):
                continue
            span = max(self.hi_eff[i] - self.lo_eff[i], 1e-12)
            reasons = []
            if out[i] <= self.lo_eff[i] + 1e-9 * span and a[i] < out[i]:
                reasons.append(f"{_SRC_NAMES[self.src[i]]}_low")
            elif out[i] >= self.hi_eff[i] - 1e-9 * span and a[i] > out[i]:
                reasons.append(f"{_SRC_NAMES[self.src[n + i]]}_high")
            linear = [f"linear:{self.linear_names[k]}" for k in active if self.W[k, i] != 0.0]
            if linear and (not reasons or self.lo_eff[i] + 1e-9 * span < out[i] < self.hi_eff[i] - 1e-9 * span):
                reasons = linear
            elif linear:
                reasons += linear
            if infeasible:
                reasons.append("infeasible")
            clips.append(Clip(self.names[i], "+".join(reasons) or "linear", float(a[i]), float(out[i])))
        return clips


def plant_module(plant):
    """The module of a PlantModel (its safety hooks live there), or None."""
    import importlib

    from plants.base import plant_module_path

    if plant is None or not getattr(plant, "name", ""):
        return None
    return importlib.import_module(plant_module_path(plant.name))


def plant_limit_family(plant, kind: str, action_names, options: dict, path: str):
    """The limit family `kind` of the plant's module (`SAFETY_LIMITS`), built for these
    actions; ValueError("<path>.<what>: reason") when the plant has none or refuses options."""
    module = plant_module(plant)
    families = getattr(module, "SAFETY_LIMITS", None) or {}
    if kind not in families:
        who = plant.name if plant is not None else "the plant"
        raise ValueError(f"{path}.kind: {who} provides no limit family {kind!r} "
                         f"(known: {', '.join(families) or 'none'})")
    try:
        fam = families[kind](plant, list(action_names), dict(options))
    except ValueError as exc:
        what, _, reason = str(exc).partition(": ")
        raise ValueError(f"{path}.options.{what}: {reason}" if reason else f"{path}: {exc}") from None
    return fam
