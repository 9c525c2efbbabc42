"""Typed description of a plant: named states, inputs, outputs, parameters, algebraic
unknowns and discrete state, with array groups.

Every quantity carries a unit, a nominal value and physical bounds. The bounds seed the
safety envelope (inputs), the clipping of commands (inputs), the validity check of the
state (states) and the ranges of domain randomization (parameters).

Kinds (each one flat array in kernel order, float64 unless stated):

    states      continuous state x, checked against its bounds every step
    inputs      u: commands (PLC, policy, profiles), clipped to the bounds
    outputs     y: true measurements, served after the sensor gaps
    params      p: parameters (randomizable within the bounds)
    algebraic   z: algebraic unknowns a step solves (warm start in, solution out), e.g. bus
                voltages of a power flow; part of the plant state (snapshot/restore)
    discrete    d: int64 discrete state changed by events inside a step (breaker closed 0/1,
                protection timer ticks, contact mode); part of the plant state

Names. A name is an identifier, or identifiers joined by dots (`glucose`, `bus_12.vm`,
`line_5.loading`): elements of a model built from a file are named per element.

Array groups. A `Group` names a contiguous run of one kind's array (`bus.vm` = outputs
[i0, i0 + 118)), so that tag maps, gaps, recorder and plots address it as one block; the
elements keep their own names and every per-element name still resolves. Inside a group,
`bus.vm[3]` is the element at position 3 (0-based) of the group. `SpecBuilder.array`
appends a group and its elements in one call.

Names are resolved to integer indices once, at configure time (`index`, `indices`); the
per-step path only ever sees arrays ordered as the tuples below.

Parameter randomization hook (optional): `PlantSpec.randomize(p, rng, spread)` writes one
physically consistent draw of the parameters into `p` (float64, kernel order) with the
numpy Generator `rng`, around the base values already in `p` with relative spread `spread`
(0.1 = about +-10 %), keeping every value inside its bounds; plants whose parameters are
structured (a line's r, x and rating drawn together, positive-definite inertias) provide it
so that hil never draws an unphysical combination by perturbing elements independently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

KINDS = ("states", "inputs", "outputs", "params", "algebraic", "discrete")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_NAMES = re.compile(rf"{_NAME.pattern}(\n{_NAME.pattern})*")
_ELEMENT = re.compile(r"(?P<group>.+)\[(?P<pos>-?\d+)\]")


def _all_names(names: Sequence[str]) -> bool:
    """Every entry is_name (one regex pass over the joined names; a newline cannot be in a name)."""
    if not all(isinstance(nm, str) for nm in names):
        return False
    return _NAMES.fullmatch("\n".join(names)) is not None


def is_name(name: str) -> bool:
    """An identifier, or identifiers joined by dots (`bus_12.vm`)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class Quantity:
    """One named scalar of a plant.

    name: identifier (dots allowed between identifiers) used in configs and tag maps
          (`glucose`, `feed_rate`, `bus_12.vm`).
    unit: unit string as shown to users (`g/L`, `L/h`, `K`, `pu`).
    nominal: nominal value, in `unit`.
    low, high: physical bounds, in `unit` (low <= nominal <= high).
    description: one line for humans.
    """

    name: str
    unit: str
    nominal: float
    low: float
    high: float
    description: str = ""

    def __post_init__(self) -> None:
        if not is_name(self.name):
            raise ValueError(f"quantity name {self.name!r} is not an identifier (or identifiers joined by dots)")
        if not (self.low <= self.high):
            raise ValueError(f"{self.name}: bounds inverted ({self.low} > {self.high})")
        if not (self.low <= self.nominal <= self.high):
            raise ValueError(
                f"{self.name}: nominal {self.nominal} outside bounds [{self.low}, {self.high}]"
            )


@dataclass(frozen=True)
class Group:
    """A named array of one kind: elements start .. start + size - 1 of that kind's array.

    name: the array's name (`bus.vm`); it must not equal an element name of its kind.
    unit: the elements' common unit (every element has it).
    description: one line for humans (`bus voltage magnitude`).
    """

    kind: str
    name: str
    start: int
    size: int
    unit: str = ""
    description: str = ""

    @property
    def stop(self) -> int:
        return self.start + self.size

    def indices(self) -> np.ndarray:
        return np.arange(self.start, self.stop, dtype=np.intp)


def _names(items: tuple[Quantity, ...]) -> tuple[str, ...]:
    return tuple(q.name for q in items)


