"""The [opcua] section: the OPC UA server's endpoint, security, users and nodes.

    [opcua]
    host = "127.0.0.1"              # bind address; a non-loopback host needs users AND trusted
                                    # client certificates (or security.insecure = true)
    port = 4840
    max_connections = 32            # simultaneous TCP connections; more are closed and counted
    idle_timeout_s = 300.0          # close a connection silent this long (s); 0 = never. Also
                                    # caps the session timeout a client may negotiate
    endpoint_path = "/hil"          # endpoint URL opc.tcp://<host>:<port>/hil
    application_uri = "urn:hil:opcua:server"   # must be in the certificate (hil certs)
    namespace_uri = "urn:hil:<scenario name>"  # default
    min_publishing_interval_ms = 10.0  # subscriptions asking for less get this (revised)
    min_sampling_interval_ms = 1.0     # fastest the server samples the image (poll period
                                       # = loop period clamped to [this, 10 ms])

    [opcua.security]
    allow_none = true               # SecurityPolicy None; default: true only on loopback
    policies = ["Basic256Sha256_Sign", "Basic256Sha256_SignAndEncrypt"]
    certificate = "certs/server_cert.der"   # paths relative to the scenario file
    private_key = "certs/server_key.pem"
    generate_missing = true         # create them (as `hil certs` does) when missing
    trusted_clients_dir = "certs/trusted"   # optional: only these client certs may connect
    allow_anonymous = false         # default: true without users, false with users
    insecure = false                # true: serve a non-loopback host without users or trusted
                                    # client certificates (anyone on the network may write)

    [opcua.users]                   # username = password, or a hash from `hil certs --hash-password`
    operator = "pbkdf2-sha256$200000$...$..."

    [[opcua.nodes]]                 # optional per-signal overrides
    signal = "glucose"              # browse name and node id follow from the signal name
    display_name = "Glucose"        # what browsers show (default: the signal name)
    data_type = "Float"             # Double (default) Float Boolean SByte Byte Int16 UInt16 Int32 ...
    eu_range = [0.0, 100.0]         # within the spec's physical bounds (default: those bounds)
    unit = "g/L"                    # EngineeringUnits display name (default: the spec's unit)
    unece_code = "GL"               # UN/ECE Rec. 20 code (default: looked up from the unit)
    writable = true                 # actuators only (default true); sensors are read-only
    enabled = true                  # false: not served

Default address space (adapters/opcua.py): every plant output is a read-only sensor node
`Objects/<scenario>/Sensors/<signal>`, every input whose driver is "plc" a writable actuator
node `.../Actuators/<signal>`, and every input's applied value a read-only node
`.../Applied/<signal>`. One name per signal:
- the string NodeId is "<scenario>.<Kind>.<signal>" (Kind: Sensors, Actuators, Applied) in the
  scenario's namespace, whatever the folder layout: moving a signal into an
  [[opcua.folders]] folder (or renaming the folder) does not change its node id;
- the browse name is the signal name with every character that the text form of a
  RelativePath reserves (OPC UA Part 4 A.2: `/ . < > : # ! &`) replaced by `_`
  (`bus_1.vm` -> `bus_1_vm`), so a browse path is typed without escapes
  (`Objects/grid118/Sensors/bus_vm/bus_1_vm`); two signals that would share a browse name
  in one folder are a configuration error. Folder browse names follow the same rule;
- the DisplayName is the signal name as it is (`display_name` overrides it).

Data types: each node's `data_type` is what it serves and declares; writes of any numeric
variant type convert as commercial servers do (adapters/opcua_types.py): exactly, or within
the variable's precision (a Double to a Float variable rounds to float32), an integral
float to an integer variable; a fraction to an integer variable is BadTypeMismatch, a value
beyond the data type or the node's EU range BadOutOfRange.
When users are configured, anonymous sessions (if allowed at all) are read-only.

Exposure: bound to a non-loopback address the server refuses to start unless users are
configured AND client certificates are trusted explicitly (`trusted_clients_dir`), or
`[opcua.security] insecure = true` (logged loudly at start).
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from hil.certs import SERVER_APPLICATION_URI, is_password_hash, parse_password_hash
from hil.scenario.config import StrictModel

POLICIES = (
    "Basic256Sha256_Sign",
    "Basic256Sha256_SignAndEncrypt",
    "Aes128Sha256RsaOaep_Sign",
    "Aes128Sha256RsaOaep_SignAndEncrypt",
    "Aes256Sha256RsaPss_Sign",
    "Aes256Sha256RsaPss_SignAndEncrypt",
)
Policy = Literal[
    "Basic256Sha256_Sign",
    "Basic256Sha256_SignAndEncrypt",
    "Aes128Sha256RsaOaep_Sign",
    "Aes128Sha256RsaOaep_SignAndEncrypt",
    "Aes256Sha256RsaPss_Sign",
    "Aes256Sha256RsaPss_SignAndEncrypt",
]
# OPC UA built-in type -> (lowest, highest representable value, integer?)
DATA_TYPES: dict[str, tuple[float, float, bool]] = {
    "Double": (-math.inf, math.inf, False),
    "Float": (-3.4028234663852886e38, 3.4028234663852886e38, False),
    "Boolean": (0, 1, True),
    "SByte": (-(2**7), 2**7 - 1, True),
    "Byte": (0, 2**8 - 1, True),
    "Int16": (-(2**15), 2**15 - 1, True),
    "UInt16": (0, 2**16 - 1, True),
    "Int32": (-(2**31), 2**31 - 1, True),
    "UInt32": (0, 2**32 - 1, True),
    "Int64": (-(2**63), 2**63 - 1, True),
    "UInt64": (0, 2**64 - 1, True),
}
DataType = Literal[
    "Double", "Float", "Boolean", "SByte", "Byte", "Int16", "UInt16", "Int32", "UInt32", "Int64", "UInt64"
]

# Unit string (as in plant specs) -> UN/ECE Recommendation 20 common code, checked against the
# OPC Foundation's UNECE_to_OPCUA.csv (P1 "percent" is Rec. 20 but not in that file).
# Litre units are also matched with a lower-case "l".
UNECE_CODES: dict[str, tuple[str, str]] = {
    "g/L": ("GL", "gram per litre"), "mg/L": ("M1", "milligram per litre"),
    "kg/L": ("B35", "kilogram per litre"), "mol/L": ("C38", "mole per litre"),
    "mmol/L": ("M33", "millimole per litre"), "L": ("LTR", "litre"), "mL": ("MLT", "millilitre"),
    "L/h": ("E92", "litre per hour (cubic decimetre per hour)"), "L/min": ("L2", "litre per minute"),
    "L/s": ("G51", "litre per second"), "mL/h": ("G55", "millilitre per hour"),
    "mL/min": ("41", "millilitre per minute"), "m3": ("MTQ", "cubic metre"),
    "m3/h": ("MQH", "cubic metre per hour"), "m3/s": ("MQS", "cubic metre per second"),
    "%": ("P1", "percent"), "1": ("C62", "one"), "pH": ("Q30", "pH (potential of Hydrogen)"),
    "K": ("KEL", "kelvin"), "degC": ("CEL", "degree Celsius"), "°C": ("CEL", "degree Celsius"),
    "s": ("SEC", "second"), "ms": ("C26", "millisecond"), "min": ("MIN", "minute"), "h": ("HUR", "hour"),
    "1/s": ("C97", "reciprocal second"), "1/min": ("C94", "reciprocal minute"),
    "1/h": ("H10", "reciprocal hour"), "Hz": ("HTZ", "hertz"),
    "W": ("WTT", "watt"), "kW": ("KWT", "kilowatt"), "MW": ("MAW", "megawatt"),
    "J": ("JOU", "joule"), "kJ": ("KJO", "kilojoule"), "kWh": ("KWH", "kilowatt hour"),
    "Pa": ("PAL", "pascal"), "kPa": ("KPA", "kilopascal"), "MPa": ("MPA", "megapascal"),
    "bar": ("BAR", "bar"), "mbar": ("MBR", "millibar"),
    "m": ("MTR", "metre"), "mm": ("MMT", "millimetre"), "m/s": ("MTS", "metre per second"),
    "m/s2": ("MSK", "metre per second squared"), "kg": ("KGM", "kilogram"), "g": ("GRM", "gram"),
    "kg/h": ("E93", "kilogram per hour"), "kg/s": ("KGS", "kilogram per second"),
    "g/h": ("F27", "gram per hour"), "N": ("NEW", "newton"), "N*m": ("NU", "newton metre"),
    "N·m": ("NU", "newton metre"), "rad": ("C81", "radian"), "rad/s": ("2A", "radian per second"),
    "deg": ("DD", "degree"), "rpm": ("RPM", "revolutions per minute"),
    "V": ("VLT", "volt"), "kV": ("KVT", "kilovolt"), "A": ("AMP", "ampere"),
    "mol": ("C34", "mole"), "W/m2": ("D54", "watt per square metre"),
}
for _unit, _entry in list(UNECE_CODES.items()):
    if "L" in _unit:
        UNECE_CODES.setdefault(_unit.replace("L", "l"), _entry)
UNECE_NAMESPACE = "http://www.opcfoundation.org/UA/units/un/cefact"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_BROWSE_NAME = re.compile(r"[^\x00-\x1f/:]+")


def unece_unit_id(code: str) -> int:
    """EUInformation.UnitId of a UN/ECE common code (OPC 10000-8 5.6.3: one byte per char)."""
    uid = 0
    for ch in code.strip().upper():
        uid = (uid << 8) | ord(ch)
    return uid


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OpcuaSecurity(StrictModel):
    allow_none: bool | None = Field(
        default=None, description="SecurityPolicy None endpoint; default: only on a loopback host"
    )
    policies: tuple[Policy, ...] = ("Basic256Sha256_Sign", "Basic256Sha256_SignAndEncrypt")
    certificate: str = Field(default="certs/server_cert.der", description="DER or PEM")
    private_key: str = Field(default="certs/server_key.pem", description="PEM or DER, unencrypted")
    generate_missing: bool = Field(default=True, description="create missing cert/key like `hil certs`")
    trusted_clients_dir: str | None = Field(
        default=None, description="directory of trusted client certificates (DER/PEM); None: any"
    )
    allow_anonymous: bool | None = Field(
        default=None, description="anonymous sessions; default: true only when no users are configured"
    )
    insecure: bool = Field(
        default=False, description="allow a non-loopback host without users and trusted client certificates"
    )


class OpcuaNode(StrictModel):
    """Overrides for one signal's node."""

    signal: str
    browse_name: str | None = Field(default=None, description="always derived from the signal name; use display_name")
    display_name: str | None = Field(default=None, description="DisplayName (default: the signal name)")
    data_type: DataType = "Double"
    writable: bool | None = Field(default=None, description="actuators: default true; sensors: false")
    eu_range: tuple[float, float] | None = Field(default=None, description="[low, high], plant unit")
    unit: str | None = Field(default=None, description="EngineeringUnits display name")
    unece_code: str | None = Field(default=None, description="UN/ECE Rec. 20 common code")
    description: str | None = None
    enabled: bool = True

    @field_validator("display_name")
    @classmethod
    def _display_name(cls, v):
        if v is not None and (not _BROWSE_NAME.fullmatch(v) or v != v.strip()):
            raise ValueError(f"{v!r} is not a display name (no '/', ':', control characters or edge spaces)")
        return v

    @field_validator("unece_code")
    @classmethod
    def _code(cls, v):
        if v is not None and not re.fullmatch(r"[A-Z0-9]{1,3}", v):
            raise ValueError(f"{v!r} is not a UN/ECE common code (1-3 of A-Z, 0-9)")
        return v

    @field_validator("eu_range")
    @classmethod
    def _range(cls, v):
        if v is not None and not (math.isfinite(v[0]) and math.isfinite(v[1]) and v[0] < v[1]):
            raise ValueError(f"{list(v)} is not a finite [low, high] with low < high")
        return v


