"""Scenario configuration: TOML in, frozen validated models out, one error type.

A scenario file has core sections validated here ([scenario], [plant], [loop], [inputs.*],
[recording]) and subsystem sections validated by their own modules ([modbus], [opcua],
[softplc], [gaps], [bus], [safety], [policy], [gym]). Any section model may define

    validate_against(self, spec: PlantSpec, scenario: Scenario) -> list[tuple[str, str]]

returning (key_path, reason) problems that need the plant spec (unknown signal names,
bounds); they are reported together with the schema problems as one `ConfigError`.

Models are frozen pydantic models: hashable, picklable into worker processes.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hil.errors import ConfigError
from hil.scenario.numbers import MAX_SCENARIO_BYTES, NUMBER_CONFIG, check_numbers, too_many_steps
from hil.scenario.sections import SUBSYSTEM_SECTIONS  # noqa: F401  (re-exported)
from hil.scenario.signal_tables import (  # noqa: F401  (re-exported)
    SIGNAL_TABLES,
    _deep_merge,
    expand_input_groups,
    expand_name_list,
    expand_value_tables,
    flatten_names,
    flatten_signal_tables,
    register_signal_table,
    resolve_plant_files,
)
from hil.scenario.paths import (  # noqa: F401  (re-exported: section modules import them from here)
    PATH_KEYS,
    resolve_against,
    resolve_path,
    resolve_path_field,
    resolve_scenario_paths,
)


class StrictModel(BaseModel):
    """Base of every config model: unknown keys rejected, frozen, no type coercion from str, and
    every number the user set sane (finite, bounded magnitude, durations in range: hil.scenario.numbers)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, **NUMBER_CONFIG)

    @model_validator(mode="wrap")
    @classmethod
    def _sane_numbers(cls, data, handler):
        return check_numbers(cls, data, handler)


# ---- core sections ----


class ScenarioMeta(StrictModel):
    name: str = Field(description="identifier; names the OPC UA folder and recordings")
    description: str = ""

    @field_validator("name")
    @classmethod
    def _identifier(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", v):
            raise ValueError(f"{v!r} is not a name (letters, digits, _ and -)")
        return v


class PlantSection(StrictModel):
    """[plant]: the plant module and, for a plant built from a model file, its options: every
    key besides the five below is passed to the plant's `build(options)` (`case = "case118.m"`,
    `urdf = ...`); its FILE_OPTIONS are paths, relative to the scenario file."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=False)

    model: str = Field(description="module name in plants/ ('bioreactor'), or a dotted module path")
    substeps: int | None = Field(
        default=None, ge=1, le=10_000,
        description="sub-steps per step; default derived from the plant's MAX_SUBSTEP")
    parameters: dict[str, float] = Field(default_factory=dict, description="overrides, plant units")
    initial_state: dict[str, float] = Field(
        default_factory=dict, description="plant units; states, or discrete states (integers)")

    residual_model: str | None = Field(
        default=None, description="residual dynamics model (.npz from `hil sysid --residual-states`), "
        "applied after every plant step (hil/calibration/residual.py)")

    @property
    def options(self) -> dict:
        """The plant's own options (the extra keys of [plant])."""
        return dict(self.model_extra or {})

    def load(self):
        """The plant's PlantModel (plants.base.load_plant: built once per process and options)."""
        from plants.base import load_plant

        return load_plant(self.model, self.options)


class LoopSection(StrictModel):
    step_s: float = Field(gt=0, description="simulated seconds per loop step (plant dt)")
    time_scale: float = Field(
        default=1.0, ge=1e-6, le=1e6, description="simulated seconds per wall second in real time"
    )
    duration_s: float = Field(gt=0, description="simulated seconds to run")
    seed: int = Field(default=0, ge=0, description="seed of every random stream")
    priority: Annotated[int, Field(ge=0, le=99)] | Literal["auto"] = Field(
        default="auto",
        description="SCHED_FIFO priority 1..99, 0 = normal scheduling, 'auto' = SCHED_FIFO 80 where "
        "permitted, else normal with one warning (hil.loop.rt.apply_loop_scheduling)",
    )
    cpu: Annotated[int, Field(ge=-1)] | Literal["auto"] = Field(
        default="auto",
        description="CPU to pin the loop to (helpers kept off it), -1 = none, 'auto' = the last CPU "
        "when SCHED_FIFO was obtained and there are two or more",
    )
    spin_us: float = Field(
        default=200.0, ge=0, le=100_000, description="busy-wait before each deadline (us)"
    )
    status_interval_s: float = Field(default=0.5, gt=0, description="status line period (wall s)")
    overrun: Literal["skip"] = Field(
        default="skip", description="late step: run it now, then skip missed deadlines"
    )
    on_state_out_of_bounds: Literal["warn", "fail"] = Field(
        default="warn", description="a state outside its spec bounds: alarm, or stop the run (exit 3)"
    )
    require_servers: bool = Field(
        default=True, description="a Modbus/OPC UA server process that dies stops the run (exit 4)"
    )
    require_recorder: bool = Field(
        default=True, description="a recorder process that dies stops the run (exit 4)"
    )

    @field_validator("priority", "cpu", mode="before")
    @classmethod
    def _int_or_auto(cls, v, info):
        if v == "auto":
            return v
        lo, hi = (0, 99) if info.field_name == "priority" else (-1, 4095)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"expected \"auto\" or an integer {lo}..{hi}")
        return v

    @field_validator("duration_s")
    @classmethod
    def _at_least_one_step(cls, v: float, info) -> float:
        step_s = info.data.get("step_s")
        if step_s is not None and v < step_s * (1 - 1e-9):
            raise ValueError(f"{v:g} s is shorter than one step (step_s = {step_s:g} s): the run would do nothing")
        if step_s is not None and (why := too_many_steps(v, step_s)):
            raise ValueError(why)
        return v

    @property
    def period_s(self) -> float:
        """Wall-clock period of the loop in real time (s)."""
        return self.step_s / self.time_scale


