"""The [modbus] section: plant signals onto Modbus tables, addresses and encodings.

    [modbus]
    host = "127.0.0.1"      # bind address of the server, and where the SoftPLC connects
    port = 5020
    unit_id = 1             # alias: device_id; requests for unit 0 and 255 are served too
    request_log_size = 100000   # requests kept in memory (ring) for the latency log
    request_log = "runs/modbus-requests.parquet"   # optional: dumped at shutdown (.jsonl too)
    client_stats = "runs/modbus-clients.json"      # optional: per-client counters at shutdown
    max_clients = 1024      # per-client counters kept (statistics table only, not a limit)
    max_connections = 32    # simultaneous connections; one more is closed at once, counted
    idle_timeout_s = 120.0  # a connection silent this long (s) is closed; 0 = never

    [[modbus.map]]
    signal = "glucose"      # a plant output (sensor) or input (actuator) of the spec
    table = "input_register"    # coil | discrete_input | input_register | holding_register
    address = 0             # PDU address, 0-based (mbpoll -0; 1-based tools show 1)
    encoding = "float32"    # uint16 int16 uint32 int32 float32 float64 | bool (bit tables)
    scale = 1.0             # raw = (value - offset) * scale ; value = raw / scale + offset
    offset = 0.0            # value in the signal's plant unit, raw as encoded on the wire
    word_order = "big"      # multi-register: "big" = most significant register first
    byte_order = "big"      # within each register: "big" = high byte first (Modbus)
    eng_low = 0.0           # optional engineering range of this view (plant unit), both or
    eng_high = 60.0         # neither: writes outside answer ILLEGAL DATA VALUE (0x03)

Engineering range: by default a view covers the signal's physical bounds (the spec's), and
an integer encoding must represent all of them after scale and offset. `eng_low`/`eng_high`
narrow one view to a sub-range of those bounds (a 16-bit view of 0..60 % of a 0..100 %
valve with scale = 1000, say): only that sub-range must fit the encoding, a write outside
it (beyond the encoding's round-off, which is clamped) answers ILLEGAL DATA VALUE, and a
read of a value outside it saturates at the encoding's limits (or reads beyond the range
where the encoding still holds it).

Several views of one signal (a float32 and a scaled 16-bit view of the same actuator, or
a sensor in two tables) are allowed on purpose: 16-bit-only masters and float masters can
share a plant. Writable views of one actuator all write the same image input, so the last
write wins (whatever the protocol: an OPC UA Actuators node is one more view); the server
logs at start which views share a signal (`describe_shared_views`).

Scale and offset apply to every register encoding; integer encodings round the raw value
to the nearest integer (so scale = 10 gives a resolution of 0.1 plant unit) and a read of
a value beyond the encodable range saturates; a non-finite value (sensor dropout) reads
as the encoding's "invalid" sentinel: int16 -32768, int32 -2**31, uint16 0xFFFF, uint32
0xFFFFFFFF (float encodings carry NaN as is). Bit tables (`encoding = "bool"`, the
default there) read `value >= threshold` (default: mid-range of the signal's bounds) and
a written coil sets `on_value` / `off_value` (defaults: the signal's high / low bound).

Access rules (checked by `validate_against`, with key paths such as
`modbus.map[3].address`):
- sensors (plant outputs) are read-only; they may sit in a holding register (many PLCs
  read with FC3 only) but never with `writable = true`;
- an input is writable only in a holding register or coil, only if its scenario driver is
  "plc" (`inputs.<name>.driver`, default "plc"); `writable` defaults to exactly that;
  `source = "applied"` maps the input as applied to the plant (read-only) instead of the
  commanded value;
- addresses of one table must not overlap, and a value must end at or before 65535;
- integer encodings must represent the signal's physical bounds after scale and offset.

`compile_map(section, spec, scenario)` turns the validated section into a `CompiledMap`
of frozen dataclasses with per-table address lookups, built once for the server's and the
SoftPLC's hot paths.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Mapping

from pydantic import AliasChoices, Field, field_validator

from hil.scenario.config import StrictModel, outside_bounds
from hil.tagmap.blocks import dedupe, expand_blocks

TABLES = ("coil", "discrete_input", "input_register", "holding_register")
BIT_TABLES = ("coil", "discrete_input")
WRITABLE_TABLES = ("coil", "holding_register")
# encoding -> (struct code, registers, raw min, raw max, integer?)
ENCODINGS: dict[str, tuple[str, int, float, float, bool]] = {
    "uint16": ("H", 1, 0, 0xFFFF, True),
    "int16": ("h", 1, -0x8000, 0x7FFF, True),
    "uint32": ("I", 2, 0, 0xFFFFFFFF, True),
    "int32": ("i", 2, -0x80000000, 0x7FFFFFFF, True),
    "float32": ("f", 2, -3.4028234663852886e38, 3.4028234663852886e38, False),
    "float64": ("d", 4, -math.inf, math.inf, False),
}
# Raw value a non-finite signal reads as (integer encodings).
INVALID_RAW = {"uint16": 0xFFFF, "int16": -0x8000, "uint32": 0xFFFFFFFF, "int32": -0x80000000}
MAX_ADDRESS = 65535

Table = Literal["coil", "discrete_input", "input_register", "holding_register"]
Encoding = Literal["uint16", "int16", "uint32", "int32", "float32", "float64", "bool"]
Order = Literal["big", "little"]


class _View(StrictModel):
    """How one signal is encoded in one Modbus table (shared by map entries and blocks)."""

    table: Table
    encoding: Encoding | None = Field(default=None, description="default: bool for bit tables")
    scale: float = Field(default=1.0, description="raw = (value - offset) * scale")
    offset: float = Field(default=0.0, description="plant unit")
    word_order: Order = "big"
    byte_order: Order = "big"
    writable: bool | None = Field(default=None, description="default: plc-driven input in hr/coil")
    source: Literal["command", "applied"] | None = Field(
        default=None, description="inputs only: commanded (default) or applied value"
    )
    eng_low: float | None = Field(default=None, description="engineering range of this view, low (plant unit)")
    eng_high: float | None = Field(default=None, description="engineering range of this view, high (plant unit)")
    threshold: float | None = Field(default=None, description="bit tables: value >= threshold")
    on_value: float | None = Field(default=None, description="coil written 1 -> value")
    off_value: float | None = Field(default=None, description="coil written 0 -> value")

    @field_validator("scale")
    @classmethod
    def _scale(cls, v: float) -> float:
        if not math.isfinite(v) or v == 0:
            raise ValueError(f"{v} must be finite and non-zero")
        return v

    @field_validator("offset", "threshold", "on_value", "off_value", "eng_low", "eng_high")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"{v} is not finite")
        return v

    def view_range(self, q) -> tuple[float, float]:
        """[low, high] this view accepts and must encode, plant unit: eng_low/eng_high or the bounds."""
        if self.eng_low is not None and self.eng_high is not None:
            return self.eng_low, self.eng_high
        return q.low, q.high

    @property
    def effective_encoding(self) -> str:
        if self.encoding is not None:
            return self.encoding
        return "bool" if self.table in BIT_TABLES else "float32"

    @property
    def n_words(self) -> int:
        """Addresses used: registers for register tables, 1 bit for bit tables."""
        enc = self.effective_encoding
        return 1 if enc == "bool" else ENCODINGS[enc][1]


class RegisterMap(_View):
    """One signal at one place of one Modbus table."""

    signal: str = Field(description="plant output (sensor) or input (actuator) name")
    address: int = Field(ge=0, le=MAX_ADDRESS, description="0-based PDU address")


class RegisterBlock(_View):
    """An array group of the spec onto consecutive addresses (hil/tagmap/blocks.py): element k
    (in the group's order) at `start + k * stride`, every element with this entry's encoding,
    scale, offset, access (one `[[modbus.blocks]]` entry instead of one map entry per element)."""

    group: str = Field(description="array group of plant outputs or inputs, e.g. 'bus.vm'")
    start: int = Field(ge=0, le=MAX_ADDRESS, description="0-based PDU address of the first element")
    stride: int | None = Field(default=None, ge=1, le=MAX_ADDRESS,
                               description="addresses per element (default: the encoding's width)")


class ModbusSection(StrictModel):
    """The [modbus] section: server endpoint and register map."""

    enabled: bool = Field(default=True, description="false: no server is started, nothing is bound")
    host: str = Field(default="127.0.0.1", description="bind address; 0.0.0.0 exposes it")
    port: int = Field(default=5020, ge=1, le=65535)
    unit_id: int = Field(
        default=1, ge=0, le=255, validation_alias=AliasChoices("unit_id", "device_id")
    )
    request_log_size: int = Field(
        default=100_000, ge=0, le=10_000_000, description="requests kept for the latency log"
    )
    max_clients: int = Field(default=1024, ge=1, description="per-client counters kept (statistics only)")
    max_connections: int = Field(
        default=32, ge=1, le=10_000,
        description="simultaneous TCP connections; more are closed at once and counted as refused")
    idle_timeout_s: float = Field(
        default=120.0, ge=0.0, le=86_400.0,
        description="close a connection silent for this long, s; 0 = never")
    request_log: str | None = Field(
        default=None, description="write the request log here at shutdown (.jsonl or .parquet)")
    client_stats: str | None = Field(
        default=None, description="write the per-client counters here at shutdown (JSON)")
    map: list[RegisterMap] = Field(default_factory=list)
    blocks: list[RegisterBlock] = Field(default_factory=list)

    def validate_against(self, spec, scenario) -> list[tuple[str, str]]:
        """Checks that need the plant spec; (key_path, reason) pairs, empty if valid."""
        problems: list[tuple[str, str]] = []
        _check_entries(self, spec, scenario, problems)
        return dedupe(problems)

    def entries(self, spec, problems: list | None = None) -> list[tuple[str, RegisterMap]]:
        """(key path, entry) of every served view: the map's, then each block's elements
        (key `modbus.blocks[j]`, so a problem of a block is reported once)."""
        out = []
        for i, e in enumerate(self.map):
            kind = signal_kind(spec, e.signal)
            if kind is not None:  # `bus.vm[11]` -> the element's own name (drivers are keyed by it)
                name = spec.quantity(kind + "s", e.signal).name
                e = e if name == e.signal else e.model_copy(update={"signal": name})
            out.append((f"modbus.map[{i}]", e))
        return out + expand_blocks(self, spec, RegisterMap, problems)

    def compile(self, spec, scenario) -> "CompiledMap":
        return compile_map(self, spec, scenario)


# ---------------------------------------------------------------------------- checks


def signal_kind(spec, name: str) -> str | None:
    """"output" (sensor), "input" (actuator) or None; a name in both is taken as the output.
    Element names (`bus_12.vm`, `bus.vm[11]`) count, group names do not (blocks map groups)."""
    for kind in ("outputs", "inputs"):
        if spec.has(kind, name) and spec.group(kind, name) is None:
            return kind[:-1]
    return None


def _driver(scenario, name: str) -> str:
    inputs = getattr(scenario, "inputs", None) or {}
    inp = inputs.get(name)
    return "plc" if inp is None else inp.driver


def effective_writable(e: RegisterMap, kind: str, scenario) -> bool:
    """`writable` as given, else: a plc-driven input's command in a holding register or coil."""
    if e.writable is not None:
        return e.writable
    return (
        kind == "input"
        and e.table in WRITABLE_TABLES
        and (e.source or "command") == "command"
        and _driver(scenario, e.signal) == "plc"
    )


def _check_entries(section: ModbusSection, spec, scenario, problems: list) -> None:
    used: dict[str, list[tuple[int, int, int]]] = {t: [] for t in TABLES}
    entries = section.entries(spec, problems)
    for i, (key, e) in enumerate(entries):
        enc = e.effective_encoding
        n = e.n_words
        # address space
        if e.address + n - 1 > MAX_ADDRESS:
            problems.append((f"{key}.address", f"{enc} at {e.address} needs {n} registers "
                             f"and runs past the last address {MAX_ADDRESS}"))
        else:
            used[e.table].append((e.address, e.address + n - 1, i))
        # encoding vs table
        if e.table in BIT_TABLES and enc != "bool":
            problems.append((f"{key}.encoding", f"{enc!r} is not allowed in a {e.table} table "
                             "(one bit per address: use 'bool')"))
            continue
        if e.table not in BIT_TABLES and enc == "bool":
            problems.append((f"{key}.encoding", f"'bool' needs a coil or discrete_input table, "
                             f"not {e.table}"))
            continue
        kind = signal_kind(spec, e.signal)
        if kind is None:
            problems.append((f"{key}.signal", f"{spec.name} has no output or input {e.signal!r} "
                             f"(outputs: {spec.describe_names('outputs')}; "
                             f"inputs: {spec.describe_names('inputs')}; a group goes in [[modbus.blocks]])"))
            continue
        q = spec.quantity(kind + "s", e.signal)
        if e.source is not None and kind == "output":
            problems.append((f"{key}.source", f"{e.signal!r} is a sensor; 'source' is for inputs"))
        writable = effective_writable(e, kind, scenario)
        if writable:
            if kind == "output":
                problems.append((f"{key}.writable", f"{e.signal!r} is a sensor (plant output); "
                                 "sensors are read-only"))
            elif e.table not in WRITABLE_TABLES:
                problems.append((f"{key}.writable", f"a {e.table} is read-only by protocol; "
                                 "writable inputs go in a holding_register or coil"))
            elif e.source == "applied":
                problems.append((f"{key}.writable", "the applied value is the loop's, read-only"))
            elif (drv := _driver(scenario, e.signal)) != "plc":
                problems.append((f"{key}.writable", f"input {e.signal!r} is driven by {drv!r} "
                                 f"(inputs.{e.signal}.driver); only 'plc' inputs are writable"))
        if (e.eng_low is None) != (e.eng_high is None):
            missing = "eng_high" if e.eng_high is None else "eng_low"
            problems.append((f"{key}.{missing}", "eng_low and eng_high go together: give both or neither"))
            continue
        if e.eng_low is not None:
            if enc == "bool":
                problems.append((f"{key}.eng_low", "an engineering range is for register views, not bool "
                                 "(use threshold / on_value / off_value)"))
                continue
            if not e.eng_low < e.eng_high:
                problems.append((f"{key}.eng_high", f"{e.eng_high:g} must be above eng_low {e.eng_low:g}"))
                continue
            bad = [(n, v) for n, v in (("eng_low", e.eng_low), ("eng_high", e.eng_high)) if outside_bounds(v, q)]
            if bad:
                for n, v in bad:
                    problems.append((f"{key}.{n}", f"{v:g} {q.unit} is outside the physical bounds "
                                     f"[{q.low:g}, {q.high:g}] {q.unit} of {e.signal!r}"))
                continue
        if enc == "bool":
            _check_bits(e, key, q, writable, problems)
        else:
            for name in ("threshold", "on_value", "off_value"):
                if getattr(e, name) is not None:
                    problems.append((f"{key}.{name}", f"only for coil/discrete_input, not {enc}"))
            _check_range(e, key, q, problems)
    for table, spans in used.items():
        spans.sort()
        for (a0, a1, i), (b0, b1, j) in zip(spans, spans[1:]):
            if b0 <= a1:
                (ki, ei), (kj, ej) = entries[i], entries[j]
                field = "start" if kj.startswith("modbus.blocks") else "address"
                problems.append((f"{kj}.{field}",
                                 f"{table} {b0}..{b1} ({ej.signal}) overlaps "
                                 f"{ki} {a0}..{a1} ({ei.signal})"))


def _check_bits(e: RegisterMap, key: str, q, writable: bool, problems: list) -> None:
    if e.scale != 1.0 or e.offset != 0.0:
        problems.append((f"{key}.scale", "scale/offset do not apply to bool"))
    if e.threshold is None and not (math.isfinite(q.low) and math.isfinite(q.high)):
        problems.append((f"{key}.threshold", f"{q.name} has unbounded range: give a threshold"))
    for name, default in (("on_value", q.high), ("off_value", q.low)):
        v = getattr(e, name)
        if v is None:
            if writable and not math.isfinite(default):
                problems.append((f"{key}.{name}", f"{q.name} has unbounded range: give {name}"))
            continue
        if not writable:
            problems.append((f"{key}.{name}", "only for writable coils"))
        elif reason := outside_bounds(v, q):
            problems.append((f"{key}.{name}", reason))


def _check_range(e: RegisterMap, key: str, q, problems: list) -> None:
    enc = e.effective_encoding
    _, _, rmin, rmax, is_int = ENCODINGS[enc]
    if not is_int:
        return
    low, high = e.view_range(q)
    if not (math.isfinite(low) and math.isfinite(high)):
        problems.append((f"{key}.encoding", f"{enc} cannot represent {q.name}'s unbounded range "
                         f"[{low}, {high}] {q.unit}; use float32/float64 or give eng_low/eng_high"))
        return
    r = sorted(((low - e.offset) * e.scale, (high - e.offset) * e.scale))
    if r[0] < rmin - 0.5 or r[1] > rmax + 0.5:
        what = "engineering range" if e.eng_low is not None else "bounds"
        hint = "" if e.eng_low is not None else " (or narrow this view with eng_low/eng_high)"
        problems.append((f"{key}.scale", f"{enc} with scale {e.scale:g} and offset {e.offset:g} "
                         f"cannot represent {q.name}'s {what} [{low}, {high}] {q.unit}: raw "
                         f"{r[0]:g}..{r[1]:g} is outside {rmin}..{rmax}{hint}"))


# ---------------------------------------------------------------------------- compiled form


_CODECS: dict[tuple[str, str, str], tuple[struct.Struct, struct.Struct, bool]] = {}


def _codec(encoding: str, word_order: str, byte_order: str):
    """(value struct, words struct, reverse words?) for one layout, built once.

    The value is packed big-endian (most significant byte first); splitting those bytes
    into 16-bit words read big-endian gives the standard layout (ABCD), read
    little-endian gives byte-swapped words (BADC); reversing the words gives CDAB / DCBA.
    """
    key = (encoding, word_order, byte_order)
    c = _CODECS.get(key)
    if c is None:
        code, n = ENCODINGS[encoding][:2]
        order = "<" if byte_order == "little" else ">"
        c = _CODECS[key] = (struct.Struct(">" + code), struct.Struct(order + "H" * n),
                            word_order == "little")
    return c


@dataclass(frozen=True, slots=True)
class Tag:
    """One compiled map entry. Values in the signal's plant unit, raw as on the wire.

    kind: "output" (sensor) or "input" (actuator); index: position in the image array;
    source: "measured" (outputs), "command" or "applied" (inputs). low, high: the range
    this view accepts on writes (its eng_low/eng_high, else the signal's physical bounds).
    """

    key: str
    signal: str
    kind: str
    index: int
    source: str
    table: str
    address: int
    encoding: str
    n_words: int
    scale: float
    offset: float
    word_order: str
    byte_order: str
    writable: bool
    low: float
    high: float
    threshold: float
    on_value: float
    off_value: float

    # ---- registers ----
    def to_registers(self, value: float) -> tuple[int, ...]:
        """Encode a plant-unit value as register words (wire order)."""
        pack, words, reverse = _codec(self.encoding, self.word_order, self.byte_order)
        _, _, rmin, rmax, is_int = ENCODINGS[self.encoding]
        raw = (value - self.offset) * self.scale
        if is_int:
            raw = INVALID_RAW[self.encoding] if raw != raw or raw in (math.inf, -math.inf) else int(
                min(max(round(raw), rmin), rmax))
        elif abs(raw) > rmax and raw == raw:  # float32 overflow reads as +-inf
            raw = math.copysign(math.inf, raw)
        w = words.unpack(pack.pack(raw))
        return w[::-1] if reverse else w

    def from_registers(self, words, sentinel_nan: bool = False) -> float:
        """Decode register words (wire order) into a plant-unit value.

        With `sentinel_nan`, an integer encoding's "invalid" raw value decodes as NaN (a
        master reading a sensor that dropped out), unless it lies inside the raw range of
        the signal's bounds (then it is an ordinary value).
        """
        pack, word_struct, reverse = _codec(self.encoding, self.word_order, self.byte_order)
        w = tuple(int(x) for x in words)
        raw = pack.unpack(word_struct.pack(*(w[::-1] if reverse else w)))[0]
        if sentinel_nan and raw == INVALID_RAW.get(self.encoding):
            lo, hi = sorted(((self.low - self.offset) * self.scale, (self.high - self.offset) * self.scale))
            if not lo - 0.5 <= raw <= hi + 0.5:
                return math.nan
        return raw / self.scale + self.offset

    # ---- bits ----
    def to_bit(self, value: float) -> bool:
        return bool(value >= self.threshold)  # NaN reads as False

    def from_bit(self, bit: bool) -> float:
        return self.on_value if bit else self.off_value

    @property
    def tolerance(self) -> float:
        """Encoding round-off accepted beyond the bounds on writes (clamped), plant unit."""
        enc = self.encoding
        if enc == "bool":
            return 0.0
        if ENCODINGS[enc][4]:
            return 0.5 / abs(self.scale)
        span = max(abs(self.low - self.offset), abs(self.high - self.offset))
        if not math.isfinite(span):
            return 0.0
        return span * (2.0 ** -22 if enc == "float32" else 2.0 ** -50)
        return 0.0


@dataclass(frozen=True)
class CompiledMap:
    """Per table: address -> (tag number, word offset within the tag)."""

    host: str
    port: int
    unit_id: int
    tags: tuple[Tag, ...]
    lookup: Mapping[str, Mapping[int, tuple[int, int]]]

    def tags_for(self, signal: str, writable: bool | None = None) -> list[Tag]:
        return [t for t in self.tags if t.signal == signal and (writable is None or t.writable == writable)]

    def shared_views(self) -> dict[tuple[str, str], tuple[Tag, ...]]:
        """(signal, source) -> its tags, for every signal value served by more than one tag."""
        groups: dict[tuple[str, str], list[Tag]] = {}
        for t in self.tags:
            groups.setdefault((t.signal, t.source), []).append(t)
        return {k: tuple(v) for k, v in groups.items() if len(v) > 1}


def describe_tag(t: Tag) -> str:
    """e.g. 'holding_register 4 uint16 x100 [0, 60] (modbus.map[11])'."""
    enc = t.encoding
    if enc != "bool" and (t.scale != 1.0 or t.offset != 0.0):
        enc += f" x{t.scale:g}" + (f" offset {t.offset:g}" if t.offset else "")
    return f"{t.table} {t.address} {enc} [{t.low:g}, {t.high:g}] ({t.key})"


def describe_shared_views(cmap: CompiledMap) -> list[str]:
    """One line per signal with several views, writable ones first (logged at server start)."""
    lines = []
    for (signal, source), tags in sorted(cmap.shared_views().items(),
                                         key=lambda kv: (not any(t.writable for t in kv[1]), kv[0])):
        views = "; ".join(describe_tag(t) for t in tags)
        writers = sum(t.writable for t in tags)
        if writers > 1:
            lines.append(f"{signal} is written through {writers} views, the last write wins: {views}")
        else:
            lines.append(f"{signal} ({source}) is served by {len(tags)} views: {views}")
    return lines


def compile_map(section: ModbusSection, spec, scenario) -> CompiledMap:
    """Build the lookup tables once; raises ConfigError if the section is invalid."""
    from hil.errors import ConfigError

    problems = section.validate_against(spec, scenario)
    if problems:
        raise ConfigError("", problems=problems)
    tags = []
    lookup: dict[str, dict[int, tuple[int, int]]] = {t: {} for t in TABLES}
    for key, e in section.entries(spec):
        kind = signal_kind(spec, e.signal)
        q = spec.quantity(kind + "s", e.signal)
        low, high = e.view_range(q)
        source = "measured" if kind == "output" else (e.source or "command")
        tag = Tag(
            key=key, signal=q.name, kind=kind,
            index=spec.index(kind + "s", e.signal), source=source, table=e.table,
            address=e.address, encoding=e.effective_encoding, n_words=e.n_words,
            scale=e.scale, offset=e.offset, word_order=e.word_order, byte_order=e.byte_order,
            writable=effective_writable(e, kind, scenario), low=low, high=high,
            threshold=e.threshold if e.threshold is not None else 0.5 * (q.low + q.high),
            on_value=e.on_value if e.on_value is not None else q.high,
            off_value=e.off_value if e.off_value is not None else q.low,
        )
        n = len(tags)
        tags.append(tag)
        for w in range(tag.n_words):
            lookup[e.table][e.address + w] = (n, w)
    frozen = MappingProxyType({t: MappingProxyType(d) for t, d in lookup.items()})
    return CompiledMap(section.host, section.port, section.unit_id, tuple(tags), frozen)