@dataclass(frozen=True)
class PlantSpec:
    """States, inputs, outputs, parameters, algebraic unknowns and discrete state of a plant,
    in kernel array order, with optional array groups and a parameter randomization hook."""

    name: str
    states: tuple[Quantity, ...]
    inputs: tuple[Quantity, ...]
    outputs: tuple[Quantity, ...]
    params: tuple[Quantity, ...]
    description: str = ""
    algebraic: tuple[Quantity, ...] = ()
    discrete: tuple[Quantity, ...] = ()
    groups: tuple[Group, ...] = ()
    randomize: Callable | None = field(default=None, compare=False)
    _index: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _names: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _groups: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for kind in KINDS:
            names = _names(getattr(self, kind))
            index = {n: i for i, n in enumerate(names)}
            if len(index) != len(names):
                dup = sorted({n for n in names if names.count(n) > 1})
                raise ValueError(f"{self.name}.{kind}: duplicate names {dup}")
            self._index[kind] = index
            self._names[kind] = names
            self._groups[kind] = {}
        for q in self.discrete:
            if q.nominal != int(q.nominal):
                raise ValueError(f"{self.name}.discrete: {q.name} nominal {q.nominal} is not an integer")
        taken: dict[str, list[tuple[int, int, str]]] = {k: [] for k in KINDS}
        for g in self.groups:
            if g.kind not in KINDS:
                raise ValueError(f"{self.name}: group {g.name!r} has unknown kind {g.kind!r}")
            if not is_name(g.name):
                raise ValueError(f"{self.name}: group name {g.name!r} is not an identifier (dots allowed)")
            n = len(getattr(self, g.kind))
            if g.size < 1 or g.start < 0 or g.stop > n:
                raise ValueError(f"{self.name}: group {g.kind}.{g.name} [{g.start}, {g.stop}) is outside "
                                 f"the {n} {g.kind}")
            if g.name in self._index[g.kind] or g.name in self._groups[g.kind]:
                raise ValueError(f"{self.name}: group name {g.name!r} is already a {g.kind} name")
            for a, b, other in taken[g.kind]:
                if g.start < b and a < g.stop:
                    raise ValueError(f"{self.name}: groups {other!r} and {g.name!r} overlap in {g.kind}")
            if g.unit and any(q.unit != g.unit for q in getattr(self, g.kind)[g.start:g.stop]):
                raise ValueError(f"{self.name}: group {g.name!r} mixes units (all elements must be {g.unit!r})")
            taken[g.kind].append((g.start, g.stop, g.name))
            self._groups[g.kind][g.name] = g
        if self.randomize is not None and not callable(self.randomize):
            raise ValueError(f"{self.name}: randomize must be a function (p, rng, spread) -> None")

    # ---- name resolution (configure time only) ----
    def index(self, kind: str, name: str) -> int:
        """Index of `name` in the `kind` array: an element name (`bus_12.vm`), or a group
        element by position (`bus.vm[11]`, 0-based, negative from the end). KeyError names
        what is known."""
        i = self._index[kind].get(name)
        if i is not None:
            return i
        m = _ELEMENT.fullmatch(name)
        if m and (g := self._groups[kind].get(m["group"])) is not None:
            pos = int(m["pos"])
            if -g.size <= pos < g.size:
                return g.start + pos % g.size
            raise KeyError(f"{self.name}: {name!r}: {g.name} has {g.size} elements (0..{g.size - 1})")
        raise KeyError(f"{self.name} has no {kind[:-1] if kind.endswith('s') else kind} {name!r} "
                       f"(known: {self.describe_names(kind)})")

    def has(self, kind: str, name: str) -> bool:
        """True if `name` is an element, a group or `group[i]` of `kind`."""
        if name in self._index[kind] or name in self._groups[kind]:
            return True
        try:
            self.index(kind, name)
        except KeyError:
            return False
        return True

    def indices(self, kind: str, name: str) -> np.ndarray:
        """Indices `name` stands for: a group's elements, or the one index of an element."""
        g = self._groups[kind].get(name)
        if g is not None:
            return g.indices()
        return np.array([self.index(kind, name)], dtype=np.intp)

    def expand(self, kind: str, name: str) -> tuple[str, ...]:
        """Element names `name` stands for (a group's elements, or the element itself)."""
        names = self._names[kind]
        return tuple(names[i] for i in self.indices(kind, name))

    def group(self, kind: str, name: str) -> Group | None:
        """The group of that name, or None."""
        return self._groups[kind].get(name)

    def groups_of(self, kind: str) -> tuple[Group, ...]:
        return tuple(self._groups[kind].values())

    def group_of(self, kind: str, index: int) -> Group | None:
        """The group holding element `index` of `kind`, or None."""
        for g in self._groups[kind].values():
            if g.start <= index < g.stop:
                return g
        return None

    def describe_names(self, kind: str, limit: int = 40) -> str:
        """Known names of a kind for error messages: groups as `bus.vm[118]`, scalars by
        name, cut after `limit` items."""
        items, i, names = [], 0, self._names[kind]
        starts = {g.start: g for g in self._groups[kind].values()}
        while i < len(names):
            g = starts.get(i)
            if g is not None:
                items.append(f"{g.name}[{g.size}] ({names[g.start]}..{names[g.stop - 1]})")
                i = g.stop
            else:
                items.append(names[i])
                i += 1
        more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
        return ", ".join(items[:limit]) + more

    def names(self, kind: str) -> tuple[str, ...]:
        return self._names[kind]

    def quantity(self, kind: str, name: str) -> Quantity:
        return getattr(self, kind)[self.index(kind, name)]

    # ---- arrays (kernel order; float64, discrete int64) ----
    def nominal(self, kind: str) -> np.ndarray:
        dtype = np.int64 if kind == "discrete" else np.float64
        return np.array([q.nominal for q in getattr(self, kind)], dtype=dtype)

    def lows(self, kind: str) -> np.ndarray:
        return np.array([q.low for q in getattr(self, kind)], dtype=np.float64)

    def highs(self, kind: str) -> np.ndarray:
        return np.array([q.high for q in getattr(self, kind)], dtype=np.float64)

    @property
    def n_states(self) -> int:
        return len(self.states)

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    @property
    def n_outputs(self) -> int:
        return len(self.outputs)

    @property
    def n_params(self) -> int:
        return len(self.params)

    @property
    def n_algebraic(self) -> int:
        return len(self.algebraic)

    @property
    def n_discrete(self) -> int:
        return len(self.discrete)