class InputSection(StrictModel):
    driver: Literal["plc", "fixed", "profile", "bus"] = Field(
        default="plc",
        description="who drives it: plc (Modbus/OPC UA into the image), fixed, profile, bus",
    )
    value: float | None = Field(default=None, description="initial/fixed command, plant units")
    profile: list[tuple[float, float]] | None = Field(
        default=None, description="[[t_s, value], ...] piecewise constant from t_s on"
    )


class RecordingSection(StrictModel):
    enabled: bool = True
    path: str = Field(
        default="runs/{scenario}-{timestamp}", description="directory; {scenario}, {timestamp}"
    )
    flush_interval_s: float = Field(default=1.0, gt=0, le=60, description="wall s between flushes")
    decimate: int = Field(default=1, ge=1, description="record every n-th step")


# ---- the scenario ----


def _optional_section(module: str, name: str):
    """Import a subsystem's section model lazily (keeps hil/scenario/config.py free of cycles)."""
    import importlib

    return getattr(importlib.import_module(module), name)


class Scenario(StrictModel):
    scenario: ScenarioMeta
    plant: PlantSection
    loop: LoopSection
    inputs: dict[str, InputSection] = Field(default_factory=dict)
    recording: RecordingSection = Field(default_factory=RecordingSection)
    # Subsystem sections (validated by their own modules, see below).
    # validated by their own models in parse_scenario (hil.scenario.numbers rules included)
    NUMBERS_CHECKED_ELSEWHERE: ClassVar[tuple[str, ...]] = ("modbus", "opcua", "iec104", "softplc", "gaps", "bus",
                                                            "safety", "policy", "gym")
    modbus: Any = None
    opcua: Any = None
    iec104: Any = None
    softplc: Any = None
    gaps: Any = None
    bus: Any = None
    safety: Any = None
    policy: Any = None
    gym: Any = None

    @property
    def name(self) -> str:
        return self.scenario.name

    def served(self, kind: str):
        """The [modbus], [opcua] or [iec104] section if a server is to be started for it: configured
        and not switched off (`enabled = false` binds nothing); else None."""
        section = getattr(self, kind)
        return section if section is not None and getattr(section, "enabled", True) else None

    def switched_off(self) -> list[str]:
        """The protocol sections present but switched off (`enabled = false`), e.g. ["opcua"]."""
        return [k for k in SERVER_KINDS if getattr(self, k) is not None and self.served(k) is None]


