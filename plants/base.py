"""The plant interface: a plant module's contract and the `Plant` instance around it.

A plant is a module in `plants/` (or a package, `plants/grid/__init__.py`). Loading it gives
a `PlantModel` (`load_plant(name, options)`): the spec, the kernels and the plant's own
physics limits. There are two ways to write one.

1. A small explicit ODE with a fixed spec ("ode" form; plants/bioreactor.py):

    SPEC: PlantSpec                      # states, inputs, outputs, params (units, bounds)
    DEFAULT_SUBSTEPS: int                # RK4 sub-steps per step at the nominal step
    MAX_SUBSTEP: float                   # longest stable sub-step, plant time unit
                                         # (math.inf for an exact step)
    TIME_UNIT_S: float                   # optional: seconds per plant time unit (default 1)
    derivatives(t, x, u, p, dxdt)        # @njit(cache=True, nogil=True), writes dxdt
    outputs(x, u, p, y)                  # @njit(cache=True, nogil=True), writes y
    step(t, x, u, p, dt, n_sub, work)    # @njit: advance x in place by dt, return t + dt;
                                         # work is a (5, n_states) float64 RK4 buffer
    run_batch(t, X, U, P, dt, n_sub, n)  # @njit(parallel): N instances, n steps each

2. A model built at load time ("step" form; a grid from a MATPOWER case, an arm from a
   URDF, tests/plants/array_plant.py as the worked example):

    OPTIONS: dict[str, str]              # option name -> one line of help; the scenario's
                                         # [plant] keys besides model/substeps/parameters/
                                         # initial_state (`case = "case118.m"`)
    FILE_OPTIONS: tuple[str, ...]        # options that are file paths: resolved against the
                                         # scenario file's directory (hil/scenario/paths.py rule)
    build(options: dict) -> PlantModel   # read the model file, build the spec (per-element
                                         # signals, array groups), return the kernels and data;
                                         # raise ValueError("<option>: reason") on bad input

   with kernels of this signature (all arrays preallocated, nothing allocated per call):

    step(t, x, z, d, u, p, dt, n_sub, *aux) -> t + dt
        advance in place by dt (plant time unit), inputs held: continuous state x
        (float64), algebraic unknowns z (float64: warm start in, solution out), discrete
        state d (int64: events inside the step change it). The integrator is the plant's
        own (semi-implicit, quasi-static solve, exact): there is no RK4 workspace.
    outputs(x, z, d, u, p, y, *aux) -> None
        write the true outputs y.
    aux = PlantModel.data + (a private copy of) PlantModel.work, passed positionally:
        data: read-only model arrays (admittance structure, link tables), shared;
        work: scratch buffers, copied per Plant instance (two instances never share one).

   Rule for state: whatever a step carries to the next (warm starts, breaker positions,
   protection timers, contact modes) lives in x, z or d, never in aux, so `snapshot` /
   `restore` round-trip it bit for bit and rollback and shadow forks stay exact. A cache in
   work (a factorization for the current topology) is allowed only if the step checks it
   against what it was built from (e.g. a copy of d and p kept in work) on every call.

Both forms give the same `PlantModel` fields: spec, max_substep (the loop derives
ceil(step / max_substep) sub-steps from it), default_substeps, time_unit_s, and the
spec's optional randomization hook `spec.randomize(p, rng, spread)` (plants/spec.py).

State lives outside the plant (Drake style): `Plant` only holds arrays, so a snapshot is a
copy of (t, x, z, d, p) and rollback, replay and shadow forks are `set_state` of a
snapshot. Plants import nothing from `hil` or `adapters`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import re
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Mapping

import numpy as np

from plants.spec import PlantSpec

REQUIRED = ("SPEC", "DEFAULT_SUBSTEPS", "MAX_SUBSTEP", "derivatives", "outputs", "step", "run_batch")
FORMS = ("ode", "step")


@dataclass(frozen=True)
class OutputWatch:
    """A condition on one true output that the loop checks after every step: ``y[output] > above``.

    kind: the alarm's kind (stable identifier, e.g. "blackout"); action: "warn" (an alarm, active
    while the condition holds, and a run warning the first time) or "fail" (the run stops with
    ``exit_code``); message: text for humans, ``{value}`` is replaced by the output's value.
    A plant declares its watches from its options (e.g. the grid's ``on_blackout``)."""

    kind: str
    output: str
    above: float
    action: str = "warn"
    exit_code: int = 1
    message: str = ""

    def __post_init__(self) -> None:
        if self.action not in ("warn", "fail"):
            raise ValueError(f"watch {self.kind}: action {self.action!r} is not 'warn' or 'fail'")


@dataclass(frozen=True)
class PlantModel:
    """A loaded plant: spec, kernels and physics limits (see the module docstring).

    form: "ode" (explicit ODE, RK4 `step(t, x, u, p, dt, n_sub, work)`) or "step" (the
          plant's own `step(t, x, z, d, u, p, dt, n_sub, *aux)`).
    max_substep: longest stable sub-step, plant time unit (math.inf for an exact step).
    default_substeps: sub-steps at the nominal step (at least this many are used).
    time_unit_s: seconds per plant time unit.
    data: read-only arrays passed after the standard arguments ("step" form), shared.
    work: scratch arrays passed after `data`, copied per Plant instance.
    run_batch: optional batch kernel ("ode": run_batch(t, X, U, P, dt, n_sub, n_steps)).
    name: the module name (`plants.<name>`); options: the options it was built with.
    """

    spec: PlantSpec
    form: str
    step: Callable
    outputs: Callable
    max_substep: float
    default_substeps: int = 1
    time_unit_s: float = 1.0
    derivatives: Callable | None = None
    data: tuple = ()
    work: tuple = ()
    run_batch: Callable | None = None
    name: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    watches: tuple = ()  # OutputWatch conditions the loop checks every step
    panels: tuple = ()  # plants.panels.Panel: the dashboard's default panels for this plant

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"plant {self.name or self.spec.name}: form {self.form!r} is not one of {FORMS}")
        if not float(self.max_substep) > 0:
            raise ValueError(f"plant {self.name or self.spec.name}: max_substep = {self.max_substep} "
                             "is not a positive duration")
        if int(self.default_substeps) < 1:
            raise ValueError(f"plant {self.name or self.spec.name}: default_substeps must be >= 1")
        if not float(self.time_unit_s) > 0:
            raise ValueError(f"plant {self.name or self.spec.name}: time_unit_s must be > 0")
        if self.form == "ode" and (self.spec.n_algebraic or self.spec.n_discrete):
            raise ValueError(f"plant {self.name or self.spec.name}: an 'ode' plant has no algebraic or "
                             "discrete state; use the 'step' form")
        for a in tuple(self.data) + tuple(self.work):
            if not isinstance(a, np.ndarray):
                raise ValueError(f"plant {self.name or self.spec.name}: data and work must be numpy arrays")

    @classmethod
    def from_module(cls, module: ModuleType, name: str = "") -> "PlantModel":
        """The "ode" form of a module with the static attributes (REQUIRED)."""
        return cls(spec=module.SPEC, form="ode", step=module.step, outputs=module.outputs,
                   max_substep=float(module.MAX_SUBSTEP), default_substeps=int(module.DEFAULT_SUBSTEPS),
                   time_unit_s=float(getattr(module, "TIME_UNIT_S", 1.0)), derivatives=module.derivatives,
                   run_batch=getattr(module, "run_batch", None), name=name or _plant_name(module),
                   panels=tuple(getattr(module, "PANELS", ())))

    # legacy attribute names, so a PlantModel reads like the module it came from
    @property
    def SPEC(self) -> PlantSpec:  # noqa: N802
        return self.spec

    @property
    def MAX_SUBSTEP(self) -> float:  # noqa: N802
        return self.max_substep

    @property
    def DEFAULT_SUBSTEPS(self) -> int:  # noqa: N802
        return self.default_substeps

    @property
    def TIME_UNIT_S(self) -> float:  # noqa: N802
        return self.time_unit_s


