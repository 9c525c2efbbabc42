"""Gap kernels specialised to one scenario: generated source for hil/gaps/compact.py's layout.

`actuate_compact` / `sense_compact` run the generic gap kernels (hil/gaps/latency.py
delay_apply + draw_delay, actuator.py actuator_apply, sensor.py sensor_apply) over parameter
tables read at run time: a loop per signal and channel, every feature's test, five non-inlined
calls with array arguments (each an NRT reference-count call), carray views rebuilt per call.
Measured alone in L1 (bioreactor_gym): a delay line of 3 channels ~250-300 ns, of which ~30 ns
per channel is the call of draw_delay for a *constant* delay.

Here the same arithmetic is written out per signal and per channel for one CompactGaps:

    - every parameter the scenario fixes is a literal (repr round-trips a float64 exactly);
      a feature whose parameter is off is compiled out (its test folded while generating,
      in Python, on the same IEEE doubles);
    - the rows the randomization draws are read from the instance's record (their slot in
      REC[i]), so `load_drawn` is not needed; their tests stay run-time tests;
    - states, counters, streams and rings are read at constant offsets of the record row
      (float64, with int64 / uint64 views of the same row);
    - the delivered values between the delay line and the actuator / sensor gap are locals.

The operations and their order are those of the generic kernels (the text below is theirs
with the parameters substituted), so the results are bit for bit the same
(tests/hil/gaps/test_specialize.py, tests/hil/gym/test_fused.py). Numba keys its disk cache
on the generated file; the file's name carries a digest of its text, and the text carries
every literal, so a scenario that changes one parameter gets another file and never a kernel
compiled for another value.

    text = gap_source(compact_gaps)       # a module defining actuate_spec and sense_spec
    actuate_spec(rec, t, u_cmd, u_app)    # == actuate_compact(SP, HS, rec, HR, ...) after load_drawn
    sense_spec(rec, t, y_true, y_meas)    # == sense_compact(...)
"""

from __future__ import annotations

import hashlib
import math
import sys

import numpy as np

from hil.gaps import actuator as act
from hil.gaps import latency as lat
from hil.gaps import sensor as sen
from hil.gaps.compact import R_DRAWN, R_IA, R_IO, R_RA, R_RO, R_RS, R_SA, R_XS
from hil.loop.specialize import cache_dir, load_generated, sources_digest


def lit(v: float) -> str:
    """A float64 as source text that parses back to the same bits."""
    v = float(v)
    if math.isnan(v):
        return "_NAN"
    if math.isinf(v):
        return "_INF" if v > 0 else "(-_INF)"
    r = repr(v)
    return f"({r})" if r.startswith("-") else r


class _Table:
    """Parameter (row, col) of one table as source: a literal, or the record slot of a drawn row."""

    def __init__(self, table: np.ndarray, drawn: dict[int, int]):
        self.table, self.drawn = table, drawn  # drawn: row -> record offset of that row

    def __call__(self, row: int, col: int) -> str:
        if row in self.drawn:
            return f"rf[{self.drawn[row] + col}]"
        return lit(self.table[row, col])


def _fold(cond: str):
    """True / False when `cond` has only literals (evaluated on the same doubles), else None."""
    try:
        return bool(eval(cond, {"__builtins__": {}}, {"_INF": math.inf, "_NAN": math.nan}))  # noqa: S307
    except NameError:
        return None


class _Src:
    def __init__(self):
        self.lines: list[str] = []
        self.ind = 1

    def __call__(self, line: str) -> None:
        self.lines.append("    " * self.ind + line)

    def when(self, cond: str, body, orelse=None) -> None:
        """if cond: body() else: orelse(), folded when cond is constant."""
        f = _fold(cond)
        if f is True:
            body()
        elif f is False:
            if orelse is not None:
                orelse()
        else:
            self(f"if {cond}:")
            self.ind += 1
            n = len(self.lines)
            body()
            if len(self.lines) == n:
                self("pass")
            self.ind -= 1
            if orelse is not None:
                self("else:")
                self.ind += 1
                n = len(self.lines)
                orelse()
                if len(self.lines) == n:
                    self("pass")
                self.ind -= 1


