"""Shared-parameter layout of N instances' gaps, for the vector env's fused step (issue 18, Gym).

`GapPipeline` keeps one arena per instance (hil/gaps/arena.py): header, parameters, states,
streams and delay rings of both directions. HilVectorEnv held N copies, so every instance-step
read its own copy of the parameter tables (sensor P: 20 columns per output, actuator P: 18 per
input, latency L: 11 per channel, sigch, profiles, two headers: ~60 cache lines for
bioreactor_gym) although the scenario fixes them for every instance; only the fields the
randomization draws differ. Here:

    shared (one buffer SP per block of rows, kept in L1 across the block; header HS):
        actuator P, actuation L, sigch, profiles, work; sensor P, observation L, sigch,
        profiles, work: the template pipeline's values
    per instance (one record row REC[i], header HR shared):
        hot part first, contiguous: actuator S, sensor X, sensor R, both lines' counters I and
        streams R, then the parameter rows the randomization draws (their values this
        episode), then the rings (T, V of each line; a step reads a few lines of them)
    drawn rows (DV, int64 (n, 3): destination offset in SP, source offset in REC[i], items):
        `load_drawn` copies instance i's drawn rows into SP before its step

The kernels (`actuate_rows_of`, `sense_rows_of`) call the very gap kernels GapPipeline's arena
calls (hil/gaps/latency.py delay_apply, actuator.py actuator_apply, sensor.py sensor_apply) on
the same values in the same order, so the results are bit-identical (tests/hil/gaps/
test_compact.py); only where the numbers live changes. A row of the template's parameters
that is not drawn must stay the template's (`load` checks it at every episode start).

The vector env's fused step no longer calls these generic kernels on SP: it calls the kernels
hil/gaps/specialize.py generates for the scenario on the same record rows (the fixed parameters
compiled in, the drawn rows read from the record). `actuate_compact` / `sense_compact` remain the
layout's reference (tests/hil/gaps/test_compact.py) and its generic form.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hil.gaps import actuator as act
from hil.gaps import latency as lat
from hil.gaps import sensor as sen
from hil.gaps.arena import HDR, f1, f2, f3, i1, i2, u1

# shared slots (SP)
C_WIN, C_PA, C_LA, C_SIGA, C_PROFA, C_WOUT, C_PS, C_LO, C_SIGO, C_PROFO = range(10)
# record slots (REC[i]): hot state, then drawn rows (R_DRAWN + j), then the rings (after them)
R_SA, R_XS, R_RS, R_IA, R_RA, R_IO, R_RO = range(7)
R_DRAWN = 7
LINE_ITEMS = 8  # float64 items per 64-byte cache line


def _pack(arrays: list[np.ndarray], align_from: int | None = None) -> tuple[np.ndarray, np.ndarray, list]:
    """(buffer, header, offsets) of arrays packed back to back, no header in the buffer (the
    header is shared by every row); slots from index align_from on start on a cache line."""
    head = np.zeros(HDR * max(len(arrays), 1), dtype=np.int64)
    offsets, size = [], 0
    for k, a in enumerate(arrays):
        if a.dtype not in (np.float64, np.int64, np.uint64) or a.ndim > 3:
            raise TypeError(f"cannot pack {a.dtype} array of ndim {a.ndim}")
        if align_from is not None and k >= align_from:
            size = -(-size // LINE_ITEMS) * LINE_ITEMS
        shape = a.shape + (1,) * (3 - a.ndim)
        head[HDR * k: HDR * k + 4] = (size, *shape)
        offsets.append(size)
        size += a.size
    buf = np.zeros(max(size, 1))
    for a, o in zip(arrays, offsets):
        buf.view(a.dtype)[o: o + a.size] = a.reshape(-1)
    return buf, head, offsets


def _flat(a: np.ndarray) -> np.ndarray:
    """a's items as float64 bits (int64/uint64 reinterpreted, not converted)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.float64)


