"""The OPC UA address space of one scenario and its link to the process image (asyncua 2.1).

    Objects/<scenario>/Sensors/<signal>     plant outputs as measured, read-only
    Objects/<scenario>/Actuators/<signal>   inputs driven by "plc": the commanded value, writable
    Objects/<scenario>/Applied/<signal>     every input as applied to the plant, read-only
    Objects/<scenario>/Status/{Step, SimTime, LoopState, AcceptedWrites, RejectedWrites}

Signal variables are AnalogItemType instances (Boolean ones BaseDataVariableType) with
DataType, Description (with the unit), AccessLevel = CurrentRead (+ CurrentWrite for
writable actuators), MinimumSamplingInterval, and the properties EURange (Range, plant
units) and EngineeringUnits (EUInformation: UN/ECE code when the unit is known, else
UnitId -1 with the unit as display name). NodeIds are strings in the scenario's namespace:
"<scenario>" (the folder), "<scenario>.Sensors", "<scenario>.Sensors.<signal>",
"<scenario>.Actuators.<signal>", "<scenario>.Status.Step"...

Values: `refresh()` copies what changed in the image into the nodes, with SourceTimestamp =
wall-clock time of the loop's publish (actuators: of the last input write) and quality
BadWaitingForInitialData before the first publish, BadSensorFailure for a non-finite
measurement (sensor dropout), UncertainLastUsableValue once the loop has stopped or
failed. Reads and new monitored items refresh everything first; the poll task refreshes
the monitored nodes every loop period clamped to [min_sampling_interval_ms, 10 ms].
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from datetime import datetime, timezone

import numpy as np
from asyncua import Server, ua

from adapters.opcua_writes import WriteGuard
from hil.image import H_IN_SEQ, H_IN_WRITE_NS, H_IN_WRITES, ProcessImage
from hil.tagmap.opcua import UNECE_NAMESPACE, NodeInfo, OpcuaSection, resolve_nodes

log = logging.getLogger("hil.opcua")
FOLDERS = {"sensor": "Sensors", "actuator": "Actuators", "applied": "Applied"}
MAX_POLL_S = 0.010
S = ua.StatusCodes


def _wall_dt(mono_ns: int) -> datetime:
    """Wall-clock datetime (UTC) of a time.monotonic_ns() stamp (CLOCK_MONOTONIC is system-wide)."""
    wall_ns = mono_ns + (time.time_ns() - time.monotonic_ns())
    return datetime.fromtimestamp(wall_ns / 1e9, tz=timezone.utc)


def _served(info: NodeInfo, x: float):
    """Plant value -> the Python value of the node's DataType."""
    if info.data_type in ("Double", "Float"):
        return float(x)
    if info.data_type == "Boolean":
        return bool(x >= 0.5 * (info.eu_low + info.eu_high))
    return int(round(x))


def read_commands(image: ProcessImage, dst: np.ndarray, max_tries: int = 64) -> bool:
    """Consistent copy of the commanded inputs, without touching the loop's counters."""
    h = image.header
    for _ in range(max_tries):
        s0 = int(h[H_IN_SEQ])
        if s0 & 1:
            continue
        np.copyto(dst, image.inputs)
        if int(h[H_IN_SEQ]) == s0:
            return True
    return False