def element_names(prefix: str, ids: Iterable, field_name: str) -> list[str]:
    """Per-element names `<prefix>_<id>.<field>`: element_names("bus", [1, 2], "vm") ->
    ["bus_1.vm", "bus_2.vm"] (ids as the model file numbers its elements)."""
    return [f"{prefix}_{i}.{field_name}" for i in ids]


def _per_element(value, n: int, what: str, group: str) -> np.ndarray:
    a = np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)) if np.ndim(value) == 0 else \
        np.asarray(value, dtype=np.float64)
    if a.shape != (n,):
        raise ValueError(f"{group}: {what} has {a.shape[0] if a.ndim == 1 else a.shape} values for {n} elements")
    return a


class SpecBuilder:
    """Builds a PlantSpec at load time (e.g. from a model file), scalars and arrays in order.

        b = SpecBuilder("grid", "IEEE 118-bus")
        b.scalar("outputs", Quantity("frequency", "Hz", 50.0, 45.0, 55.0))
        b.array("outputs", "bus.vm", element_names("bus", bus_ids, "vm"), unit="pu",
                nominal=1.0, low=0.0, high=2.0, description="bus voltage magnitude")
        spec = b.build(randomize=randomize)

    `array` appends one Quantity per element (nominal/low/high scalars or per-element
    sequences) and a Group over them; `start(kind)` is the index the next one gets (the
    kernels' index constants).
    """

    def __init__(self, name: str, description: str = ""):
        self.name, self.description = name, description
        self._items: dict[str, list[Quantity]] = {k: [] for k in KINDS}
        self._groups: list[Group] = []

    def start(self, kind: str) -> int:
        return len(self._items[kind])

    def scalar(self, kind: str, q: Quantity) -> int:
        """Append one quantity; returns its index."""
        self._items[kind].append(q)
        return len(self._items[kind]) - 1

    def array(self, kind: str, group: str, names: Sequence[str], *, unit: str, nominal, low, high,
              description: str = "") -> Group:
        """Append len(names) quantities and their group; returns the Group."""
        n = len(names)
        if n == 0:
            raise ValueError(f"{self.name}: group {group!r} has no elements")
        nom = _per_element(nominal, n, "nominal", group)
        lo = _per_element(low, n, "low", group)
        hi = _per_element(high, n, "high", group)
        start = len(self._items[kind])
        # Quantity's checks for the whole array at once (a 2869-bus grid has ~10^5 elements: one
        # dataclass __post_init__ and regex each was most of its start-up), then unchecked construction
        if not _all_names(names):
            Quantity(next(nm for nm in names if not is_name(nm)), unit, 0.0, 0.0, 0.0)  # raises the usual error
        bad = np.flatnonzero(~((lo <= hi) & (lo <= nom) & (nom <= hi)))
        if bad.size:
            i = int(bad[0])
            Quantity(names[i], unit, float(nom[i]), float(lo[i]), float(hi[i]), description)  # raises
        items = self._items[kind]
        for name, v, a, b in zip(names, nom.tolist(), lo.tolist(), hi.tolist()):
            q = object.__new__(Quantity)
            q.__dict__.update(name=name, unit=unit, nominal=v, low=a, high=b, description=description)
            items.append(q)
        g = Group(kind, group, start, n, unit, description)
        self._groups.append(g)
        return g

    def build(self, randomize: Callable | None = None) -> PlantSpec:
        it = self._items
        return PlantSpec(self.name, tuple(it["states"]), tuple(it["inputs"]), tuple(it["outputs"]),
                         tuple(it["params"]), self.description, tuple(it["algebraic"]),
                         tuple(it["discrete"]), tuple(self._groups), randomize)