SERVER_KINDS = ("modbus", "opcua", "iec104")  # sections that start a protocol server process

# Subsystem section -> (module, model class): hil/scenario/sections.py. Each owns its schema and checks.
assert set(SUBSYSTEM_SECTIONS) == set(Scenario.NUMBERS_CHECKED_ELSEWHERE)
SCENARIO_SECTIONS: tuple[str, ...] = tuple(Scenario.model_fields)  # the top-level tables of a scenario file


def _format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _reason(err: dict) -> str:
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "missing":
        return "required key is missing"
    if "input" in err and err["type"] not in ("model_type", "dict_type"):
        return f"{err['input']!r}: {msg[0].lower() + msg[1:]}"
    return msg


def _problems(exc: ValidationError, prefix: tuple = ()) -> list[tuple[str, str]]:
    return [(_format_loc(prefix + tuple(e["loc"])), _reason(e)) for e in exc.errors()]


def outside_bounds(value: float, q) -> str | None:
    """Why `value` (in the unit of quantity `q`) is not a physical value of it, or None."""
    if not math.isfinite(value) or not q.low <= value <= q.high:
        return f"{value} {q.unit} is outside [{q.low}, {q.high}] {q.unit}"
    return None


def _check_core_against_spec(sc: Scenario, spec) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for kinds, key, table in (
        (("params",), "plant.parameters", sc.plant.parameters),
        (("states", "discrete"), "plant.initial_state", sc.plant.initial_state),
    ):
        for name, value in table.items():
            path = f"{key}.{name}"
            kind = next((k for k in kinds if spec.has(k, name)), None)
            if kind is None or spec.group(kind, name) is not None:
                what = " or ".join(k[:-1] if k.endswith("s") else k for k in kinds)
                problems.append((path, f"{spec.name} has no {what} {name!r} (known: "
                                       f"{'; '.join(spec.describe_names(k) for k in kinds if spec.names(k))})"))
                continue
            q = spec.quantity(kind, name)
            if not math.isfinite(value):
                problems.append((path, f"{value} is not finite"))
            elif not (q.low <= value <= q.high):
                problems.append((path, f"{value} {q.unit} is outside the physical bounds [{q.low}, {q.high}] {q.unit}"))
            elif kind == "discrete" and value != int(value):
                problems.append((path, f"{value} is not an integer (a discrete state)"))
    for name, inp in sc.inputs.items():
        path = f"inputs.{name}"
        if not spec.has("inputs", name) or spec.group("inputs", name) is not None:
            problems.append((path, f"{spec.name} has no input {name!r} (known: {spec.describe_names('inputs')})"))
            continue
        q = spec.quantity("inputs", name)
        values = [] if inp.value is None else [("value", inp.value)]
        if inp.driver == "fixed" and inp.value is None:
            problems.append((path + ".value", "a fixed input needs a value"))
        if inp.driver == "profile":
            if not inp.profile:
                problems.append((path + ".profile", "a profile input needs [[t_s, value], ...]"))
            else:
                times = [t for t, _ in inp.profile]
                if any(b <= a for a, b in zip(times, times[1:])):
                    problems.append((path + ".profile", "times must be strictly increasing"))
                values += [(f"profile[{i}]", v) for i, (_, v) in enumerate(inp.profile)]
        elif inp.profile is not None:
            problems.append((path + ".profile", f"only used with driver = 'profile', not {inp.driver!r}"))
        for key, v in values:
            if reason := outside_bounds(v, q):
                problems.append((f"{path}.{key}", reason))
    return problems


def _check_substeps(sc: Scenario, module) -> list[tuple[str, str]]:
    """Explicit plant.substeps must keep each sub-step within the plant's MAX_SUBSTEP."""
    from plants.base import SubstepTooLong, as_model, substeps_for

    module = as_model(module)
    dt = sc.loop.step_s / module.time_unit_s
    try:
        substeps_for(module, dt, sc.plant.substeps)
    except SubstepTooLong as exc:
        return [("plant.substeps", f"{exc} (loop.step_s = {sc.loop.step_s:g} s)")]
    return []


