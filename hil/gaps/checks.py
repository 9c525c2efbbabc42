"""Checks of a GapsSection that need the plant spec and the loop step: (key_path, reason) pairs.

Key paths start with "gaps.", e.g. ("gaps.sensors.glucose.adc_range", "lower bound 5 > upper 1").
Schema-level problems (negative std, bits outside 1..32, unknown keys) are reported by pydantic
with the same key paths before these run.
"""

from __future__ import annotations

import math
import typing

import annotated_types as at

from hil.gaps.config import (
    MAX_RING_SLOTS, ActuatorGap, GapsSection, LatencyChannel, SensorGap,
)
from hil.gaps.latency import ring_slots
from hil.gaps.profile import ProfileError, load_profile, select_series
from hil.gaps.randomization import dist_problems, feasible, read_table

Problems = list[tuple[str, str]]


def _unknown(spec, kind: str, name: str) -> str:
    return f"{spec.name} has no {kind[:-1]} {name!r} (known: {spec.describe_names(kind)})"


def _range(path: str, pair, problems: Problems) -> None:
    if pair is not None:
        lo, hi = pair
        if not (math.isfinite(lo) and math.isfinite(hi)):
            problems.append((path, "bounds must be finite"))
        elif lo >= hi:
            problems.append((path, f"lower bound {lo} >= upper bound {hi}"))


def _quant(path: str, bits, rng, step, q, names: tuple[str, str, str], problems) -> None:
    b, r, s = names
    if bits is not None and step is not None:
        problems.append((f"{path}.{s}", f"use either {b} or {s}, not both"))
    if rng is not None and bits is None:
        problems.append((f"{path}.{r}", f"only used with {b}"))
    _range(f"{path}.{r}", rng, problems)
    if bits is not None and rng is None and not (math.isfinite(q.low) and math.isfinite(q.high)):
        problems.append((f"{path}.{r}", f"needed: the bounds of {q.name} are not finite"))


def _sensor(path: str, g: SensorGap, q, problems: Problems) -> None:
    if g.drift_per_s != 0.0 and g.drift_per_day != 0.0:
        problems.append((f"{path}.drift_per_day", "use either drift_per_s or drift_per_day"))
    for key in ("gain", "bias", "drift_per_s", "drift_per_day"):
        if not math.isfinite(getattr(g, key)):
            problems.append((f"{path}.{key}", "must be finite"))
    _quant(path, g.adc_bits, g.adc_range, g.quant_step, q, ("adc_bits", "adc_range", "quant_step"),
           problems)
    if g.dropout_rate_per_s > 0 and g.dropout_duration_s <= 0:
        problems.append((f"{path}.dropout_duration_s", "must be > 0 when dropout_rate_per_s > 0"))
    if g.dropout_mode == "stuck" and not math.isfinite(g.dropout_value):
        problems.append((f"{path}.dropout_value", "a stuck sensor needs a finite dropout_value"))


def _actuator(path: str, g: ActuatorGap, q, problems: Problems) -> None:
    for key in ("gain", "offset"):
        if not math.isfinite(getattr(g, key)):
            problems.append((f"{path}.{key}", "must be finite"))
    _quant(path, g.dac_bits, g.dac_range, g.quant_step, q, ("dac_bits", "dac_range", "quant_step"),
           problems)
    if g.saturation is not None:
        lo, hi = g.saturation
        if lo > hi:
            problems.append((f"{path}.saturation", f"lower bound {lo} > upper bound {hi}"))
        elif lo > q.high or hi < q.low:
            problems.append((f"{path}.saturation", f"[{lo}, {hi}] lies outside the bounds of "
                             f"{q.name} [{q.low}, {q.high}] {q.unit}"))
    if g.breakaway_rest is not None and not (q.low <= g.breakaway_rest <= q.high):
        problems.append((f"{path}.breakaway_rest", f"{g.breakaway_rest} is outside "
                         f"[{q.low}, {q.high}] {q.unit}"))