class OpcuaFolder(StrictModel):
    """An array group served as a folder of variables, one per element (hil/tagmap/blocks.py)."""

    group: str = Field(description="array group of plant outputs or inputs, e.g. 'bus.vm'")
    name: str | None = Field(default=None, description="folder browse name (default: the group name)")
    data_type: DataType = "Double"
    writable: bool | None = Field(default=None, description="input groups: actuators writable (default true)")
    enabled: bool = True

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if v is not None and (not _BROWSE_NAME.fullmatch(v) or v != v.strip()):
            raise ValueError(f"{v!r} is not a browse name (no '/', ':', control characters or edge spaces)")
        return v


class OpcuaSection(StrictModel):
    enabled: bool = True
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=4840, ge=1, le=65535)
    endpoint_path: str = "/hil"
    application_uri: str = Field(default=SERVER_APPLICATION_URI, min_length=1)
    namespace_uri: str | None = None
    server_name: str = "hil OPC UA server"
    min_publishing_interval_ms: float = Field(default=10.0, ge=1.0, le=60_000.0)
    min_sampling_interval_ms: float = Field(default=1.0, ge=0.5, le=1_000.0)
    max_connections: int = Field(
        default=32, ge=1, le=10_000,
        description="simultaneous TCP connections; more are closed at once and counted as refused")
    idle_timeout_s: float = Field(
        default=300.0, ge=0.0, le=86_400.0,
        description="close a connection silent this long, s (also caps the session timeout); 0 = never")
    security: OpcuaSecurity = Field(default_factory=OpcuaSecurity)
    users: dict[str, str] = Field(default_factory=dict)
    nodes: tuple[OpcuaNode, ...] = ()
    folders: tuple[OpcuaFolder, ...] = ()

    @field_validator("endpoint_path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/") or any(c.isspace() for c in v):
            raise ValueError(f"{v!r}: an endpoint path starts with '/' and has no spaces")
        return v

    @field_validator("users")
    @classmethod
    def _users(cls, v: dict[str, str]) -> dict[str, str]:
        for name, stored in v.items():
            if not _NAME.fullmatch(name):
                raise ValueError(f"user {name!r}: a user name is letters, digits, _ . -")
            if not stored:
                raise ValueError(f"user {name!r}: empty password")
            if is_password_hash(stored):
                try:
                    parse_password_hash(stored)
                except ValueError as exc:
                    raise ValueError(f"user {name!r}: {exc}") from None
        return v

    # ---- derived settings ----
    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def none_allowed(self) -> bool:
        s = self.security.allow_none
        return self.loopback if s is None else s

    @property
    def anonymous_allowed(self) -> bool:
        s = self.security.allow_anonymous
        return (not self.users) if s is None else s

    def endpoint_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"opc.tcp://{host}:{self.port}{self.endpoint_path}"

    def namespace(self, scenario_name: str) -> str:
        return self.namespace_uri or f"urn:hil:{scenario_name}"

    def validate_against(self, spec, scenario) -> list[tuple[str, str]]:
        """Checks that need the plant spec; (key_path, reason) pairs, empty if valid."""
        problems: list[tuple[str, str]] = []
        sec = self.security
        if not self.none_allowed and not sec.policies:
            problems.append(("opcua.security.policies", "no endpoint left: allow_none is off and no policy is listed"))
        if len(set(sec.policies)) != len(sec.policies):
            problems.append(("opcua.security.policies", "a policy is listed twice"))
        if self.users and not sec.policies:
            problems.append(("opcua.security.policies", "users need a signed/encrypted policy to protect passwords"))
        if not self.users and self.security.allow_anonymous is False:
            problems.append(("opcua.security.allow_anonymous", "false with no [opcua.users]: nobody could connect"))
        problems += self.exposure_problems()
        resolve_nodes(self, spec, scenario, problems)
        return problems

    def exposure_problems(self) -> list[tuple[str, str]]:
        """Why this section may not serve its host: off loopback, anyone who can reach the port
        could write actuators unless users are configured and client certificates are trusted
        explicitly (or `security.insecure` says the operator accepts that)."""
        if self.loopback or self.security.insecure:
            return []
        where = f"host {self.host!r} is not a loopback address"
        out = []
        if not self.users:
            out.append(("opcua.users", f"{where}: configure [opcua.users] (anonymous sessions could "
                        "write actuators), or set opcua.security.insecure = true"))
        if not self.security.trusted_clients_dir:
            out.append(("opcua.security.trusted_clients_dir", f"{where}: name a directory of trusted "
                        "client certificates (any client certificate would be accepted), or set "
                        "opcua.security.insecure = true"))
        return out