def plant_module_path(name: str) -> str:
    """`plants.<name>` for a plant name, or `name` itself for a dotted module path
    (`tests.plants.array_plant`, a plant kept outside plants/)."""
    if name.isidentifier():
        return f"plants.{name}"
    if all(part.isidentifier() for part in name.split(".")):
        return name
    raise ValueError(f"plant name {name!r} is not an identifier (or a dotted module path)")


def _plant_name(module: ModuleType) -> str:
    return module.__name__.removeprefix("plants.")


def _import_plant(name: str) -> ModuleType:
    path = plant_module_path(name)
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name is not None and path.startswith(exc.name):
            where = f"plants/{name}.py" if path.startswith("plants.") else f"module {path}"
            raise ValueError(f"unknown plant {name!r} (no {where})") from None
        raise


def is_built(module: ModuleType) -> bool:
    """True for a plant whose model is built at load time (`build(options)`)."""
    return callable(getattr(module, "build", None))


def load_plant_module(name: str) -> ModuleType:
    """Import `plants.<name>` and check it fulfils one of the two plant contracts."""
    module = _import_plant(name)
    if is_built(module):
        if not isinstance(getattr(module, "OPTIONS", None), dict):
            raise ValueError(f"plants/{name}: a plant with build() must define OPTIONS (option -> help)")
        return module
    missing = [attr for attr in REQUIRED if not hasattr(module, attr)]
    if missing:
        raise ValueError(f"plants/{name}.py is not a plant: missing {', '.join(missing)}"
                         + (" (its longest stable sub-step in plant time units, math.inf for an exact step)"
                            if "MAX_SUBSTEP" in missing else "") + ", or build(options)")
    if not float(module.MAX_SUBSTEP) > 0:
        raise ValueError(f"plants/{name}.py: MAX_SUBSTEP = {module.MAX_SUBSTEP} is not a positive duration")
    return module