def channel_upper(ch: LatencyChannel, path: str, problems: Problems) -> float:
    """Largest delay the distribution itself can produce (inf if unbounded), + jitter."""
    need = {"uniform": ("low_s", "high_s"), "normal": ("mean_s", "std_s"),
            "lognormal": ("median_s", "sigma"), "empirical": ("samples_s",),
            "profile": ("file",)}.get(ch.dist, ())
    missing = [k for k in need if getattr(ch, k) is None]
    for k in missing:
        problems.append((f"{path}.{k}", f"required for dist = {ch.dist!r}"))
    if missing:
        return 0.0
    if ch.dist == "constant":
        return ch.value_s + ch.jitter_s
    if ch.dist == "uniform":
        if ch.low_s > ch.high_s:
            problems.append((f"{path}.low_s", f"lower bound {ch.low_s} > upper bound {ch.high_s}"))
        return ch.high_s + ch.jitter_s
    if ch.dist == "empirical":
        xs = ch.samples_s
        if not xs or not all(math.isfinite(x) and x >= 0 for x in xs):
            problems.append((f"{path}.samples_s", "must be a non-empty list of finite delays >= 0"))
            return 0.0
        return max(xs) + ch.jitter_s
    if ch.dist == "profile":
        try:
            series = load_profile(ch.file)
        except ProfileError as exc:
            problems.append((f"{path}.file", str(exc)))
            return 0.0
        try:
            return select_series(series, ch.series).high + ch.jitter_s
        except ProfileError as exc:
            problems.append((f"{path}.series", f"{ch.file}: {exc}"))
            return 0.0
    return math.inf


def _latency(direction: str, chans: dict, spec, kind: str, max_delay: float,
             problems: Problems) -> None:
    seen: dict[str, str] = {}
    for name, ch in chans.items():
        path = f"gaps.latency.{direction}.{name}"
        sigs = ch.signals if ch.signals is not None else [name]
        if not sigs:
            problems.append((f"{path}.signals", "must name at least one signal"))
        for s in sigs:
            if s not in spec.names(kind):
                key = f"{path}.signals" if ch.signals is not None else path
                problems.append((key, _unknown(spec, kind, s)))
            elif s in seen:
                problems.append((f"{path}.signals", f"{s!r} is already delayed by channel "
                                 f"{seen[s]!r}"))
            else:
                seen[s] = name
        upper = channel_upper(ch, path, problems)
        if ch.max_s is not None and ch.max_s > max_delay:
            problems.append((f"{path}.max_s", f"{ch.max_s} s is longer than the delay buffer "
                             f"(gaps.max_delay_s = {max_delay} s)"))
        elif ch.max_s is None and math.isfinite(upper) and upper > max_delay * (1 + 1e-12):
            key = {"constant": "value_s", "uniform": "high_s", "empirical": "samples_s",
                   "profile": "file"}[ch.dist]
            problems.append((f"{path}.{key}", f"delays up to {upper:g} s (with jitter) are longer "
                             f"than the delay buffer (gaps.max_delay_s = {max_delay} s)"))
        if ch.max_s is not None and ch.min_s > ch.max_s:
            problems.append((f"{path}.min_s", f"lower bound {ch.min_s} > upper bound {ch.max_s}"))


def field_limits(model: type, field: str) -> tuple[float, float] | None:
    """(lo, hi) limits of a numeric field of a gap model, or None if it is not numeric."""
    info = model.model_fields.get(field)
    if info is None:
        return None
    ann = info.annotation
    args = set(typing.get_args(ann)) - {type(None)} or {ann}
    if not args <= {float, int} or bool in args:
        return None
    lo, hi = -math.inf, math.inf
    for m in info.metadata:
        if isinstance(m, at.Ge):
            lo = m.ge
        elif isinstance(m, at.Gt):
            lo = math.nextafter(m.gt, math.inf)
        elif isinstance(m, at.Le):
            hi = m.le
    return lo, hi