# ---------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class NodeInfo:
    """One variable of the address space, resolved against the spec (plant units).

    kind: "sensor" (index into outputs), "actuator" or "applied" (index into inputs).
    eu_low, eu_high: EURange and the accepted write range. unit_id: -1 if unmapped.
    browse_name is derived from the signal name (browse_name_of); display_name may differ.
    folder: the browse name of its [[opcua.folders]] folder ("" for none); node_id_path does
    not depend on it.
    """

    signal: str
    kind: str
    index: int
    browse_name: str
    display_name: str
    data_type: str
    writable: bool
    eu_low: float
    eu_high: float
    unit: str
    unece_code: str | None
    unit_id: int
    unit_description: str
    description: str
    folder: str = ""  # sub-folder of the kind's folder ([[opcua.folders]]), "" for none

    @property
    def path(self) -> str:
        """Node id path below the scenario, independent of folders: `Sensors.glucose`, `Sensors.node_3.temp`."""
        return f"{KIND_FOLDERS[self.kind]}.{self.signal}"

    @property
    def browse_path(self) -> str:
        """Browse path below Objects/<scenario>: `Sensors/glucose`, `Sensors/node_temp/node_3_temp`."""
        base = KIND_FOLDERS[self.kind]
        return f"{base}/{self.folder}/{self.browse_name}" if self.folder else f"{base}/{self.browse_name}"


