"""Sane numbers for every configuration model: one rule set, applied by the models' base class.

Every config model derives from `hil.scenario.config.StrictModel` (or uses `NUMBER_CONFIG` and
`check_numbers` like the campaign schema), which gives it:

- `allow_inf_nan = False`: a float field (also inside lists, tuples and dicts) given NaN or
  +-Inf is refused by pydantic with the exact key path (`safety.projection.box.x[0]`).
  The one exception is a field declared with `unlimited(default)`: its default is not finite
  (+inf "no limit", -inf "no lower limit", NaN "an invalid reading") and it accepts exactly
  that value when set, so a user may write the default out (`mahalanobis_enter = inf`) and a
  scenario written back from its model (the bootstrap pipe to the safety and policy, a
  campaign's resolved scenario) reads again. Any other non-finite value is refused.
- `check_numbers`, a wrap validator walking every value the user SET (fields and, for models
  that allow extra keys, the extra keys), lists/tuples/dicts included:
  * any number: finite, magnitude at most MAX_ABS, and either 0 or at least MIN_ABS. A value
    outside that range is a typo or an attack in hil's units (SI and the plant's units), and
    keeping every value within it means a product or quotient of two config values stays finite.
  * a duration (a key whose name ends in `_s`, `_ms` or `_us`, the project's unit suffixes;
    `_per_s` is a rate, not a duration): 0 or between MIN_TIME_S and MAX_TIME_S seconds.
  Errors carry the key path of the offending value and the reason.
  A model names in `NUMBERS_CHECKED_ELSEWHERE` the fields it holds raw but validates with a
  model of their own (the scenario's subsystem sections: `[gaps]`, `[safety]`, ...), so the
  rules, and the exceptions of `unlimited` fields, apply there once.

Derived sizes (number of loop steps, ring buffers) are bounded where they are computed, with
MAX_STEPS and MAX_BUFFER_SAMPLES from here.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

MAX_ABS = 1e15  # largest magnitude of any configured number (plant or SI units)
MIN_ABS = 1e-30  # smallest nonzero magnitude of any configured number
MIN_TIME_S = 1e-9  # shortest nonzero duration (1 ns)
MAX_TIME_S = 1e9  # longest duration (about 31.7 years)
MIN_PERIOD_S = 1e-6  # shortest real-time wall period (step_s / time_scale) a run may ask for
MAX_STEPS = 10_000_000_000  # loop steps in one run (116 days at 1 kHz)
MAX_BUFFER_SAMPLES = 10_000_000  # samples in one delay ring or table built from the config
MAX_SCENARIO_BYTES = 16 * 1024 * 1024  # a scenario (or campaign) file

NUMBER_CONFIG = ConfigDict(allow_inf_nan=False)

_TIME_SUFFIXES = {"_s": 1.0, "_ms": 1e-3, "_us": 1e-6}


def unlimited(default: float, **kwargs: Any):
    """A float field whose non-finite `default` (math.inf, -math.inf or math.nan) may also be
    set explicitly; every other value follows the rules above. `kwargs` go to pydantic Field."""
    if math.isfinite(default):
        raise ValueError("unlimited() is for a non-finite default; use Field for a finite one")
    return Field(default, allow_inf_nan=True, **kwargs)


def _is_default_non_finite(field, value: Any) -> bool:
    """`value` is the non-finite default of an `unlimited` field (same sign of inf, or NaN)."""
    d = getattr(field, "default", None)
    if not isinstance(d, float) or math.isfinite(d) or not isinstance(value, (int, float)):
        return False
    v = float(value)
    return (math.isnan(d) and math.isnan(v)) or v == d


def time_unit_s(key: str) -> float | None:
    """Seconds per unit if `key` names a duration by its suffix (`step_s`, `scan_ms`), else None."""
    if key.endswith("_per_s") or key.endswith("_per_ms"):
        return None
    for suffix, scale in _TIME_SUFFIXES.items():
        if key.endswith(suffix):
            return scale
    return None


def too_many_steps(duration_s: float, step_s: float) -> str | None:
    """Why a run of `duration_s` simulated seconds in steps of `step_s` is too long, or None."""
    steps = duration_s / step_s
    if not steps <= MAX_STEPS:
        return (f"{duration_s:g} s in steps of {step_s:g} s is {steps:.3g} steps, more than the "
                f"{MAX_STEPS:.3g} a run may take (shorten it or use a longer step)")
    return None


def number_problem(value: float, key: str | None = None) -> str | None:
    """Why `value` is not a sane configured number for the key named `key` (a reason without
    the value, e.g. "not a finite number"), or None."""
    v = float(value)
    if not math.isfinite(v):
        return "not a finite number"
    if v != 0 and not MIN_ABS <= abs(v) <= MAX_ABS:
        return f"magnitude outside the sane range {MIN_ABS:g} .. {MAX_ABS:g} (or 0)"
    scale = time_unit_s(key) if key else None
    if scale is not None and v != 0:
        seconds = abs(v) * scale
        if not MIN_TIME_S <= seconds <= MAX_TIME_S:
            unit = key.rsplit("_", 1)[1]
            return f"not a sane duration (0, or {MIN_TIME_S / scale:g} .. {MAX_TIME_S / scale:g} {unit})"
    return None


def _walk(value: Any, loc: tuple, key: str, out: list) -> None:
    """Collect (loc, value, reason) for every bad number inside a set value (not sub-models)."""
    if isinstance(value, BaseModel):
        return  # a sub-model validated itself
    if isinstance(value, bool):
        return
    if isinstance(value, float):
        if (reason := number_problem(value, key)) is not None:
            out.append((loc, value, reason))
    elif isinstance(value, int):
        if abs(value) > 2**63:  # an integer field beyond any counter or address
            out.append((loc, value, "beyond the 64-bit integer range"))
        elif (scale := time_unit_s(key)) is not None and value != 0 and \
                (reason := number_problem(float(value), key)) is not None:
            out.append((loc, value, reason))
    elif isinstance(value, dict):
        for k, v in value.items():
            _walk(v, loc + (k,), key, out)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _walk(v, loc + (i,), key, out)


def check_numbers(cls, data: Any, handler) -> Any:
    """Body of the models' wrap validator: check every number the user set, then validate.

    Numbers and flat lists of numbers are checked before the model's own validators run (a
    cross-field check such as "duration_s >= step_s" must not be the one to report a step_s of
    1e300, and a union such as `float | list[float]` must not blur the key path); values
    nested deeper and extra keys after."""
    if isinstance(data, dict):
        fields = cls.model_fields
        bad = []
        for k, v in data.items():
            if k not in fields or _is_default_non_finite(fields[k], v):
                continue
            if _is_number(v) or (isinstance(v, (list, tuple)) and all(_is_number(e) for e in v)):
                _walk(v, (k,), k, bad)  # a union such as float | list[float] would blur the key path
        if bad:
            raise _error(cls, bad)
    model = handler(data)
    if not isinstance(model, BaseModel):
        return model
    bad = []
    fields = type(model).model_fields
    elsewhere = getattr(cls, "NUMBERS_CHECKED_ELSEWHERE", ())
    for name in model.model_fields_set:
        if name in fields and name not in elsewhere and not _is_default_non_finite(fields[name],
                                                                                   getattr(model, name)):
            _walk(getattr(model, name), (name,), name, bad)
    for name, value in (model.model_extra or {}).items():
        _walk(value, (name,), name, bad)
    if bad:
        raise _error(cls, bad)
    return model


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _error(cls, bad: list) -> ValidationError:
    return ValidationError.from_exception_data(cls.__name__, [
        InitErrorDetails(type=PydanticCustomError("insane_number", "{reason}", {"reason": reason}),
                         loc=loc, input=value)
        for loc, value, reason in bad])