def _quantize(src: _Src, v: str, mode: str, lo: str, step: str, nmax: str) -> None:
    """hil/gaps/sensor.py quantize on variable v, in place."""
    f = _fold(f"{mode} == 1.0")
    if f is None or _fold(f"{mode} == 2.0") is None:
        src(f"{v} = quantize({v}, {mode}, {lo}, {step}, {nmax})")
        return

    def adc():
        src(f"_c = math.floor(({v} - {lo}) / {step} + 0.5)")
        src("if _c < 0.0:")
        src("    _c = 0.0")
        src(f"elif _c > {nmax}:")
        src(f"    _c = {nmax}")
        src(f"{v} = {lo} + _c * {step}")

    src.when(f"{mode} == 1.0", adc,
             lambda: src.when(f"{mode} == 2.0", lambda: src(f"{v} = {step} * math.floor({v} / {step} + 0.5)")))


def _draw_delay(src: _Src, L: _Table, c: int, I_off: int, R_off: int, prof_name: str) -> None:
    """hil/gaps/latency.py draw_delay of channel c into variable _d."""
    kind = L(c, lat.L_DIST)
    ii = f"ri[{I_off + lat.N_ISTATE * c + lat.I_SEQ}]"

    def const():
        src(f"_d = {L(c, lat.L_P1)}")

    def unif():
        src(f"_d = {L(c, lat.L_P1)} + ({L(c, lat.L_P2)} - {L(c, lat.L_P1)}) * uniform(ru, _z + {R_off + c})")

    def norm():
        src(f"_d = {L(c, lat.L_P1)} + {L(c, lat.L_P2)} * normal(ru, _z + {R_off + c})")

    def lognorm():
        src(f"_d = math.exp({L(c, lat.L_P1)} + {L(c, lat.L_P2)} * normal(ru, _z + {R_off + c}))")

    def profiled():
        src(f"_off = int({L(c, lat.L_OFF)})")
        src(f"_n = int({L(c, lat.L_N)})")

        def samples():
            src(f"_d = {prof_name}[_off + min(int(uniform(ru, _z + {R_off + c}) * _n), _n - 1)]")

        def sequence():
            src(f"_j = {ii}")
            src(f"_d = {prof_name}[_off + _j]")
            src(f"{ii} = _j + 1 if _j + 1 < _n else 0")

        def hist():
            src(f"_u = uniform(ru, _z + {R_off + c})")
            src("_lo, _hi = 0, _n - 1")
            src("while _lo < _hi:")
            src("    _mid = (_lo + _hi) // 2")
            src(f"    if {prof_name}[_off + _mid] >= _u:")
            src("        _hi = _mid")
            src("    else:")
            src("        _lo = _mid + 1")
            src(f"_e0 = {prof_name}[_off + _n + _lo]")
            src(f"_d = _e0 + ({prof_name}[_off + _n + _lo + 1] - _e0) * uniform(ru, _z + {R_off + c})")

        src.when(f"{kind} == {lat.D_SAMPLES}", samples,
                 lambda: src.when(f"{kind} == {lat.D_SEQUENCE}", sequence, hist))

    src.when(f"{kind} == {lat.D_CONST}", const,
             lambda: src.when(f"{kind} == {lat.D_UNIFORM}", unif,
                              lambda: src.when(f"{kind} == {lat.D_NORMAL}", norm,
                                               lambda: src.when(f"{kind} == {lat.D_LOGNORMAL}", lognorm,
                                                                profiled))))
    src.when(f"{L(c, lat.L_JIT)} > 0.0",
             lambda: src(f"_d += {L(c, lat.L_JIT)} * (2.0 * uniform(ru, _z + {R_off + c}) - 1.0)"))
    src(f"_d = min(max(_d, {L(c, lat.L_MIN)}), {L(c, lat.L_MAX)})")