def _randomize(sec: GapsSection, spec, problems: Problems) -> None:
    rz = sec.randomize
    for name, d in rz.plant.items():
        path = f"gaps.randomize.plant.{name}"
        if name not in spec.names("params"):
            problems.append((path, _unknown(spec, "params", name)))
            continue
        sub = dist_problems(d)
        problems += [(f"{path}.{k}", r) for k, r in sub]
        if not sub:
            q = spec.quantity("params", name)
            why = feasible(d, q.low, q.high, q.nominal)
            if why:
                problems.append((path, f"{why} (bounds of {name}: [{q.low}, {q.high}] {q.unit})"))
    if rz.table is not None:
        path = "gaps.randomize.table"
        try:
            table = read_table(rz.table.file, rz.table.columns)
        except ValueError as exc:
            problems.append((f"{path}.file", str(exc)))
            table = {}
        for col, values in table.items():
            if col not in spec.names("params"):
                problems.append((f"{path}.file", f"column {col!r}: " + _unknown(spec, "params", col)))
                continue
            q = spec.quantity("params", col)
            if values.min() < q.low or values.max() > q.high:
                problems.append((f"{path}.file", f"column {col!r} has values outside "
                                 f"[{q.low}, {q.high}] {q.unit}"))
            if col in rz.plant:
                problems.append((f"gaps.randomize.plant.{col}", "also drawn from the table"))
    groups = [("sensors", SensorGap, rz.sensors, "outputs"),
              ("actuators", ActuatorGap, rz.actuators, "inputs")]
    for direction, chans in rz.latency.items():
        known = getattr(sec.latency, direction)
        for ch, fields in chans.items():
            path = f"gaps.randomize.latency.{direction}.{ch}"
            if ch not in known:
                problems.append((path, f"no channel {ch!r} in gaps.latency.{direction}"))
            else:
                groups.append((f"latency.{direction}", LatencyChannel, {ch: fields}, None))
    for prefix, model, table, kind in groups:
        for sig, fields in table.items():
            path = f"gaps.randomize.{prefix}.{sig}"
            if kind is not None and sig not in spec.names(kind):
                problems.append((path, _unknown(spec, kind, sig)))
                continue
            for field, d in fields.items():
                lim = field_limits(model, field)
                if lim is None:
                    problems.append((f"{path}.{field}", f"not a numeric field of {model.__name__}"))
                    continue
                sub = dist_problems(d)
                problems += [(f"{path}.{field}.{k}", r) for k, r in sub]
                if not sub and d.relative:
                    problems.append((f"{path}.{field}.relative", "only for plant parameters"))
                elif not sub and (why := feasible(d, *lim)):
                    problems.append((f"{path}.{field}", why))


def check_gaps(sec: GapsSection, spec, step_s: float | None) -> Problems:
    from hil.gaps.groups import expand_groups, report_at_origin

    sec, origin = expand_groups(sec, spec)  # array groups -> their elements
    problems = _check_gaps(sec, spec, step_s)
    return report_at_origin(problems, origin)


def _check_gaps(sec: GapsSection, spec, step_s: float | None) -> Problems:
    problems: Problems = []
    for name, g in sec.sensors.items():
        path = f"gaps.sensors.{name}"
        if name not in spec.names("outputs"):
            problems.append((path, _unknown(spec, "outputs", name)))
        else:
            _sensor(path, g, spec.quantity("outputs", name), problems)
    for name, g in sec.actuators.items():
        path = f"gaps.actuators.{name}"
        if name not in spec.names("inputs"):
            problems.append((path, _unknown(spec, "inputs", name)))
        else:
            _actuator(path, g, spec.quantity("inputs", name), problems)
    _latency("observation", sec.latency.observation, spec, "outputs", sec.max_delay_s, problems)
    _latency("actuation", sec.latency.actuation, spec, "inputs", sec.max_delay_s, problems)
    has_latency = bool(sec.latency.observation or sec.latency.actuation)
    if has_latency and step_s is not None and ring_slots(sec.max_delay_s, step_s) > MAX_RING_SLOTS:
        problems.append(("gaps.max_delay_s", f"{sec.max_delay_s} s at loop.step_s = {step_s} s "
                         f"needs {ring_slots(sec.max_delay_s, step_s)} ring slots (buffer limit "
                         f"{MAX_RING_SLOTS}); lower it"))
    _randomize(sec, spec, problems)
    if sec.randomize.plant_spread is not None and spec.randomize is None:
        problems.append(("gaps.randomize.plant_spread", f"{spec.name} has no randomization hook "
                         "(spec.randomize): randomize its parameters by name in [gaps.randomize.plant]"))
    return problems