class CompactGaps:
    """The gaps of N instances of one template GapPipeline in the shared-parameter layout.

    template: the pipeline every instance is a copy of (HilVectorEnv.template: one layout, the
    scenario's configuration); n: instances; blocks: rows stepped concurrently (one SP each)."""

    def __init__(self, template, n: int, blocks: int = 1):
        g = template
        a, s, d, o = g.actuators, g.sensors, g.actuation, g.observation
        self.template = g
        self.shared_arrays = [g._work_in, a.P, d.L, d.sigch, d.prof, g._work_out, s.P, o.L, o.sigch, o.prof]
        sp, self.HS, self._sp_off = _pack(self.shared_arrays)
        self.SP = [sp.copy() for _ in range(max(1, int(blocks)))]
        # drawn rows: every row of a parameter table a randomization target rewrites (whole rows:
        # a field can set several columns, e.g. adc_bits the quantizer's four)
        tables = {"sensors": (C_PS, s.P), "actuators": (C_PA, a.P), "observation": (C_LO, o.L),
                  "actuation": (C_LA, d.L)}
        rows = set()
        for _key, group, name, _field, _dist, _lims in g._targets:
            if group == "sensors":
                r = g.spec.index("outputs", name)
            elif group == "actuators":
                r = g.spec.index("inputs", name)
            else:
                r = g._chan_idx[group][name]
            rows.add((group, r))
        self.drawn_rows = sorted(rows)  # [(group, row)]
        self._drawn_src = [tables[grp][1][r] for grp, r in self.drawn_rows]  # views of g's tables
        self.state_arrays = [a.S, s.X, s.R, d.I, d.R, o.I, o.R]
        self.ring_arrays = [d.T, d.V, o.T, o.V]
        arrays = self.state_arrays + [row.copy() for row in self._drawn_src] + self.ring_arrays
        rec, self.HR, self._rec_off = _pack(arrays, align_from=len(arrays) - len(self.ring_arrays))
        n_hot = len(self.state_arrays) + len(self.drawn_rows)
        self.hot_items = self._rec_off[n_hot] if n_hot < len(arrays) else rec.size
        self.REC = np.repeat(rec[None, :], int(n), axis=0)
        dv = []
        for j, (grp, r) in enumerate(self.drawn_rows):
            slot, table = tables[grp]
            width = table.shape[1]
            dv.append((self._sp_off[slot] + r * width, self._rec_off[R_DRAWN + j], width))
        self.DV = np.array(dv, dtype=np.int64).reshape(-1, 3)
        # the fixed part of the parameter tables, to check every episode against
        self._fixed = [(arr, arr.copy()) for arr in self.shared_arrays[1:5] + self.shared_arrays[6:]]
        self._drawn_mask = {id(tables[grp][1]): [] for grp in tables}
        for grp, r in self.drawn_rows:
            self._drawn_mask[id(tables[grp][1])].append(r)

    # ---- episodes ----
    def load(self, i: int) -> None:
        """Instance i's record from the template pipeline as it stands (after
        ScenarioModel.begin_episode and the initial publish): its state, streams, rings and the
        rows drawn this episode. ValueError if a row that is not drawn differs from the shared
        one (a layout this class cannot express)."""
        for arr, ref in self._fixed:
            rows = self._drawn_mask.get(id(arr), [])
            diff = arr != ref
            if arr.dtype == np.float64:
                diff &= ~(np.isnan(arr) & np.isnan(ref))
            if rows:
                diff[rows] = False
            if diff.any():
                raise ValueError("gap parameters not drawn by the randomization differ between episodes: "
                                 "the shared layout cannot hold them")
        rec = self.REC[i]
        k = 0
        for arr in self.state_arrays:
            o = self._rec_off[k]
            rec[o: o + arr.size] = _flat(arr)
            k += 1
        for src in self._drawn_src:
            o = self._rec_off[k]
            rec[o: o + src.size] = src
            k += 1
        for arr in self.ring_arrays:
            o = self._rec_off[k]
            rec[o: o + arr.size] = _flat(arr)
            k += 1

    # ---- prefetch plans (hil/gym/prefetch.py) ----
    def plans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(hot ranges, actuation ring, observation ring) of a record row, as
        hil/gym/prefetch.py prefetch_ranges / prefetch_ring read them."""
        d, o = self.template.actuation, self.template.observation
        nd = len(self.state_arrays) + len(self.drawn_rows)
        off = self._rec_off
        ring_a = [off[R_IA], d.L.shape[0], off[nd], d.m, off[nd + 1], d.V.shape[1]]
        ring_o = [off[R_IO], o.L.shape[0], off[nd + 2], o.m, off[nd + 3], o.V.shape[1]]
        return (np.array([(0, self.hot_items)], dtype=np.int64), np.array(ring_a, dtype=np.int64),
                np.array(ring_o, dtype=np.int64))


# ---- kernels ----


@njit(cache=True, nogil=True)
def load_drawn(SP, rec, DV):
    """Instance rec's drawn parameter rows into the shared buffer SP."""
    for q in range(DV.shape[0]):
        dst, src = DV[q, 0], DV[q, 1]
        for j in range(DV[q, 2]):
            SP[dst + j] = rec[src + j]


@njit(cache=True, nogil=True)
def actuate_compact(SP, HS, rec, HR, n_drawn, t, u_cmd, u_app):
    """hil/gaps/pipeline.py _actuate on the shared layout: actuation delay then actuator gap."""
    work = f1(SP, HS, C_WIN)
    lat.delay_apply(t, u_cmd, work, f2(SP, HS, C_LA), i2(rec, HR, R_IA), u1(rec, HR, R_RA),
                    f3(rec, HR, R_DRAWN + n_drawn), f2(rec, HR, R_DRAWN + n_drawn + 1), i1(SP, HS, C_SIGA),
                    f1(SP, HS, C_PROFA))
    act.actuator_apply(t, work, u_app, f2(SP, HS, C_PA), f2(rec, HR, R_SA))


@njit(cache=True, nogil=True)
def sense_compact(SP, HS, rec, HR, n_drawn, t, y_true, y_meas):
    """hil/gaps/pipeline.py _sense on the shared layout: sensor gap then observation delay."""
    work = f1(SP, HS, C_WOUT)
    sen.sensor_apply(t, y_true, work, f2(SP, HS, C_PS), f2(rec, HR, R_XS), u1(rec, HR, R_RS))
    lat.delay_apply(t, work, y_meas, f2(SP, HS, C_LO), i2(rec, HR, R_IO), u1(rec, HR, R_RO),
                    f3(rec, HR, R_DRAWN + n_drawn + 2), f2(rec, HR, R_DRAWN + n_drawn + 3), i1(SP, HS, C_SIGO),
                    f1(SP, HS, C_PROFO))