def _delay(src: _Src, line, L: _Table, I_off: int, R_off: int, T_off: int, V_off: int, x_in: list[str],
           x_out: list[str], prof_name: str) -> None:
    """hil/gaps/latency.py delay_apply: push x_in (expressions) at t, delivered values into x_out."""
    n_ch = line.L.shape[0]
    if n_ch == 0:
        for s in range(len(x_in)):
            src(f"{x_out[s]} = {x_in[s]}")
        return
    m = line.T.shape[1]
    n_sig = line.V.shape[1]
    mask = m - 1
    src(f"_k = ri[{I_off + lat.I_NPUSH}]")
    src(f"_slot = _k & {mask}")
    for s in range(len(x_in)):
        src(f"rf[{V_off} + _slot * {n_sig} + {s}] = {x_in[s]}")
    for c in range(n_ch):
        t0 = T_off + c * m * 2  # T[c] (m, 2)
        _draw_delay(src, L, c, I_off, R_off, prof_name)
        src("_a = t + _d")
        fifo = f"{L(c, lat.L_FIFO)} == 1.0"

        def back(t0=t0):
            src("if _k > 0:")
            src(f"    _prev = rf[{t0} + ((_k - 1) & {mask}) * 2 + 1]")
            src("    if _a < _prev:")
            src("        _a = _prev")

        src.when(fifo, back)
        src(f"rf[{t0} + _slot * 2] = t")
        src(f"rf[{t0} + _slot * 2 + 1] = _a")
        src(f"ri[{I_off + lat.N_ISTATE * c + lat.I_NPUSH}] = _k + 1")
        src(f"_tl = t + {L(c, lat.L_EPS)}")
        src(f"_dv = ri[{I_off + lat.N_ISTATE * c + lat.I_DELIV}]")

        def deliver_fifo(t0=t0):
            src(f"while _dv < _k and rf[{t0} + ((_dv + 1) & {mask}) * 2 + 1] <= _tl:")
            src("    _dv += 1")

        def deliver_latest(t0=t0, c=c):
            src(f"_cut = _tl - {L(c, lat.L_DMIN)}")
            src("_j = _dv + 1")
            src(f"while _j <= _k and rf[{t0} + (_j & {mask}) * 2] <= _cut:")
            src(f"    if rf[{t0} + (_j & {mask}) * 2 + 1] <= _tl:")
            src("        _dv = _j")
            src("    _j += 1")

        src.when(fifo, deliver_fifo, deliver_latest)
        src(f"ri[{I_off + lat.N_ISTATE * c + lat.I_DELIV}] = _dv")
    for s in range(len(x_in)):
        c = int(line.sigch[s])
        if c < 0:
            src(f"{x_out[s]} = {x_in[s]}")
        else:
            src(f"_dv = ri[{I_off + lat.N_ISTATE * c + lat.I_DELIV}]")
            src(f"{x_out[s]} = rf[{V_off} + (_dv & {mask}) * {n_sig} + {s}] if _dv >= 0 else rf[{V_off} + {s}]")