class OpcuaAdapter:
    """The address space of one scenario and its link to the process image."""

    def __init__(self, section: OpcuaSection, spec, scenario, image: ProcessImage, period_s: float):
        if image.n_inputs != spec.n_inputs or image.n_outputs != spec.n_outputs:
            raise ValueError(
                f"process image {image.name} has {image.n_inputs} inputs / {image.n_outputs} outputs, "
                f"{spec.name} has {spec.n_inputs} / {spec.n_outputs}"
            )
        self.section = section
        self.spec = spec
        self.name = scenario.name
        self.image = image
        self.nodes = resolve_nodes(section, spec, scenario)
        self.poll_s = min(max(period_s, section.min_sampling_interval_ms / 1000.0), MAX_POLL_S)
        self.ns_index = -1
        self.server: Server | None = None
        self.nodes_by_id: dict[ua.NodeId, NodeInfo] = {}
        self.own_node_ids: set[ua.NodeId] = set()
        self.guard = WriteGuard(self)
        self._ids: dict[tuple[str, int], ua.NodeId] = {}
        self._last: dict[ua.NodeId, tuple] = {}
        self._cmd = np.zeros(spec.n_inputs)
        self._seen: dict[bool, tuple | None] = {False: None, True: None}
        self._signal_ids: list[tuple[NodeInfo, ua.NodeId]] = []
        self._values: dict = {}  # NodeId -> asyncua AttributeValue of its Value attribute
        self._status: dict[str, ua.NodeId] = {}
        self._lock = asyncio.Lock()

    # ---- address space ----
    def _nid(self, path: str) -> ua.NodeId:
        nid = ua.NodeId(f"{self.name}.{path}", self.ns_index)
        self.own_node_ids.add(nid)
        return nid

    async def build(self, server: Server) -> None:
        self.server = server
        self.ns_index = await server.register_namespace(self.section.namespace(self.name))
        idx = self.ns_index
        objects = server.nodes.objects
        root_id = ua.NodeId(self.name, idx)
        self.own_node_ids.add(root_id)
        root = await objects.add_folder(root_id, ua.QualifiedName(self.name, idx))
        folders = {}
        for kind, fname in (*FOLDERS.items(), ("status", "Status")):
            folders[kind] = await root.add_folder(self._nid(fname), ua.QualifiedName(fname, idx))
        items: list[ua.AddNodesItem] = []
        for info in self.nodes:
            nid = self._nid(f"{FOLDERS[info.kind]}.{info.signal}")
            self.nodes_by_id[nid] = info
            self._ids[(info.kind, info.index)] = nid
            items += self._variable_items(info, nid, folders[info.kind].nodeid)
        for bname, vtype, desc in (
            ("Step", ua.VariantType.UInt64, "loop step index of the published outputs"),
            ("SimTime", ua.VariantType.Double, "simulated time of the published outputs, s"),
            ("LoopState", ua.VariantType.String, "configured | running | stopped | failed"),
            ("AcceptedWrites", ua.VariantType.UInt64, "client writes accepted by this server"),
            ("RejectedWrites", ua.VariantType.UInt64, "client writes refused by this server"),
        ):
            nid = self._nid(f"Status.{bname}")
            self._status[bname] = nid
            items.append(_item(nid, folders["status"].nodeid, ua.QualifiedName(bname, idx),
                               _attrs(bname, desc, vtype, False, self.section.min_sampling_interval_ms),
                               ua.ObjectIds.HasComponent, ua.ObjectIds.BaseDataVariableType))
        for res in await server.iserver.isession.add_nodes(items):
            res.StatusCode.check()
        aspace = server.iserver.aspace
        for nid in [*self.nodes_by_id, *self._status.values()]:
            self._values[nid] = aspace[nid].attributes[ua.AttributeIds.Value]
        self._signal_ids = [(info, nid) for nid, info in self.nodes_by_id.items()]
        await self.refresh(force=True)

    def _variable_items(self, info: NodeInfo, nid: ua.NodeId, parent: ua.NodeId) -> list[ua.AddNodesItem]:
        vtype = getattr(ua.VariantType, info.data_type)
        desc = f"{info.description} [{info.unit}]"
        analog = info.data_type != "Boolean"
        attrs = _attrs(info.browse_name, desc, vtype, info.writable, self.section.min_sampling_interval_ms)
        tdef = ua.ObjectIds.AnalogItemType if analog else ua.ObjectIds.BaseDataVariableType
        items = [_item(nid, parent, ua.QualifiedName(info.browse_name, self.ns_index), attrs,
                       ua.ObjectIds.HasComponent, tdef)]
        eu = ua.EUInformation(
            NamespaceUri=UNECE_NAMESPACE,
            UnitId=info.unit_id,
            DisplayName=ua.LocalizedText(info.unit),
            Description=ua.LocalizedText(info.unit_description),
        )
        props = [("EngineeringUnits", ua.Variant(eu, ua.VariantType.ExtensionObject), ua.ObjectIds.EUInformation)]
        if analog:
            rng = ua.Range(Low=float(info.eu_low), High=float(info.eu_high))
            props.insert(0, ("EURange", ua.Variant(rng, ua.VariantType.ExtensionObject), ua.ObjectIds.Range))
        for pname, value, dtype in props:
            pid = self._nid(f"{FOLDERS[info.kind]}.{info.signal}.{pname}")
            a = ua.VariableAttributes()
            a.DisplayName = ua.LocalizedText(pname)
            a.Description = ua.LocalizedText(pname)
            a.DataType = ua.NodeId(dtype)
            a.Value = value
            a.ValueRank = ua.ValueRank.Scalar
            a.AccessLevel = a.UserAccessLevel = ua.AccessLevel.CurrentRead.mask
            items.append(_item(pid, nid, ua.QualifiedName(pname, 0), a, ua.ObjectIds.HasProperty,
                               ua.ObjectIds.PropertyType))
        return items

    # ---- values ----
    async def _set(self, nid: ua.NodeId, key: tuple, dv: ua.DataValue) -> None:
        if self._last.get(nid) == key:
            return
        self._last[nid] = key
        await self.server.iserver.aspace.write_attribute_value(nid, ua.AttributeIds.Value, dv)

    async def _set_signal(self, info: NodeInfo, nid: ua.NodeId, x: float, src: datetime, now: datetime,
                          quality: int) -> None:
        if not math.isfinite(x):
            code = S.BadWaitingForInitialData if quality == S.BadWaitingForInitialData else S.BadSensorFailure
            await self._set(nid, ("bad", code), ua.DataValue(ua.Variant(), ua.StatusCode(code), src, now))
            return
        v = _served(info, x)
        vt = getattr(ua.VariantType, info.data_type)
        await self._set(nid, (v, quality), ua.DataValue(ua.Variant(v, vt), ua.StatusCode(quality), src, now))

    def _skip(self, nid: ua.NodeId, monitored_only: bool) -> bool:
        """In a monitored-only refresh, nodes nobody subscribed to wait for the next read."""
        return monitored_only and not self._values[nid].datachange_callbacks

    async def refresh(self, force: bool = False, monitored_only: bool = False) -> None:
        """Copy what changed in the image into the nodes (cheap when nothing did).

        Reads and new monitored items run a full refresh; the poll task a monitored-only one
        (asyncua runs a subscription's data-change callbacks on every node write, so nodes
        that nobody watches are left to the next read).
        """
        async with self._lock:
            img = self.image
            snap = img.snapshot()
            state = img.loop_state
            writes = int(img.header[H_IN_WRITES])
            counts = (self.guard.accepted_total, self.guard.rejected_total)
            seen = (snap.publish_ns, writes, state, counts)
            prev = self._seen[monitored_only]
            if force:
                self._last.clear()
                prev = None
            elif seen == prev:
                return
            now = datetime.now(timezone.utc)
            never = snap.publish_ns == 0
            if prev is None or prev[0] != snap.publish_ns or prev[2] != state:
                quality = S.BadWaitingForInitialData if never else (
                    S.UncertainLastUsableValue if state in ("stopped", "failed") else S.Good)
                src = now if never else _wall_dt(snap.publish_ns)
                for info, nid in self._signal_ids:
                    if info.kind == "actuator" or self._skip(nid, monitored_only):
                        continue
                    x = math.nan if never else (snap.outputs if info.kind == "sensor" else snap.applied)[info.index]
                    await self._set_signal(info, nid, float(x), src, now, quality)
                for bname, key, variant, ts in (
                    ("Step", (snap.step,), ua.Variant(snap.step, ua.VariantType.UInt64), src),
                    ("SimTime", (snap.sim_time_s,), ua.Variant(snap.sim_time_s, ua.VariantType.Double), src),
                    ("LoopState", (state,), ua.Variant(state, ua.VariantType.String), now),
                ):
                    nid = self._status[bname]
                    if not self._skip(nid, monitored_only):
                        await self._set(nid, key, ua.DataValue(variant, ua.StatusCode(S.Good), ts, now))
            if prev is None or prev[1] != writes:
                if read_commands(img, self._cmd):
                    wns = int(img.header[H_IN_WRITE_NS])
                    src = _wall_dt(wns) if wns else now
                    for info, nid in self._signal_ids:
                        if info.kind == "actuator" and not self._skip(nid, monitored_only):
                            await self._set_signal(info, nid, float(self._cmd[info.index]), src, now, S.Good)
                else:  # a writer kept the inputs torn: try again next time
                    seen = (seen[0], -1, seen[2], seen[3])
            for bname, n in zip(("AcceptedWrites", "RejectedWrites"), counts):
                nid = self._status[bname]
                if not self._skip(nid, monitored_only):
                    await self._set(nid, (n,), ua.DataValue(ua.Variant(n, ua.VariantType.UInt64),
                                                            ua.StatusCode(S.Good), now, now))
            self._seen[monitored_only] = seen
            if not monitored_only:
                self._seen[True] = seen

    async def apply_commands(self, commands: list[tuple[NodeInfo, float]]) -> None:
        """Put validated client writes into the image (one atomic write), then into the nodes."""
        self.image.write_inputs([info.index for info, _ in commands], [v for _, v in commands])
        now = datetime.now(timezone.utc)
        async with self._lock:
            for info, v in commands:
                self._cmd[info.index] = v
                await self._set_signal(info, self._ids[(info.kind, info.index)], v, now, now, S.Good)

    async def poll(self, stop: asyncio.Event) -> None:
        """Refresh the monitored nodes every `poll_s` on absolute deadlines (missed ones are
        skipped, never burst); with no monitored node, only wake every 10 ms to check `stop`."""
        next_t = time.monotonic()
        while not stop.is_set():
            watched = any(v.datachange_callbacks for v in self._values.values())
            if watched:
                try:
                    await self.refresh(monitored_only=True)
                except TimeoutError:
                    log.error("process image outputs stay torn; is the loop alive?")
            period = self.poll_s if watched else MAX_POLL_S
            next_t += period
            now = time.monotonic()
            if next_t < now:
                next_t = now + period - ((now - next_t) % period)
            await asyncio.sleep(next_t - now)

    def counters(self) -> dict:
        return self.guard.counters()


def _attrs(name: str, desc: str, vtype, writable: bool, sampling_ms: float) -> ua.VariableAttributes:
    a = ua.VariableAttributes()
    a.DisplayName = ua.LocalizedText(name)
    a.Description = ua.LocalizedText(desc)
    a.DataType = ua.NodeId(int(vtype))
    a.Value = ua.Variant()
    a.ValueRank = ua.ValueRank.Scalar
    mask = ua.AccessLevel.CurrentRead.mask | (ua.AccessLevel.CurrentWrite.mask if writable else 0)
    a.AccessLevel = a.UserAccessLevel = mask
    a.MinimumSamplingInterval = float(sampling_ms)
    a.Historizing = False
    a.WriteMask = a.UserWriteMask = 0
    return a


def _item(nid, parent, qname, attrs, reftype: int, typedef: int) -> ua.AddNodesItem:
    item = ua.AddNodesItem()
    item.RequestedNewNodeId = nid
    item.BrowseName = qname
    item.NodeClass = ua.NodeClass.Variable
    item.ParentNodeId = parent
    item.ReferenceTypeId = ua.NodeId(reftype)
    item.TypeDefinition = ua.NodeId(typedef)
    item.NodeAttributes = attrs
    return item
