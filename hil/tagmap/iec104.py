"""The [iec104] section: plant signals as IEC 60870-5-104 information objects of one station.

    [iec104]
    enabled = true
    host = "127.0.0.1"          # bind address; loopback by default (104 has no authentication:
                                # a non-loopback host needs expose = true)
    port = 2404                 # the IANA port of IEC 60870-5-104
    common_address = 1          # the station's common address of ASDU (CA), 1..65534
    tick_ms = 100               # the server thread's tick (ms): cyclic reports are multiples of it
    select_timeout_ms = 10000   # an execute must follow its select within this time (ms)
    command_mode = "select_and_execute"   # or "direct": how command points accept commands
    max_connections = 8         # simultaneous clients (c104 refuses more)
    deadband = 0.0              # default absolute deadband of measured values (plant unit)
    expose = false              # true: allow a non-loopback host

    [[iec104.points]]           # optional: without any entry the automatic layout below is served
    signal = "bus.vm"           # a plant output or input, or an array group of them
    ioa = 1001                  # information object address; a group's element k at ioa + k
    type = "measured"           # see TYPES; default: measured for an output, setpoint for an input
    deadband = 0.002            # absolute, plant unit: spontaneous when |value - last sent| > it
    report_ms = 0               # cyclic transmission period (ms), 0 = off; a multiple of tick_ms
    threshold = 0.5             # double_point: value >= threshold is ON (default mid-range)
    off_signal = "line.open_cmd"  # double_command only: the input written on OFF

Types (IEC 60870-5-101/104 type identifications):
- measured: M_ME_TF_1, short float with a CP56Time2a time tag, of a plant output;
- double_point: M_DP_TB_1 with a time tag, of a 0/1 output (a breaker: ON = closed when the
  value is >= threshold, OFF below it, INDETERMINATE with quality IV when not a number);
- setpoint: C_SE_NC_1, short float set-point of an input: the value, range-checked against the
  input's physical bounds, is written to the process image;
- single_command: C_SC_TA_1 of an input: ON writes the input's high bound, OFF its low bound;
- double_command: C_DC_TA_1 of a pair of inputs (`signal` written on ON, `off_signal` on OFF):
  ON writes signal = its high bound and off_signal = its low bound, OFF the reverse, in one atomic
  image write. With a pulse qualifier (QU short / long pulse) the inputs go back to their low
  bounds once the loop has read the command (adapters/iec104_image.py); otherwise the command
  holds: for the grid's latched breaker, OFF is then a held open (lock-out) and ON a held close
  (recloses after a protection trip's cooldown), as a Modbus coil held at 1 is.
Commands go to inputs whose driver is "plc" only (`inputs.<name>.driver`, default "plc"): a
single signal driven otherwise is a configuration error; in a group, such elements are left out
(their IOAs stay free, so a command to one is refused as an unknown IOA).

Automatic layout (no [[iec104.points]]): every plant output is a monitor point at IOA
AUTO_MONITOR_START + its index in the spec's outputs (double_point when it is a 0/1 quantity:
unit "1", bounds [0, 1]; else measured), every plc-driven input a setpoint at
AUTO_COMMAND_START + its index in the spec's inputs. `hil tags SCENARIO --protocol iec104`
exports the layout either way (IOA, type, signal, unit, range, deadband, writable).

`compile_points(section, spec, scenario)` turns the validated section into frozen `Point`s; the
checks (`validate_against`) report problems with key paths such as `iec104.points[3].ioa`.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from hil.scenario.config import StrictModel
from hil.tagmap.blocks import group_kind

MAX_IOA = 2**24 - 1  # three octets
AUTO_MONITOR_START = 1
AUTO_COMMAND_START = 100_001
TYPES = {  # our name -> IEC 60870-5 type identification
    "measured": "M_ME_TF_1",
    "double_point": "M_DP_TB_1",
    "setpoint": "C_SE_NC_1",
    "single_command": "C_SC_TA_1",
    "double_command": "C_DC_TA_1",
}
MONITOR_TYPES = ("measured", "double_point")
COMMAND_TYPES = ("setpoint", "single_command", "double_command")
PointType = Literal["measured", "double_point", "setpoint", "single_command", "double_command"]


class Iec104Entry(StrictModel):
    """One signal (or an array group, element k at ioa + k) as information objects."""

    signal: str = Field(description="plant output or input, or an array group of them")
    ioa: int = Field(ge=1, le=MAX_IOA, description="information object address (of the first element)")
    type: PointType | None = Field(default=None, description="default: measured (output) / setpoint (input)")
    off_signal: str | None = Field(default=None, description="double_command: the input written on OFF")
    deadband: float | None = Field(default=None, ge=0.0, description="absolute, plant unit; default [iec104] deadband")
    report_ms: int = Field(default=0, ge=0, le=86_400_000, description="cyclic transmission period (ms), 0 = off")
    threshold: float | None = Field(default=None, description="double_point: ON at or above it (plant unit)")


class Iec104Section(StrictModel):
    """The [iec104] section: server endpoint, station and information object map."""

    enabled: bool = Field(default=True, description="false: no server is started, nothing is bound")
    host: str = Field(default="127.0.0.1", description="bind address (loopback unless expose = true)")
    port: int = Field(default=2404, ge=1, le=65535)
    common_address: int = Field(default=1, ge=1, le=65534, description="common address of ASDU")
    tick_ms: int = Field(default=100, ge=10, le=10_000, description="server thread tick (ms)")
    select_timeout_ms: int = Field(default=10_000, ge=100, le=600_000,
                                   description="an execute must follow its select within this (ms)")
    command_mode: Literal["select_and_execute", "direct"] = "select_and_execute"
    max_connections: int = Field(default=8, ge=1, le=1000)
    deadband: float = Field(default=0.0, ge=0.0, description="default absolute deadband (plant unit)")
    expose: bool = Field(default=False, description="allow a non-loopback host (no authentication in 104)")
    points: list[Iec104Entry] = Field(default_factory=list)

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"

    def validate_against(self, spec, scenario) -> list[tuple[str, str]]:
        """Checks that need the plant spec; (key_path, reason) pairs, empty if valid."""
        problems: list[tuple[str, str]] = []
        if not self.loopback and not self.expose:
            problems.append(("iec104.host", f"{self.host!r} is not a loopback address and IEC 60870-5-104 "
                             "has no authentication: set iec104.expose = true to serve it anyway"))
        compile_points(self, spec, scenario, problems)
        return problems


@dataclass(frozen=True)
class Point:
    """One information object: what it serves or what a command to it writes."""

    ioa: int
    type: str            # a key of TYPES
    signal: str
    index: int           # output index (monitor point) or input index (command point)
    unit: str
    low: float           # the signal's physical bounds (plant unit): commands outside are refused
    high: float
    deadband: float = 0.0
    report_ms: int = 0
    threshold: float = math.nan
    off_signal: str | None = None
    off_index: int = -1
    off_low: float = math.nan
    off_high: float = math.nan
    key: str = ""        # config key path (auto layout: "iec104")

    @property
    def type_id(self) -> str:
        return TYPES[self.type]

    @property
    def is_command(self) -> bool:
        return self.type in COMMAND_TYPES


def _driver(scenario, name: str) -> str:
    inp = (getattr(scenario, "inputs", None) or {}).get(name)
    return "plc" if inp is None else inp.driver


def _binary(q) -> bool:
    return q.unit == "1" and q.low == 0.0 and q.high == 1.0


def _names(spec, name: str) -> tuple[str | None, tuple[str, ...]]:
    """(kind "outputs"/"inputs", element names) of a signal or group name; (None, ()) if unknown."""
    kind = group_kind(spec, name)
    if kind is not None:
        return kind, tuple(spec.expand(kind, name))
    for k in ("outputs", "inputs"):
        if spec.has(k, name):
            return k, (spec.quantity(k, name).name,)
    return None, ()


def _auto_points(section: Iec104Section, spec, scenario) -> list[Point]:
    out = []
    for i, name in enumerate(spec.names("outputs")):
        q = spec.quantity("outputs", name)
        binary = _binary(q)
        out.append(Point(AUTO_MONITOR_START + i, "double_point" if binary else "measured", name, i, q.unit, q.low,
                         q.high, deadband=0.0 if binary else section.deadband,
                         threshold=0.5 * (q.low + q.high) if binary else math.nan, key="iec104"))
    for j, name in enumerate(spec.names("inputs")):
        if _driver(scenario, name) != "plc":
            continue
        q = spec.quantity("inputs", name)
        out.append(Point(AUTO_COMMAND_START + j, "setpoint", name, j, q.unit, q.low, q.high, key="iec104"))
    return out


def _entry_points(section: Iec104Section, spec, scenario, i: int, e: Iec104Entry,
                  problems: list) -> list[Point]:
    key = f"iec104.points[{i}]"
    kind, names = _names(spec, e.signal)
    if kind is None:
        problems.append((f"{key}.signal", f"{spec.name} has no output, input or array group {e.signal!r} "
                         f"(outputs: {spec.describe_names('outputs')}; inputs: {spec.describe_names('inputs')})"))
        return []
    ptype = e.type or ("measured" if kind == "outputs" else "setpoint")
    if ptype in MONITOR_TYPES and kind != "outputs":
        problems.append((f"{key}.type", f"{ptype!r} is a monitor type for plant outputs; {e.signal!r} is an "
                         f"input (commands: {', '.join(COMMAND_TYPES)})"))
        return []
    if ptype in COMMAND_TYPES and kind != "inputs":
        problems.append((f"{key}.type", f"{ptype!r} is a command type; {e.signal!r} is a sensor (plant output), "
                         "read-only"))
        return []
    if e.ioa + len(names) - 1 > MAX_IOA:
        problems.append((f"{key}.ioa", f"{len(names)} objects from {e.ioa} run past the last IOA {MAX_IOA}"))
        return []
    if e.off_signal is not None and ptype != "double_command":
        problems.append((f"{key}.off_signal", f"only used with type = 'double_command', not {ptype!r}"))
        return []
    if ptype == "double_command" and e.off_signal is None:
        problems.append((f"{key}.off_signal", "a double_command needs the input written on OFF (off_signal)"))
        return []
    if ptype in COMMAND_TYPES and (e.deadband is not None or e.report_ms):
        what = "deadband" if e.deadband is not None else "report_ms"
        problems.append((f"{key}.{what}", "is for monitor points (measured, double_point), not commands"))
        return []
    if e.threshold is not None and ptype != "double_point":
        problems.append((f"{key}.threshold", f"only used with type = 'double_point', not {ptype!r}"))
        return []
    if e.report_ms % section.tick_ms:
        problems.append((f"{key}.report_ms", f"{e.report_ms} is not a multiple of iec104.tick_ms = "
                         f"{section.tick_ms}"))
        return []
    off_names: tuple[str, ...] = ()
    if ptype == "double_command":
        off_kind, off_names = _names(spec, e.off_signal)
        if off_kind != "inputs":
            problems.append((f"{key}.off_signal", f"{spec.name} has no input or input group {e.off_signal!r} "
                             f"(inputs: {spec.describe_names('inputs')})"))
            return []
        if len(off_names) != len(names):
            problems.append((f"{key}.off_signal", f"{e.off_signal!r} has {len(off_names)} elements, "
                             f"{e.signal!r} {len(names)}: they pair element by element"))
            return []
    points = []
    is_group = group_kind(spec, e.signal) is not None
    for k, name in enumerate(names):
        q = spec.quantity(kind, name)
        extra: dict = {}
        if ptype in COMMAND_TYPES:
            drivers = [(n, _driver(scenario, n)) for n in (name,) + ((off_names[k],) if off_names else ())]
            other = [(n, d) for n, d in drivers if d != "plc"]
            if other and is_group:
                continue    # an element driven otherwise is no command object (its IOA stays free)
            if other:
                n, drv = other[0]
                problems.append((f"{key}.signal" if n == name else f"{key}.off_signal",
                                 f"input {n!r} is driven by {drv!r} (inputs.{n}.driver); only 'plc' inputs "
                                 "take commands"))
                return []
            if off_names:
                oq = spec.quantity("inputs", off_names[k])
                extra = dict(off_signal=oq.name, off_index=spec.index("inputs", oq.name), off_low=oq.low,
                             off_high=oq.high)
        else:
            deadband = section.deadband if e.deadband is None else e.deadband
            extra = dict(deadband=0.0 if ptype == "double_point" else deadband, report_ms=e.report_ms)
            if ptype == "double_point":
                thr = 0.5 * (q.low + q.high) if e.threshold is None else e.threshold
                if not q.low < thr <= q.high:
                    problems.append((f"{key}.threshold", f"{thr:g} {q.unit} is not within ({q.low:g}, {q.high:g}] "
                                     f"{q.unit}, the bounds of {name!r}"))
                    return []
                extra["threshold"] = thr
        points.append(Point(e.ioa + k, ptype, q.name, spec.index(kind, q.name), q.unit, q.low, q.high, key=key,
                            **extra))
    return points


def compile_points(section: Iec104Section, spec, scenario, problems: list | None = None) -> list[Point]:
    """Every information object the server serves, in IOA order. Problems (key path, reason) go
    to `problems` when given; otherwise the first one raises ConfigError."""
    from hil.errors import ConfigError

    found: list[tuple[str, str]] = []
    if not section.points:
        points = _auto_points(section, spec, scenario)
    else:
        points = []
        owner: dict[int, str] = {}
        for i, e in enumerate(section.points):
            for p in _entry_points(section, spec, scenario, i, e, found):
                if p.ioa in owner:
                    found.append((f"iec104.points[{i}].ioa", f"IOA {p.ioa} ({p.signal}) is already taken by "
                                  f"{owner[p.ioa]}"))
                    break
                owner[p.ioa] = f"{p.key} ({p.signal})"
                points.append(p)
    if problems is not None:
        problems.extend(found)
    elif found:
        raise ConfigError("", problems=found)
    return sorted(points, key=lambda p: p.ioa)