def _actuator(src: _Src, P: _Table, S_off: int, n: int, w: list[str]) -> None:
    """hil/gaps/actuator.py actuator_apply: work values w -> u_app."""
    A = act
    for i in range(n):
        s = S_off + i * A.N_STATE

        def S(col, s=s):
            return f"rf[{s + col}]"

        def p(col, i=i):
            return P(i, col)

        def on(i=i, S=S, p=p):
            src(f"c = {p(A.A_GAIN)} * {w[i]} + {p(A.A_OFFSET)}")
            _quantize(src, "c", p(A.A_Q_MODE), p(A.A_Q_LO), p(A.A_Q_STEP), p(A.A_Q_NMAX))
            src(f"first = {S(A.S_STARTED)} == 0.0")
            src("if first:")
            src(f"    dt = {p(A.A_FIRST_DT)}")
            src(f"    {S(A.S_DB)} = c")
            src("else:")
            src(f"    dt = t - {S(A.S_LAST_T)}")
            src(f"    if abs(c - {S(A.S_DB)}) > {p(A.A_DEADBAND)}:")
            src(f"        {S(A.S_DB)} = c")
            src(f"{S(A.S_LAST_T)} = t")
            src(f"c = {S(A.S_DB)}")
            src.when(f"{p(A.A_BREAK)} > 0.0 or {p(A.A_BREAK)} != {p(A.A_BREAK)}",  # |x| < 0 never holds
                     lambda: (src(f"if abs(c - {p(A.A_REST)}) < {p(A.A_BREAK)}:"), src(f"    c = {p(A.A_REST)}")))
            src(f"c = min(max(c, {p(A.A_SAT_LO)}), {p(A.A_SAT_HI)})")

            def rate():
                src("if first:")
                src(f"    {S(A.S_RATE_Y)} = c")
                src("else:")
                src(f"    lim = {p(A.A_RATE)} * dt")
                src(f"    {S(A.S_RATE_Y)} += min(max({S(A.S_RATE_IN)} - {S(A.S_RATE_Y)}, -lim), lim)")
                src(f"{S(A.S_RATE_IN)} = c")
                src(f"c = {S(A.S_RATE_Y)}")

            src.when(f"{p(A.A_RATE)} > 0.0", rate)

            def lag():
                src("if first:")
                src(f"    {S(A.S_LAG_Y)} = c")
                src("else:")
                src(f"    if dt != {S(A.S_DT)}:")
                src(f"        {S(A.S_DT)} = dt")
                src(f"        {S(A.S_ALPHA)} = -math.expm1(-dt / {p(A.A_TAU)})")
                src(f"    {S(A.S_LAG_Y)} += {S(A.S_ALPHA)} * ({S(A.S_LAG_IN)} - {S(A.S_LAG_Y)})")
                src(f"{S(A.S_LAG_IN)} = c")
                src(f"c = {S(A.S_LAG_Y)}")

            src.when(f"{p(A.A_TAU)} > 0.0", lag)

            def backlash():
                src(f"h = 0.5 * {p(A.A_BACKLASH)}")
                src("if first:")
                src(f"    {S(A.S_BL)} = c")
                src("else:")
                src(f"    {S(A.S_BL)} = min(max({S(A.S_BL)}, c - h), c + h)")
                src(f"c = {S(A.S_BL)}")

            src.when(f"{p(A.A_BACKLASH)} > 0.0", backlash)
            src(f"{S(A.S_STARTED)} = 1.0")
            src(f"u_app[{i}] = min(max(c, {p(A.A_LOW)}), {p(A.A_HIGH)})")

        src(f"# input {i}")
        src.when(f"{p(A.A_ON)} == 0.0", lambda i=i: src(f"u_app[{i}] = {w[i]}"), on)


