"""A scenario's tags as a SCADA engineer imports them: the Modbus register map and the OPC UA
node list, one row per tag (`hil tags SCENARIO --format csv|json`).

Columns (every row; a column that does not apply to the protocol is empty in CSV, null in JSON):

    protocol      modbus | opcua
    signal        the plant signal (spec name)
    kind          sensor (plant output) | actuator (commanded input) | applied (input as applied)
    unit          plant unit of the value (after scale/offset for Modbus)
    low, high     range of the value in that unit: Modbus the view's engineering range (writes
                  outside it are refused), OPC UA the EURange
    writable      true when a client may write the tag
    table         Modbus table: coil | discrete_input | input_register | holding_register
    address       Modbus PDU address, 0-based (mbpoll -0; tools counting from 1 show address + 1)
    registers     Modbus registers the value occupies (bits: 1)
    type          Modbus encoding (uint16 int16 uint32 int32 float32 float64 bool) or OPC UA DataType
    word_order    Modbus multi-register values: big = most significant register first
    byte_order    Modbus: big = high byte first within each register (the Modbus standard)
    layout        Modbus byte layout of a multi-register value as the usual letters: ABCD (big/big,
                  float32 "big-endian"), CDAB (little word order, "word swapped"), BADC, DCBA
    scale, offset Modbus: raw = (value - offset) * scale, value = raw / scale + offset
    node_id       OPC UA NodeId, namespace by URI: `nsu=<namespace uri>;s=<scenario>.<Kind>.<signal>`
                  (stable whatever the folder layout); clients resolve the index at connect time
    browse_path   OPC UA browse path below Objects, browse names without escapes
    display_name  OPC UA DisplayName
    ioa           IEC 104 information object address (of the station at header iec104.common_address)
    deadband      IEC 104 monitor objects: absolute deadband of spontaneous transmission (plant unit)
    off_signal    IEC 104 double commands: the input written on OFF (`signal` is written on ON)

IEC 104 rows: `type` is the type identification (M_ME_TF_1, M_DP_TB_1, C_SE_NC_1, C_SC_TA_1,
C_DC_TA_1), `kind` sensor (monitor object) or actuator (command object), `low`/`high` the
signal's physical bounds (set-points outside are refused with a negative confirmation).
"""

from __future__ import annotations

import csv
import io

COLUMNS = ("protocol", "signal", "kind", "unit", "low", "high", "writable", "table", "address", "registers", "type",
           "word_order", "byte_order", "layout", "scale", "offset", "node_id", "browse_path", "display_name", "ioa",
           "deadband", "off_signal")
_LAYOUT = {("big", "big"): "ABCD", ("little", "big"): "CDAB", ("big", "little"): "BADC", ("little", "little"): "DCBA"}


def _row(**kw) -> dict:
    return {c: kw.get(c) for c in COLUMNS}


def modbus_rows(scenario, spec) -> list[dict]:
    """One row per compiled Modbus tag, in table then address order."""
    from hil.tagmap.modbus import TABLES, compile_map

    if scenario.modbus is None:
        return []
    cmap = compile_map(scenario.modbus, spec, scenario)
    rows = []
    for t in sorted(cmap.tags, key=lambda t: (TABLES.index(t.table), t.address)):
        q = spec.quantity(t.kind + "s", t.signal)
        multi = t.n_words > 1
        rows.append(_row(
            protocol="modbus", signal=t.signal,
            kind="sensor" if t.kind == "output" else ("applied" if t.source == "applied" else "actuator"),
            unit=q.unit, low=t.low, high=t.high, writable=t.writable, table=t.table, address=t.address,
            registers=t.n_words, type=t.encoding,
            word_order=t.word_order if multi else None,
            byte_order=t.byte_order if t.encoding != "bool" else None,
            layout=_LAYOUT[(t.word_order, t.byte_order)] if multi else ("AB" if t.byte_order == "big" else "BA")
            if t.encoding != "bool" else None,
            scale=t.scale if t.encoding != "bool" else None, offset=t.offset if t.encoding != "bool" else None))
    return rows


def opcua_rows(scenario, spec) -> list[dict]:
    """One row per served OPC UA signal variable (address-space order), plus the Status nodes."""
    from hil.tagmap.opcua import node_id_string, resolve_nodes

    section = scenario.opcua
    if section is None:
        return []
    ns = section.namespace(scenario.name)
    rows = []
    for n in resolve_nodes(section, spec, scenario):
        rows.append(_row(
            protocol="opcua", signal=n.signal, kind=n.kind, unit=n.unit, low=n.eu_low, high=n.eu_high,
            writable=n.writable, type=n.data_type, node_id=f"nsu={ns};s={node_id_string(scenario.name, n)}",
            browse_path=f"{scenario.name}/{n.browse_path}", display_name=n.display_name))
    for name, dtype in (("Step", "UInt64"), ("SimTime", "Double"), ("LoopState", "String"),
                        ("AcceptedWrites", "UInt64"), ("RejectedWrites", "UInt64")):
        rows.append(_row(protocol="opcua", signal=f"Status.{name}", kind="status",
                         unit="s" if name == "SimTime" else None, writable=False, type=dtype,
                         node_id=f"nsu={ns};s={scenario.name}.Status.{name}",
                         browse_path=f"{scenario.name}/Status/{name}", display_name=name))
    return rows


def iec104_rows(scenario, spec) -> list[dict]:
    """One row per IEC 104 information object (the map's, or the automatic layout), in IOA order."""
    from hil.tagmap.iec104 import compile_points

    if scenario.iec104 is None:
        return []
    rows = []
    for p in compile_points(scenario.iec104, spec, scenario):
        rows.append(_row(protocol="iec104", signal=p.signal, kind="actuator" if p.is_command else "sensor",
                         unit=p.unit, low=p.low, high=p.high, writable=p.is_command, type=p.type_id, ioa=p.ioa,
                         deadband=None if p.is_command else p.deadband, off_signal=p.off_signal))
    return rows


PROTOCOLS = ("modbus", "opcua", "iec104")


def tag_rows(scenario, spec, protocols: tuple[str, ...] = PROTOCOLS) -> list[dict]:
    rows = []
    if "modbus" in protocols:
        rows += modbus_rows(scenario, spec)
    if "opcua" in protocols:
        rows += opcua_rows(scenario, spec)
    if "iec104" in protocols:
        rows += iec104_rows(scenario, spec)
    return rows


def header(scenario) -> dict:
    """What applies to every row: endpoints, unit id, namespace, the float word order."""
    out = {"scenario": scenario.name}
    if scenario.modbus is not None:
        m = scenario.modbus
        out["modbus"] = {"host": m.host, "port": m.port, "unit_id": m.unit_id, "addresses": "0-based PDU addresses",
                         "float_word_order": "per tag (word_order, layout); default big: most significant "
                                            "register first (ABCD)"}
    if scenario.opcua is not None:
        o = scenario.opcua
        out["opcua"] = {"endpoint": o.endpoint_url(), "namespace_uri": o.namespace(scenario.name)}
    if scenario.iec104 is not None:
        i = scenario.iec104
        out["iec104"] = {"host": i.host, "port": i.port, "common_address": i.common_address,
                         "command_mode": i.command_mode, "select_timeout_ms": i.select_timeout_ms,
                         "time_tags": "CP56Time2a, UTC wall time of the image publish in which the value last changed",
                         "layout": "map" if i.points else "auto"}
    return out


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else str(v).lower() if isinstance(v, bool) else repr(v)
                        if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()