class PlantOptionError(ValueError):
    """A plant option the plant refused: `option` names it (None: not one option's fault)."""

    def __init__(self, option: str | None, reason: str):
        self.option, self.reason = option, reason
        super().__init__(f"{option}: {reason}" if option else reason)


_CACHE: dict[tuple[str, str], PlantModel] = {}
_CACHE_LOCK = threading.Lock()


def load_plant(name: str, options: Mapping[str, Any] | None = None) -> PlantModel:
    """The PlantModel of `plants.<name>` built with `options` (the scenario's [plant] extra
    keys, file paths already resolved). Built once per process and options (a 118-bus case is
    parsed once, however many consumers ask). Raises ValueError (unknown plant) or
    PlantOptionError (an option the plant refuses: unknown key, unreadable model file)."""
    options = dict(options or {})
    key = (name, json.dumps(options, sort_keys=True, default=str))
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    module = load_plant_module(name)
    if is_built(module):
        unknown = sorted(set(options) - set(module.OPTIONS))
        if unknown:
            known = ", ".join(f"{k} ({v})" for k, v in module.OPTIONS.items()) or "none"
            raise PlantOptionError(unknown[0], f"plant {name!r} has no option {unknown[0]!r} (options: {known})")
        try:
            model = module.build(options)
        except PlantOptionError:
            raise
        except (ValueError, OSError) as exc:
            opt, _, reason = str(exc).partition(": ")
            # an option's own key path counts as the option: "agc.kp", "ufls.stages[1].below"
            if re.split(r"[.\[]", opt)[0] in module.OPTIONS and reason:
                raise PlantOptionError(opt, reason) from None
            raise PlantOptionError(None, f"plant {name!r} could not be built: {exc}") from None
        except Exception as exc:  # a model file the reader did not expect: named, never a traceback
            raise PlantOptionError(None, f"plant {name!r} could not be built: {type(exc).__name__}: {exc}") from exc
        if not isinstance(model, PlantModel):
            raise ValueError(f"plants/{name}: build() returned {type(model).__name__}, not a PlantModel")
        model = dataclasses.replace(model, name=model.name or name, options=options)
    else:
        if options:
            k = sorted(options)[0]
            raise PlantOptionError(k, f"plant {name!r} takes no options (it has a fixed spec)")
        model = PlantModel.from_module(module, name)
    with _CACHE_LOCK:
        _CACHE.setdefault(key, model)
    return model


def as_model(plant: "PlantModel | ModuleType") -> PlantModel:
    """A PlantModel from a model or an "ode" module (the form older callers pass)."""
    if isinstance(plant, PlantModel):
        return plant
    if is_built(plant):
        return load_plant(_plant_name(plant))
    return PlantModel.from_module(plant)


class SubstepTooLong(ValueError):
    """Explicit sub-steps that make each sub-step longer than the plant's MAX_SUBSTEP."""

    def __init__(self, plant: str, dt: float, substeps: int, max_substep: float, unit_s: float):
        self.plant, self.dt, self.substeps, self.max_substep = plant, dt, substeps, max_substep
        self.needed = substeps_needed(dt, max_substep)
        super().__init__(
            f"{substeps} sub-step(s) of a {dt * unit_s:g} s step are {dt * unit_s / substeps:g} s each, longer "
            f"than {plant}'s maximum stable sub-step of {max_substep * unit_s:g} s: use at least "
            f"{self.needed} sub-steps, or leave the count out to have it derived")


def substeps_needed(dt: float, max_substep: float) -> int:
    """Fewest sub-steps that keep each one <= max_substep (same time unit as dt)."""
    return max(1, math.ceil(dt / max_substep * (1.0 - 1e-12)))


def substeps_for(plant: "PlantModel | ModuleType", dt: float, substeps: int | None = None) -> int:
    """Sub-steps per step of `dt` (plant time unit) for a plant (model or "ode" module).

    Explicit `substeps` are checked against the plant's max_substep (SubstepTooLong if a
    sub-step would be longer); None derives max(default_substeps, ceil(dt / max_substep)).
    """
    model = as_model(plant)
    max_sub = float(model.max_substep)
    if substeps is not None:
        if dt / substeps > max_sub * (1.0 + 1e-12):
            raise SubstepTooLong(model.spec.name, dt, substeps, max_sub, model.time_unit_s)
        return int(substeps)
    return max(int(model.default_substeps), substeps_needed(dt, max_sub))