def _sensor(src: _Src, P: _Table, X_off: int, R_off: int, n: int, out: list[str]) -> None:
    """hil/gaps/sensor.py sensor_apply: y_true -> the variables out."""
    Q = sen
    for i in range(n):
        x = X_off + i * Q.N_STATE
        r0 = R_off + i * Q.N_STREAMS

        def X(col, x=x):
            return f"rf[{x + col}]"

        def p(col, i=i):
            return P(i, col)

        def sample(i=i, X=X, p=p, r0=r0):
            src(f"{X(Q.X_LAST_T)} = t")
            src(f"if dt != {X(Q.X_DT)}:")
            src(f"    a = math.exp(-dt / {p(Q.P_CTAU)})")
            src(f"    {X(Q.X_DT)} = dt")
            src(f"    {X(Q.X_A)} = a")
            src(f"    {X(Q.X_B)} = math.sqrt(1.0 - a * a)")
            src(f"    {X(Q.X_SQDT)} = math.sqrt(dt)")
            src(f"    {X(Q.X_PSPIKE)} = -math.expm1(-{p(Q.P_SPIKE_RATE)} * dt)")
            src(f"    {X(Q.X_PDROP)} = -math.expm1(-{p(Q.P_DROP_RATE)} * dt)")
            src.when(f"{p(Q.P_RW)} > 0.0", lambda: (
                src("if not first:"),
                src(f"    {X(Q.X_RW)} += {p(Q.P_RW)} * {X(Q.X_SQDT)} * normal(ru, _z + {r0 + Q.R_WALK})")))

            def colored():
                src(f"e = normal(ru, _z + {r0 + Q.R_COLORED})")
                src("if first:")
                src(f"    {X(Q.X_AR)} = {p(Q.P_CSTD)} * e")
                src("else:")
                src(f"    {X(Q.X_AR)} = {X(Q.X_A)} * {X(Q.X_AR)} + {p(Q.P_CSTD)} * {X(Q.X_B)} * e")

            src.when(f"{p(Q.P_CSTD)} > 0.0", colored)
            src(f"v = {p(Q.P_GAIN)} * y_true[{i}] + {p(Q.P_BIAS)} + {p(Q.P_DRIFT)} * t + {X(Q.X_RW)} + {X(Q.X_AR)}")
            src.when(f"{p(Q.P_WHITE)} > 0.0", lambda: src(f"v += {p(Q.P_WHITE)} * normal(ru, _z + {r0 + Q.R_WHITE})"))

            def spike():
                src(f"if uniform(ru, _z + {r0 + Q.R_SPIKE}) <= {X(Q.X_PSPIKE)}:")
                src(f"    if uniform(ru, _z + {r0 + Q.R_SPIKE}) <= 0.5:")
                src(f"        v -= {p(Q.P_SPIKE_SIZE)}")
                src("    else:")
                src(f"        v += {p(Q.P_SPIKE_SIZE)}")

            src.when(f"{p(Q.P_SPIKE_RATE)} > 0.0", spike)
            _quantize(src, "v", p(Q.P_Q_MODE), p(Q.P_Q_LO), p(Q.P_Q_STEP), p(Q.P_Q_NMAX))

            def dropout():
                src(f"out = t < {X(Q.X_DROP_END)}")
                src(f"if not out and uniform(ru, _z + {r0 + Q.R_DROP}) <= {X(Q.X_PDROP)}:")
                src(f"    {X(Q.X_DROP_END)} = t + {p(Q.P_DROP_DUR)}")
                src("    out = True")
                src("if out:")
                src.ind += 1
                src.when(f"{p(Q.P_DROP_HOLD)} == 0.0", lambda: src(f"v = {p(Q.P_DROP_VALUE)}"),
                         lambda: (src("if not first:"), src(f"    v = {X(Q.X_HELD)}")))
                src.ind -= 1

            src.when(f"{p(Q.P_DROP_RATE)} > 0.0", dropout)
            src(f"{X(Q.X_HELD)} = v")
            src(f"{out[i]} = v")

        def on(i=i, X=X, p=p, sample=sample):
            ts = p(Q.P_TS)
            src(f"first = {X(Q.X_STARTED)} == 0.0")
            src("take = True")
            src("dt = 0.0")
            src("if first:")
            src(f"    {X(Q.X_STARTED)} = 1.0")
            src(f"    {X(Q.X_T0)} = t")
            src(f"    {X(Q.X_NSAMP)} = 0.0")
            src(f"    dt = {p(Q.P_FIRST_DT)}")
            src("else:")
            src.ind += 1
            src.when(f"{ts} > 0.0", lambda: (
                src(f"if t < {X(Q.X_T0)} + {X(Q.X_NSAMP)} * {ts} - 1e-9 * {ts}:"),
                src(f"    {out[i]} = {X(Q.X_HELD)}"),
                src("    take = False")))
            src("if take:")
            src(f"    dt = t - {X(Q.X_LAST_T)}")
            src.ind -= 1
            src("if take:")
            src.ind += 1
            src.when(f"{ts} > 0.0",
                     lambda: src(f"{X(Q.X_NSAMP)} = math.floor((t - {X(Q.X_T0)}) / {ts} + 1e-9) + 1.0"))
            sample()
            src.ind -= 1

        src(f"# output {i}")
        src.when(f"{p(Q.P_ON)} == 0.0", lambda i=i: src(f"{out[i]} = y_true[{i}]"), on)