KIND_FOLDERS = {"sensor": "Sensors", "actuator": "Actuators", "applied": "Applied"}
# Characters with a meaning in the text form of a RelativePath (OPC UA Part 4, A.2): escaped with
# '&' there; kept out of browse names so that paths are typed as they read.
RELATIVE_PATH_RESERVED = "/.<>:#!&"
_RESERVED = re.compile("[" + re.escape(RELATIVE_PATH_RESERVED) + "]")


def browse_name_of(name: str) -> str:
    """The browse name of a signal or folder name: reserved RelativePath characters -> '_'."""
    return _RESERVED.sub("_", name)


def folder_node_path(kind: str, folder: str) -> str:
    """Node id path of an [[opcua.folders]] folder: `Sensors/bus_vm` ('/' is in no signal name)."""
    return f"{KIND_FOLDERS[kind]}/{folder}"


def node_id_string(scenario_name: str, info: "NodeInfo") -> str:
    """The string identifier of a signal's NodeId (namespace: OpcuaSection.namespace(scenario))."""
    return f"{scenario_name}.{info.path}"


def _driver(scenario, name: str) -> str:
    inputs = getattr(scenario, "inputs", None) or {}
    inp = inputs.get(name)
    return "plc" if inp is None else inp.driver


def _unit_info(unit: str, code: str | None) -> tuple[str | None, int, str]:
    if code is not None:
        return code, unece_unit_id(code), UNECE_CODES.get(unit, (code, unit))[1]
    found = UNECE_CODES.get(unit)
    if found is None:
        return None, -1, unit
    return found[0], unece_unit_id(found[0]), found[1]