@dataclass(frozen=True)
class PlantSnapshot:
    """The whole plant state at one instant: time (plant time unit), continuous states x,
    parameters p, algebraic unknowns z (warm start of the next solve) and discrete state d
    (int64). Copies: a snapshot never changes with the plant."""

    t: float
    x: np.ndarray
    p: np.ndarray
    z: np.ndarray = field(default_factory=lambda: np.zeros(0))
    d: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def equals(self, other: "PlantSnapshot") -> bool:
        """Bit-for-bit equality (NaN payloads included)."""
        return (np.float64(self.t).tobytes() == np.float64(other.t).tobytes()
                and all(a.tobytes() == b.tobytes() and a.dtype == b.dtype
                        for a, b in ((self.x, other.x), (self.p, other.p), (self.z, other.z), (self.d, other.d))))


class Plant:
    """One plant instance: the model's kernels plus its state, input and parameter arrays.

    `x`, `z`, `u`, `p`, `y` are float64 arrays and `d` an int64 array in the spec's order;
    the loop writes `u`, calls `step(dt)` and reads `y`. Nothing here allocates per step.
    """

    def __init__(self, model: "PlantModel | ModuleType", substeps: int | None = None, dt: float | None = None):
        """dt: the step the loop will take (plant time unit); given, the sub-step count is
        derived from (or checked against) the plant's max_substep (see `substeps_for`)."""
        self.model = model = as_model(model)
        self.module = model  # older name: the object holding the kernels
        self.spec: PlantSpec = model.spec
        if dt is not None:
            self.substeps = substeps_for(model, dt, substeps)
        else:
            self.substeps = int(substeps or model.default_substeps)
        self.t = 0.0
        self.x = self.spec.nominal("states")
        self.z = self.spec.nominal("algebraic")
        self.d = self.spec.nominal("discrete")
        self.u = self.spec.nominal("inputs")
        self.p = self.spec.nominal("params")
        self.y = np.zeros(self.spec.n_outputs)
        self._step = model.step
        self._outputs = model.outputs
        if model.form == "ode":
            self._work = np.zeros((5, self.spec.n_states))
            self.aux: tuple = ()
        else:
            self._work = None
            self.aux = tuple(model.data) + tuple(w.copy() for w in model.work)

    @classmethod
    def from_name(cls, name: str, substeps: int | None = None, dt: float | None = None,
                  options: Mapping[str, Any] | None = None) -> "Plant":
        return cls(load_plant(name, options), substeps, dt)

    def step(self, dt: float) -> None:
        """Advance the state by dt (plant time unit) with the current inputs held."""
        if self._work is not None:
            self.t = self._step(self.t, self.x, self.u, self.p, dt, self.substeps, self._work)
        else:
            self.t = self._step(self.t, self.x, self.z, self.d, self.u, self.p, dt, self.substeps, *self.aux)

    def compute_outputs(self, python: bool = False) -> np.ndarray:
        """Recompute and return `y` (true, noise-free outputs) from the current state.
        python=True runs the kernel's pure-Python form (no compilation: config checks)."""
        fn = getattr(self._outputs, "py_func", self._outputs) if python else self._outputs
        if self._work is not None:
            fn(self.x, self.u, self.p, self.y)
        else:
            fn(self.x, self.z, self.d, self.u, self.p, self.y, *self.aux)
        return self.y

    def first_non_finite_state(self) -> str | None:
        """Name of the first state (or algebraic unknown) that is NaN or infinite, or None."""
        bad = np.flatnonzero(~np.isfinite(self.x))
        if bad.size:
            return self.spec.states[bad[0]].name
        bad = np.flatnonzero(~np.isfinite(self.z))
        return self.spec.algebraic[bad[0]].name if bad.size else None

    def snapshot(self) -> PlantSnapshot:
        return PlantSnapshot(self.t, self.x.copy(), self.p.copy(), self.z.copy(), self.d.copy())

    def restore(self, snap: PlantSnapshot) -> None:
        """Set the whole state from a snapshot (arrays copied in place: views stay valid)."""
        self.t = snap.t
        self.x[:] = snap.x
        self.p[:] = snap.p
        if snap.z.size or self.z.size:
            self.z[:] = snap.z
        if snap.d.size or self.d.size:
            self.d[:] = snap.d

    # Aliases matching FMI's vocabulary.
    get_state = snapshot
    set_state = restore
