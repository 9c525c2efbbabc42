"""Durations as a user types them: `2h`, `90min`, `30s`, `1d`, `1h30min`, `250ms`, or a plain
number of seconds; and the simulated/wall pair a run is about to cover.

`hil run --duration` is simulated time, `--wall` wall-clock time (converted with
loop.time_scale, real time only); both accept these forms.
"""

from __future__ import annotations

import math
import re

from hil.errors import ConfigError
from hil.scenario.numbers import MAX_TIME_S, MIN_PERIOD_S, too_many_steps

UNITS_S = {
    "ms": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_PART = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Z]*)")


def parse_duration(text: str | float | int, key: str = "--duration") -> float:
    """Seconds (float) from `text`; raises ConfigError naming `key` if it is not a positive duration.

    A plain number is seconds. Parts add up: "1h30min" = 5400 s. Units: ms, s, m/min, h, d
    (and their long forms).
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        s = str(text).strip()
        pos, seconds, parts = 0, 0.0, 0
        while pos < len(s):
            m = _PART.match(s, pos)
            if m is None or m.end() == pos:
                break
            number, unit = m.group(1), m.group(2).lower()
            if unit and unit not in UNITS_S:
                raise ConfigError(key, f"{text!r}: unknown unit {m.group(2)!r} "
                                       "(use ms, s, min, h, d, e.g. 2h, 90min, 30s; a plain number is seconds)")
            if not unit and (parts or m.end() < len(s.rstrip())):
                raise ConfigError(key, f"{text!r}: a number without a unit may only stand alone")
            seconds += float(number) * UNITS_S[unit or "s"]
            parts += 1
            pos = m.end()
        if not parts or s[pos:].strip():
            raise ConfigError(key, f"{text!r} is not a duration (e.g. 2h, 90min, 30s, 1d, or seconds)")
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(key, f"{text!r} is not a positive duration")
    if seconds > MAX_TIME_S:
        raise ConfigError(key, f"{text!r} is {seconds:.3g} s, longer than the {MAX_TIME_S:g} s "
                               f"({format_duration(MAX_TIME_S)}) a run may cover")
    return seconds


def format_duration(seconds: float) -> str:
    """Human form: 36000 -> '10 h', 5400 -> '1.5 h', 90 -> '1.5 min', 0.25 -> '250 ms'."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= size:
            return f"{seconds / size:.4g} {unit}"
    return f"{seconds * 1e3:.4g} ms"


def run_duration(scenario, *, duration: str | None, wall: str | None, lockstep: bool) -> float:
    """Simulated seconds a `hil run` covers, from --duration or --wall (or loop.duration_s).

    Refuses both at once, --wall in lockstep (no wall clock to count), and a duration
    shorter than one loop step (it would run zero steps).
    """
    loop = scenario.loop
    if duration is not None and wall is not None:
        raise ConfigError("--wall", "give --duration (simulated) or --wall (wall clock), not both")
    if wall is not None:
        if lockstep:
            raise ConfigError("--wall", "lockstep runs have no wall clock (as fast as possible): "
                                        "give --duration in simulated time")
        sim_s = parse_duration(wall, "--wall") * loop.time_scale
        key, given = "--wall", wall
    elif duration is not None:
        sim_s = parse_duration(duration, "--duration")
        key, given = "--duration", duration
    else:
        sim_s = float(loop.duration_s)
        key, given = "loop.duration_s", loop.duration_s
    if sim_s < loop.step_s * (1 - 1e-9):
        raise ConfigError(key, f"{given} is {format_duration(sim_s)} simulated, shorter than one loop step "
                               f"(loop.step_s = {loop.step_s:g} s): the run would do nothing")
    if why := too_many_steps(sim_s, loop.step_s):
        raise ConfigError(key, f"{given}: {why}")
    if not lockstep and loop.period_s < MIN_PERIOD_S:
        raise ConfigError("loop.time_scale", f"{loop.time_scale:g}: the real-time period step_s / time_scale "
                                             f"= {loop.period_s:.3g} s is shorter than {MIN_PERIOD_S:g} s "
                                             "(no wall clock keeps it)")
    return sim_s


def describe_run_time(sim_s: float, scenario, lockstep: bool) -> str:
    """'2 h simulated = 24 s wall at 300x' (real time) or '2 h simulated, lockstep (...)'."""
    loop = scenario.loop
    steps = int(round(sim_s / loop.step_s))
    if lockstep:
        return f"{format_duration(sim_s)} simulated ({steps} steps of {loop.step_s:g} s), lockstep: as fast as possible"
    return (f"{format_duration(sim_s)} simulated = {format_duration(sim_s / loop.time_scale)} wall "
            f"at {loop.time_scale:g}x ({steps} steps of {loop.step_s:g} s, period {loop.period_s * 1e3:.4g} ms)")