def _make(q, kind: str, index: int, o: OpcuaNode | None, writable: bool, lo: float, hi: float,
          folder: str = "", data_type: str = "Double") -> NodeInfo:
    unit = o.unit if o is not None and o.unit is not None else q.unit
    code, uid, udesc = _unit_info(unit, o.unece_code if o is not None else None)
    return NodeInfo(
        signal=q.name,
        kind=kind,
        index=index,
        browse_name=browse_name_of(q.name),
        display_name=(o.display_name if o is not None and o.display_name else q.name),
        data_type=o.data_type if o is not None and "data_type" in o.model_fields_set else data_type,
        writable=writable,
        eu_low=lo,
        eu_high=hi,
        unit=unit,
        unece_code=code,
        unit_id=uid,
        unit_description=udesc,
        description=(o.description if o is not None and o.description else q.description) or q.name,
        folder=folder,
    )


def _in_folder(f) -> tuple[str, str]:
    return ("", "Double") if f is None else (browse_name_of(f.name or f.group), f.data_type)


def resolve_nodes(section: OpcuaSection, spec, scenario, problems: list | None = None) -> tuple[NodeInfo, ...]:
    """The served variables in address-space order: sensors, actuators, applied.

    Problems (key path, reason) are appended to `problems` when given; without it the first
    problem raises hil.errors.ConfigError.
    """
    from hil.tagmap.blocks import folder_of

    own: list[tuple[str, str]] = []
    outputs, inputs = spec.names("outputs"), spec.names("inputs")
    folders = folder_of(section, spec, own)
    overrides: dict[str, tuple[int, OpcuaNode]] = {}
    for i, o in enumerate(section.nodes):
        path = f"opcua.nodes[{i}]"
        if o.signal not in outputs and o.signal not in inputs:
            own.append((f"{path}.signal", f"{spec.name} has no output or input {o.signal!r} "
                        f"(outputs: {', '.join(outputs)}; inputs: {', '.join(inputs)})"))
            continue
        if o.signal in overrides:
            own.append((f"{path}.signal", f"{o.signal!r} already has an entry (opcua.nodes[{overrides[o.signal][0]}])"))
            continue
        overrides[o.signal] = (i, o)
        if o.browse_name is not None and o.browse_name != o.signal:
            own.append((f"{path}.browse_name", f"the browse name is derived from the signal name {o.signal!r} "
                        f"({browse_name_of(o.signal)!r}: one name in browse path and node id); for a different "
                        f"label use display_name = {o.browse_name!r}"))
        is_sensor = o.signal in outputs
        q = spec.quantity("outputs" if is_sensor else "inputs", o.signal)
        if is_sensor and o.writable:
            own.append((f"{path}.writable", f"{o.signal!r} is a plant output (sensor): sensors are read-only"))
        if not is_sensor and _driver(scenario, o.signal) != "plc":
            own.append((f"{path}.signal", f"input {o.signal!r} is driven by "
                        f"{_driver(scenario, o.signal)!r} (inputs.{o.signal}.driver): only driver = 'plc' "
                        "inputs are OPC UA actuators; its applied value is served under Applied/"))
        if o.eu_range is not None:
            lo, hi = o.eu_range
            if lo < q.low or hi > q.high:
                own.append((f"{path}.eu_range", f"[{lo}, {hi}] {q.unit} is outside the physical bounds "
                            f"[{q.low}, {q.high}] {q.unit} of {o.signal!r}"))
        lo, hi = o.eu_range or (q.low, q.high)
        tlo, thi, _ = DATA_TYPES[o.data_type]
        if o.data_type != "Boolean" and (lo < tlo or hi > thi):
            own.append((f"{path}.data_type", f"{o.data_type} cannot hold the range [{lo}, {hi}] {q.unit}"))
    for name, (j, f) in folders.items():
        q = spec.quantity("outputs" if name in outputs else "inputs", name)
        tlo, thi, _ = DATA_TYPES[f.data_type]
        if name not in overrides and f.data_type != "Boolean" and (q.low < tlo or q.high > thi):
            own.append((f"opcua.folders[{j}].data_type",
                        f"{f.data_type} cannot hold the range [{q.low}, {q.high}] {q.unit} of {name!r}"))
        if f.writable and name in outputs:
            own.append((f"opcua.folders[{j}].writable", f"{f.group!r} are plant outputs (sensors): read-only"))
    nodes: list[NodeInfo] = []
    for kind, names in (("sensor", outputs), ("actuator", inputs)):
        for idx, name in enumerate(names):
            _, o = overrides.get(name, (None, None))
            _, f = folders.get(name, (None, None))
            if (o is not None and not o.enabled) or (f is not None and not f.enabled):
                continue
            if kind == "actuator" and _driver(scenario, name) != "plc":
                continue
            q = spec.quantity("outputs" if kind == "sensor" else "inputs", name)
            lo, hi = (o.eu_range if o is not None and o.eu_range else (q.low, q.high))
            writable = kind == "actuator" and (o is None or o.writable is not False) and \
                (f is None or f.writable is not False)
            nodes.append(_make(q, kind, idx, o, writable, lo, hi, *_in_folder(f)))
    for idx, name in enumerate(inputs):
        q = spec.quantity("inputs", name)
        _, f = folders.get(name, (None, None))
        if f is not None and not f.enabled:
            continue
        nodes.append(_make(q, "applied", idx, None, False, q.low, q.high, *_in_folder(f)))
    seen: dict[tuple[str, str, str], str] = {}
    for n in nodes:
        key = (n.kind, n.folder, n.browse_name)
        if key in seen:
            own.append(("opcua", f"signals {seen[key]!r} and {n.signal!r} would share the browse name "
                        f"{n.browse_name!r} in {n.browse_path.rpartition('/')[0]} (reserved characters "
                        f"{RELATIVE_PATH_RESERVED} become '_'): rename one, or serve one in a folder"))
        seen.setdefault(key, n.signal)
    if problems is not None:
        problems.extend(own)
    elif own:
        from hil.errors import ConfigError

        raise ConfigError("", problems=own)
    return tuple(nodes)