_HEAD = '''"""Generated by hil.gaps.specialize: the gap kernels of one scenario on hil/gaps/compact.py's
record layout. Do not edit: rewritten when the scenario or hil's template changes."""
# sources: {sources}
import math

import numpy as np
from numba import carray, njit

from hil.gaps.arena import ptr_i64, ptr_u64
from hil.gaps.rng import normal, uniform
from hil.gaps.sensor import quantize

_INF = math.inf
_NAN = math.nan
PROF_A = np.array({prof_a!r}, dtype=np.float64)
PROF_O = np.array({prof_o!r}, dtype=np.float64)
'''


def gap_source(cg, sources: str = "") -> str:
    """Module text defining actuate_spec(rec, t, u_cmd, u_app) and sense_spec(rec, t, y_true,
    y_meas) for a hil.gaps.compact.CompactGaps (its template's fixed parameters, its layout)."""
    g = cg.template
    a, s, d, o = g.actuators, g.sensors, g.actuation, g.observation
    off = cg._rec_off
    n_state = len(cg.state_arrays)
    drawn = {"sensors": {}, "actuators": {}, "observation": {}, "actuation": {}}
    for j, (grp, r) in enumerate(cg.drawn_rows):
        drawn[grp][r] = off[R_DRAWN + j]
    nd = len(cg.drawn_rows)
    ring = {name: off[n_state + nd + k] for k, name in enumerate(("aT", "aV", "oT", "oV"))}
    n_u, n_y = a.P.shape[0], s.P.shape[0]
    rows = int(cg.REC.shape[1])
    views = [f"ri = carray(ptr_i64(rec, 0), ({rows},))", f"ru = carray(ptr_u64(rec, 0), ({rows},))", "rf = rec",
             "_z = rec.size - rec.size  # 0, typed int64: a literal index would compile the RNG once per stream"]

    act_src = _Src()
    for v in views:
        act_src(v)
    w = [f"w{i}" for i in range(n_u)]
    _delay(act_src, d, _Table(d.L, drawn["actuation"]), off[R_IA], off[R_RA], ring["aT"], ring["aV"],
           [f"u_cmd[{i}]" for i in range(n_u)], w, "PROF_A")
    _actuator(act_src, _Table(a.P, drawn["actuators"]), off[R_SA], n_u, w)

    sen_src = _Src()
    for v in views:
        sen_src(v)
    m = [f"m{i}" for i in range(n_y)]
    _sensor(sen_src, _Table(s.P, drawn["sensors"]), off[R_XS], off[R_RS], n_y, m)
    _delay(sen_src, o, _Table(o.L, drawn["observation"]), off[R_IO], off[R_RO], ring["oT"], ring["oV"], m,
           [f"y_meas[{i}]" for i in range(n_y)], "PROF_O")

    text = _HEAD.format(sources=sources, prof_a=[float(x) for x in d.prof], prof_o=[float(x) for x in o.prof])
    text += "\n\n@njit(cache=True, nogil=True)\ndef actuate_spec(rec, t, u_cmd, u_app):\n"
    text += "\n".join(act_src.lines) + "\n"
    text += "\n\n@njit(cache=True, nogil=True)\ndef sense_spec(rec, t, y_true, y_meas):\n"
    text += "\n".join(sen_src.lines) + "\n"
    return text


def specialised_gaps(cg):
    """The module of gap kernels generated for a CompactGaps (`actuate_spec`, `sense_spec`),
    written to `<cache>/hil/gap_steps/` and named after its text's digest: a scenario with
    another parameter value (or another hil) gets another file, so Numba's disk cache never
    hands out a kernel compiled for other values. OSError when the file cannot be written."""
    text = gap_source(cg, sources_digest())
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    name = f"hil_gap_step_{digest}"
    module = sys.modules.get(name)
    if module is None:
        module = load_generated(cache_dir().parent / "gap_steps" / f"gaps_{digest}.py", name, text)
    return module