def parse_scenario(data: dict, source: str | None = None, *, base_dir: str | Path | None = None) -> Scenario:
    """Validate a scenario given as a dict (as read from TOML). Raises ConfigError.

    base_dir: the scenario file's directory; relative paths (PATH_KEYS) resolve against it.
    None: paths are kept as given."""
    from plants.base import PlantOptionError

    if not isinstance(data, dict):
        raise ConfigError("", "a scenario is a table of sections", source=source)
    data = resolve_scenario_paths(data, base_dir)
    data = resolve_plant_files(data, base_dir, source)
    data = flatten_signal_tables(data)
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("", problems=_problems(exc), source=source) from None
    problems: list[tuple[str, str]] = []
    sections: dict[str, Any] = {}
    for key, (module, cls_name) in SUBSYSTEM_SECTIONS.items():
        raw = data.get(key)
        if raw is None:
            continue
        model = _optional_section(module, cls_name)
        try:
            sections[key] = model.model_validate(raw, context={"base_dir": base_dir})
        except ValidationError as exc:
            problems += _problems(exc, (key,))
    if problems:
        raise ConfigError("", problems=problems, source=source)
    sc = resolve_scenario_paths(sc.model_copy(update=sections), base_dir)  # defaults too
    try:
        module = sc.plant.load()
    except PlantOptionError as exc:
        raise ConfigError(f"plant.{exc.option}" if exc.option else "plant", exc.reason, source=source) from None
    except ValueError as exc:
        raise ConfigError("plant.model", str(exc), source=source) from None
    spec = module.spec
    sc = sc.model_copy(update={"inputs": expand_input_groups(sc.inputs, spec)})
    sc = expand_value_tables(sc, spec)
    if sc.policy is not None and hasattr(sc.policy, "features"):  # group names -> elements, in order
        sc = sc.model_copy(update={"policy": sc.policy.model_copy(update={
            "features": expand_name_list(sc.policy.features, spec, "outputs"),
            "inputs": expand_name_list(sc.policy.inputs, spec, "inputs")})})
    problems = _check_core_against_spec(sc, spec) + _check_substeps(sc, module)
    for key in SUBSYSTEM_SECTIONS:
        section = getattr(sc, key)
        if section is not None and hasattr(section, "validate_against"):
            problems += section.validate_against(spec, sc)
    if problems:
        raise ConfigError("", problems=problems, source=source)
    return sc


def read_config_text(path: str | Path, what: str = "scenario") -> str:
    """The text of a config file: a regular file (not a FIFO, device or directory) of at most
    MAX_SCENARIO_BYTES, UTF-8. Anything else is a ConfigError with the reason, never a hang or
    a MemoryError. Opened non-blocking so that a FIFO cannot block the open."""
    import os
    import stat

    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError("", f"cannot read {what}: {exc.strerror}", source=str(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("", f"cannot read {what}: not a regular file", source=str(path))
        if st.st_size > MAX_SCENARIO_BYTES:
            raise ConfigError("", f"{what} file is {st.st_size} bytes, more than the "
                                  f"{MAX_SCENARIO_BYTES} bytes allowed", source=str(path))
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_SCENARIO_BYTES + 1)
    except OSError as exc:
        raise ConfigError("", f"cannot read {what}: {exc.strerror}", source=str(path)) from None
    finally:
        os.close(fd)
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ConfigError("", f"{what} file is more than the {MAX_SCENARIO_BYTES} bytes allowed",
                          source=str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError("", f"{what} is not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line} "
                              f"(offset {exc.start})", source=str(path)) from None


def load_scenario(path: str | Path, overrides: dict | None = None) -> Scenario:
    """Read and validate a scenario TOML file; `overrides` (nested dict, e.g. from --set) are merged in
    first. Relative paths: the file's against its directory, the overrides' against the cwd."""
    path = Path(path)
    text = read_config_text(path, "scenario")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"not valid TOML: {exc}", source=str(path)) from None
    # command-line values: relative to the cwd; then the file's: relative to the file
    overrides = resolve_scenario_paths(overrides or {}, Path.cwd())
    model = (overrides.get("plant") or {}).get("model") or (data.get("plant") or {}).get("model")
    overrides = resolve_plant_files(overrides, Path.cwd(), str(path), model=model)
    _deep_merge(data, overrides)
    return parse_scenario(data, source=str(path), base_dir=path.resolve().parent)
