"""The OPC UA address space of one scenario and its link to the process image (asyncua 2.1).

    Objects/<scenario>/Sensors/<signal>     plant outputs as measured, read-only
    Objects/<scenario>/Actuators/<signal>   inputs driven by "plc": the commanded value, writable
    Objects/<scenario>/Applied/<signal>     every input as applied to the plant, read-only
    Objects/<scenario>/Status/{Step, SimTime, LoopState, AcceptedWrites, RejectedWrites}

Signal variables are AnalogItemType instances (Boolean ones BaseDataVariableType) with
DataType, Description (with the unit), AccessLevel = CurrentRead (+ CurrentWrite for
writable actuators), MinimumSamplingInterval, and the properties EURange (Range, plant
units) and EngineeringUnits (EUInformation: UN/ECE code when the unit is known, else
UnitId -1 with the unit as display name). One name per signal (hil/tagmap/opcua.py): a
variable's NodeId is the string "<scenario>.<Kind>.<signal>" in the scenario's namespace
whatever folder it sits in ("<scenario>" is the root folder, "<scenario>.Sensors" a kind's
folder, "<scenario>.Sensors/<folder>" an [[opcua.folders]] folder, "<scenario>.Status.Step"...);
its BrowseName is the signal name with the RelativePath-reserved characters made '_'
(browse_name_of), its DisplayName the signal name ([[opcua.nodes]] display_name overrides).

Start-up (LAZY_NODES): `build` makes the folders and registers every signal, property and
status node (its parent's forward reference, its NodeId in the address space), each built
(attributes, own references) the first time anything looks it up: a client's read, browse of
its children, subscription, or the server's background task (`build_pending`, after it
listens). Values committed to a node not built yet are kept and given to it when it is. What a
client sees is the space built at once (tests/adapters/test_opcua_lazy.py); the server listens
once the registrations are done instead of after building ~8700 nodes (case118).

Values: `refresh()` copies what changed in the image into the nodes, with SourceTimestamp =
wall-clock time of the loop's publish (actuators: of the last input write) and quality
BadWaitingForInitialData before the first publish, BadSensorFailure for a non-finite
measurement (sensor dropout), UncertainLastUsableValue once the loop has stopped or
failed. Reads and new monitored items refresh everything first; the poll task refreshes
the monitored nodes just after each loop publish (sub-ms wake-ups from a thread), or every
min_sampling_interval_ms if that is longer than a loop period, shedding samples when the
CPU is contended (see `OpcuaAdapter.poll`). A refresh builds DataValues only for nodes
whose value or quality changed and stores them without asyncua's per-node write service.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
from datetime import datetime, timezone

import numpy as np
from asyncua import Server, ua

from adapters import opcua_bulk
from adapters.opcua_bulk import add_nodes, has_fast_path
from adapters.opcua_writes import WriteGuard
from hil.image import H_IN_SEQ, H_IN_WRITE_NS, H_IN_WRITES, ProcessImage
from hil.tagmap.opcua import UNECE_NAMESPACE, NodeInfo, OpcuaSection, folder_node_path, resolve_nodes

log = logging.getLogger("hil.opcua")
FOLDERS = {"sensor": "Sensors", "actuator": "Actuators", "applied": "Applied"}
MAX_POLL_S = 0.010
SAMPLE_AFTER_PUBLISH = 0.15  # sample this fraction of a loop period after its publish
SAMPLER_DUTY = 0.25  # the sampler's share of the wall clock at most (see OpcuaAdapter.poll)
MAX_SHED_S = 0.005  # load shedding never spaces two samples further apart than this
S = ua.StatusCodes
# Nodes are registered at start-up and each built when first looked up (or by the server's
# background task once it listens), adapters/opcua_bulk.LazyAdder; False: all built before the
# server listens (adapters/opcua_bulk.add_nodes). Either way a client sees the same nodes.
LAZY_NODES = True
STATUS_NODES = (
    ("Step", ua.VariantType.UInt64, "loop step index of the published outputs"),
    ("SimTime", ua.VariantType.Double, "simulated time of the published outputs, s"),
    ("LoopState", ua.VariantType.String, "configured | running | stopped | failed"),
    ("AcceptedWrites", ua.VariantType.UInt64, "client writes accepted by this server"),
    ("RejectedWrites", ua.VariantType.UInt64, "client writes refused by this server"),
)


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


def _converter(info: NodeInfo):
    """The `_served` conversion of one node, resolved once."""
    if info.data_type in ("Double", "Float"):
        return float
    if info.data_type == "Boolean":
        mid = 0.5 * (info.eu_low + info.eu_high)
        return lambda x: bool(x >= mid)
    return lambda x: int(round(x))


class Waker:
    """Wakes an asyncio loop at absolute CLOCK_MONOTONIC instants with sub-ms precision.

    A daemon thread sleeps in clock_nanosleep (time.sleep) until the requested instant and
    resolves the awaiting future through `call_soon_threadsafe` (the loop's self-pipe wakes
    its epoll at once). asyncio's own timers round every epoll timeout up to a whole ms.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._cv = threading.Condition()
        self._target: int | None = None
        self._fut: asyncio.Future | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="opcua-sampler-waker", daemon=True)
        self._thread.start()

    async def sleep_until(self, t_ns: int) -> None:
        if t_ns <= time.monotonic_ns():
            await asyncio.sleep(0)
            return
        fut = self.loop.create_future()
        with self._cv:
            self._fut, self._target = fut, t_ns
            self._cv.notify()
        try:
            await fut
        finally:
            with self._cv:
                if self._fut is fut:
                    self._fut = self._target = None

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._target is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                target, fut = self._target, self._fut
            delay = target - time.monotonic_ns()
            if delay > 0:
                time.sleep(delay * 1e-9)
            with self._cv:
                if self._fut is not fut:  # re-armed or cancelled meanwhile
                    continue
                self._target = None
            try:
                self.loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # the loop is closed
                return

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(1.0)


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


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


class _ValueAttributes(dict):
    """NodeId -> asyncua AttributeValue of the node's Value attribute, for the nodes built so far
    (`get`, iteration, `in`); `[nid]` builds a node not built yet (LAZY_NODES) first."""

    def __init__(self, adapter: "OpcuaAdapter"):
        super().__init__()
        self.adapter = adapter

    def __missing__(self, nid):
        server = self.adapter.server
        if server is not None and server.iserver.aspace.get(nid) is not None and dict.__contains__(self, nid):
            return dict.__getitem__(self, nid)
        raise KeyError(nid)


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
        self._values = _ValueAttributes(self)  # NodeId -> AttributeValue of its Value attribute
        self._unbuilt: dict = {}  # NodeId -> the DataValue committed to a node not built yet
        self._lazy: opcua_bulk.LazyAdder | None = None
        self._bad: tuple | None = None  # ((code, source ts, server ts), DataValue) shared by `_signal`
        self._status: dict[str, ua.NodeId] = {}
        self._lock = asyncio.Lock()
        self._codes: dict[int, ua.StatusCode] = {}
        self._conv: dict = {}  # NodeId -> (plant value -> served Python value, VariantType)
        self.period_ns = max(int(round(period_s * 1e9)), 1)
        self.last_publish_ns = 0  # of the last snapshot a refresh copied from
        self.samples = 0  # monitored-only refreshes the poll task ran
        self.shed = 0  # samples postponed to keep the sampler within SAMPLER_DUTY

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
        signals = []
        for info in self.nodes:
            parent = folders[info.kind]
            if info.folder:  # [[opcua.folders]]: an array group's own folder
                if (info.kind, info.folder) not in folders:
                    folders[(info.kind, info.folder)] = await parent.add_folder(
                        self._nid(folder_node_path(info.kind, info.folder)), ua.QualifiedName(info.folder, idx))
                parent = folders[(info.kind, info.folder)]
            nid = self._nid(info.path)
            self.nodes_by_id[nid] = info
            self._ids[(info.kind, info.index)] = nid
            signals.append((info, nid, parent.nodeid))
        status = []
        for bname, vtype, desc in STATUS_NODES:
            nid = self._nid(f"Status.{bname}")
            self._status[bname] = nid
            status.append((nid, folders["status"].nodeid, bname, vtype, desc))
        lazy = LAZY_NODES and has_fast_path(server.iserver.node_mgt_service)
        if lazy:
            self._add_lazily(server.iserver, signals, status)
        else:
            self._add_at_once(server.iserver, signals, status)
        self._signal_ids = [(info, nid) for nid, info in self.nodes_by_id.items()]
        self._conv = {nid: (_converter(info), getattr(ua.VariantType, info.data_type))
                      for nid, info in self.nodes_by_id.items()}
        await self.refresh(force=True)

    def _add_at_once(self, iserver, signals, status) -> None:
        """Build every node now (adapters/opcua_bulk.add_nodes)."""
        items: list[ua.AddNodesItem] = []
        for info, nid, parent in signals:
            items.append(self._signal_item(info, nid, parent))
            items += [make() for _, make in self._property_items(info, nid)]
        items += [self._status_item(*s) for s in status]
        add_nodes(iserver, items)  # linear in the node count (adapters/opcua_bulk.py)
        for nid in [*self.nodes_by_id, *self._status.values()]:
            self._values[nid] = iserver.aspace[nid].attributes[ua.AttributeIds.Value]

    def _add_lazily(self, iserver, signals, status) -> None:
        """Register every node now (its parent lists it, its id resolves), build it when first
        looked up (adapters/opcua_bulk.LazyAdder); `build_pending` builds the rest meanwhile.
        `_built` keeps `_values` and the values committed before the node existed."""
        self._lazy = adder = opcua_bulk.LazyAdder(iserver, on_built=self._built)
        has_component = _node_id(ua.ObjectIds.HasComponent)
        variable = ua.NodeClass.Variable
        idx = self.ns_index
        for info, nid, parent in signals:
            tdef = _node_id(ua.ObjectIds.AnalogItemType if info.data_type != "Boolean"
                            else ua.ObjectIds.BaseDataVariableType)
            adder.add(nid, parent, has_component, ua.QualifiedName(info.browse_name, idx), variable,
                      ua.LocalizedText(info.display_name), tdef,
                      functools.partial(self._signal_item, info, nid, parent), self._property_items(info, nid))
        tdef = _node_id(ua.ObjectIds.BaseDataVariableType)
        for s in status:
            nid, parent, bname = s[:3]
            adder.add(nid, parent, has_component, ua.QualifiedName(bname, idx), variable, ua.LocalizedText(bname),
                      tdef, functools.partial(self._status_item, *s))

    def _built(self, nid: ua.NodeId, node) -> None:
        """A lazily added node was just built: its Value attribute, with what was committed to it."""
        if nid not in self.nodes_by_id and nid not in self._status.values():
            return  # a property
        av = node.attributes[ua.AttributeIds.Value]
        self._values[nid] = av
        dv = self._unbuilt.pop(nid, None)
        if dv is not None:
            av.value = dv
            av.value_callback = None

    async def build_pending(self, chunk: int = 25) -> None:
        """Build the nodes nobody looked up yet, `chunk` at a time between other work (the
        server's own task after it listens); nothing to do when nodes were built at once."""
        adder = self._lazy
        while adder is not None and adder.build_some(chunk):
            await asyncio.sleep(0)

    @property
    def lazily_added(self) -> int:
        """How many nodes were registered to be built on first access (0: built at once)."""
        return 0 if self._lazy is None else self._lazy.added

    def _status_item(self, nid, parent, bname, vtype, desc) -> ua.AddNodesItem:
        return _item(nid, parent, ua.QualifiedName(bname, self.ns_index),
                     _attrs(bname, desc, vtype, False, self.section.min_sampling_interval_ms),
                     ua.ObjectIds.HasComponent, ua.ObjectIds.BaseDataVariableType)

    def _variable_items(self, info: NodeInfo, nid: ua.NodeId, parent: ua.NodeId) -> list[ua.AddNodesItem]:
        return [self._signal_item(info, nid, parent)] + [make() for _, make in self._property_items(info, nid)]

    def _signal_item(self, info: NodeInfo, nid: ua.NodeId, parent: ua.NodeId) -> ua.AddNodesItem:
        vtype = getattr(ua.VariantType, info.data_type)
        desc = f"{info.description} [{info.unit}]"
        analog = info.data_type != "Boolean"
        attrs = _attrs(info.display_name, desc, vtype, info.writable, self.section.min_sampling_interval_ms)
        tdef = ua.ObjectIds.AnalogItemType if analog else ua.ObjectIds.BaseDataVariableType
        return _item(nid, parent, ua.QualifiedName(info.browse_name, self.ns_index), attrs,
                     ua.ObjectIds.HasComponent, tdef)

    def _property_items(self, info: NodeInfo, nid: ua.NodeId) -> list:
        """(NodeId, make AddNodesItem) of the signal's properties: EURange (analog), EngineeringUnits."""
        names = ("EURange", "EngineeringUnits") if info.data_type != "Boolean" else ("EngineeringUnits",)
        return [(self._nid(f"{info.path}.{pname}"), functools.partial(self._property_item, info, nid, pname))
                for pname in names]

    def _property_item(self, info: NodeInfo, nid: ua.NodeId, pname: str) -> ua.AddNodesItem:
        if pname == "EURange":
            rng = ua.Range(Low=float(info.eu_low), High=float(info.eu_high))
            value, dtype = ua.Variant(rng, ua.VariantType.ExtensionObject), ua.ObjectIds.Range
        else:
            eu = ua.EUInformation(
                NamespaceUri=UNECE_NAMESPACE,
                UnitId=info.unit_id,
                DisplayName=ua.LocalizedText(info.unit),
                Description=ua.LocalizedText(info.unit_description),
            )
            value, dtype = ua.Variant(eu, ua.VariantType.ExtensionObject), ua.ObjectIds.EUInformation
        pid = ua.NodeId(f"{self.name}.{info.path}.{pname}", self.ns_index)
        text, qname, dtype_id = _property_names(pname, dtype)
        a = ua.VariableAttributes()
        a.DisplayName = a.Description = text
        a.DataType = dtype_id
        a.Value = value
        a.ValueRank = ua.ValueRank.Scalar
        a.AccessLevel = a.UserAccessLevel = ua.AccessLevel.CurrentRead.mask
        return _item(pid, nid, qname, a, ua.ObjectIds.HasProperty, ua.ObjectIds.PropertyType)

    # ---- values ----
    def _code(self, code: int) -> ua.StatusCode:
        """One shared StatusCode object per code (asyncua never mutates them)."""
        sc = self._codes.get(code)
        if sc is None:
            sc = self._codes[code] = ua.StatusCode(code)
        return sc

    def _signal(self, info: NodeInfo, nid: ua.NodeId, x: float, src: datetime, now: datetime, quality: int,
                out: list) -> None:
        """Queue the node's new DataValue in `out` if its (value, quality) changed; nothing is
        built for an unchanged node."""
        if x - x != 0.0:  # nan or +-inf: no finite measurement
            code = S.BadWaitingForInitialData if quality == S.BadWaitingForInitialData else S.BadSensorFailure
            key = ("bad", code)
            if self._last.get(nid) != key:
                self._last[nid] = key
                shared = self._bad  # one DataValue for every node going bad in this refresh
                if shared is None or shared[0] != (code, src, now):
                    shared = self._bad = ((code, src, now), ua.DataValue(ua.Variant(), self._code(code), src, now))
                out.append((nid, shared[1]))
            return
        conv, vt = self._conv[nid]
        v = conv(x)
        key = (v, quality)
        if self._last.get(nid) != key:
            self._last[nid] = key
            out.append((nid, ua.DataValue(ua.Variant(v, vt, None, False), self._code(quality), src, now)))

    def _status_value(self, nid: ua.NodeId, key, variant_args: tuple, ts: datetime, out: list) -> None:
        if self._last.get(nid) != key:
            self._last[nid] = key
            out.append((nid, ua.DataValue(ua.Variant(*variant_args, None, False), self._code(S.Good), ts, ts)))

    async def _commit(self, changes: list) -> None:
        """Store the new DataValues, then run the subscriptions' data-change callbacks.

        The same effect as asyncua's `aspace.write_attribute_value` for each node, without its
        per-node type check (our values have the node's DataType by construction) and without
        one awaited service call per node. Bad DataValues carry a Null Variant, as asyncua
        would store them.
        """
        values = self._values
        for nid, dv in changes:
            av = values.get(nid)
            if av is None:  # not built yet (LAZY_NODES): it gets this value when it is
                self._unbuilt[nid] = dv
                continue
            if av.value_setter is not None:  # never set by hil; keep asyncua's semantics if it is
                av.value_setter(self.server.iserver.aspace._nodes[nid], ua.AttributeIds.Value, dv)
            else:
                av.value = dv
                av.value_callback = None
        for nid, dv in changes:
            av = values.get(nid)
            callbacks = av.datachange_callbacks if av is not None else None
            if callbacks:
                for handle, cb in list(callbacks.items()):
                    try:
                        await cb(handle, dv)
                    except Exception:
                        log.exception("data-change callback of %s failed", nid)

    def _skip(self, nid: ua.NodeId, monitored_only: bool) -> bool:
        """In a monitored-only refresh, nodes nobody subscribed to wait for the next read."""
        if not monitored_only:
            return False
        av = self._values.get(nid)  # a node not built yet has no monitored item
        return av is None or not av.datachange_callbacks

    async def refresh(self, force: bool = False, monitored_only: bool = False) -> bool:
        """Copy what changed in the image into the nodes (cheap when nothing did).

        Reads and new monitored items run a full refresh; the poll task a monitored-only one
        (asyncua runs a subscription's data-change callbacks on every node write, so nodes
        that nobody watches are left to the next read). Returns whether the image had
        changed since the last refresh of that kind.
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
                return False
            self.last_publish_ns = snap.publish_ns
            now = datetime.now(timezone.utc)
            never = snap.publish_ns == 0
            changes: list = []
            if prev is None or prev[0] != snap.publish_ns or prev[2] != state:
                quality = S.BadWaitingForInitialData if never else (
                    S.UncertainLastUsableValue if state in ("stopped", "failed") else S.Good)
                src = now if never else _wall_dt(snap.publish_ns)
                outputs = snap.outputs.tolist()
                applied = snap.applied.tolist()
                nan = math.nan
                for info, nid in self._signal_ids:
                    if info.kind == "actuator" or self._skip(nid, monitored_only):
                        continue
                    x = nan if never else (outputs if info.kind == "sensor" else applied)[info.index]
                    self._signal(info, nid, x, src, now, quality, changes)
                for bname, key, args, ts in (
                    ("Step", (snap.step,), (snap.step, ua.VariantType.UInt64), src),
                    ("SimTime", (snap.sim_time_s,), (snap.sim_time_s, ua.VariantType.Double), src),
                    ("LoopState", (state,), (state, ua.VariantType.String), now),
                ):
                    nid = self._status[bname]
                    if not self._skip(nid, monitored_only):
                        self._status_value(nid, key, args, ts, changes)
            if prev is None or prev[1] != writes:
                if read_commands(img, self._cmd):
                    wns = int(img.header[H_IN_WRITE_NS])
                    src = _wall_dt(wns) if wns else now
                    cmd = self._cmd.tolist()
                    for info, nid in self._signal_ids:
                        if info.kind == "actuator" and not self._skip(nid, monitored_only):
                            self._signal(info, nid, cmd[info.index], src, now, S.Good, changes)
                else:  # a writer kept the inputs torn: try again next time
                    seen = (seen[0], -1, seen[2], seen[3])
            for bname, n in zip(("AcceptedWrites", "RejectedWrites"), counts):
                nid = self._status[bname]
                if not self._skip(nid, monitored_only):
                    self._status_value(nid, (n,), (n, ua.VariantType.UInt64), now, changes)
            if changes:
                await self._commit(changes)
            self._seen[monitored_only] = seen
            if not monitored_only:
                self._seen[True] = seen
            return True

    async def apply_commands(self, commands: list[tuple[NodeInfo, float]]) -> None:
        """Put validated client writes into the image (one atomic write), then into the nodes."""
        self.image.write_inputs([info.index for info, _ in commands], [v for _, v in commands])
        now = datetime.now(timezone.utc)
        async with self._lock:
            changes: list = []
            for info, v in commands:
                self._cmd[info.index] = v
                self._signal(info, self._ids[(info.kind, info.index)], float(v), now, now, S.Good, changes)
            if changes:
                await self._commit(changes)

    def _next_sample_ns(self, now_ns: int, prev_target: int) -> int:
        """When to sample next (monotonic ns).

        Sampling at the loop's rate (poll_s within 1.5 loop periods): just after the loop's
        next publish (last publish_ns + period + SAMPLE_AFTER_PUBLISH of a period), so each
        sample sees a new step and no step is sampled twice; while the next publish is overdue
        it looks again a quarter period later (for up to 2 periods, then once a period), and
        every MAX_POLL_S once the loop has not published for 10 periods (stopped). Slower
        sampling: every poll_s on an absolute grid (missed slots skipped, never burst).
        """
        period = self.period_ns
        poll = int(self.poll_s * 1e9)
        if poll <= 1.5 * period:
            last = self.last_publish_ns
            if last <= 0 or now_ns - last > 10 * period:
                return now_ns + int(MAX_POLL_S * 1e9)
            target = last + period + int(SAMPLE_AFTER_PUBLISH * period)
            if target <= now_ns:  # the next publish is overdue: look again soon, then each period
                target = now_ns + (period // 4 if now_ns - last < 2 * period else period)
            return target
        target = prev_target + poll
        if target < now_ns:
            target = now_ns + poll - ((now_ns - target) % poll)
        return target

    async def poll(self, stop: asyncio.Event) -> None:
        """Refresh the monitored nodes once per loop step (see `_next_sample_ns`); with no
        monitored node, only wake every 10 ms to check `stop`.

        Wake-ups come from a `Waker` thread (clock_nanosleep, sub-ms) because asyncio's
        epoll timeouts round up to whole milliseconds, which at a 1 ms period made the
        sampler miss about one step in five even on an idle machine.

        Load shedding: a sample costs the time from its planned instant to the end of its
        refresh (wake-up lag + copying + the subscriptions' callbacks); the next one waits at
        least cost * (1 / SAMPLER_DUTY - 1) (at most MAX_SHED_S: a value held longer than
        that is always sampled), so the sampler holds at most SAMPLER_DUTY of the wall clock.
        Idle, a sample costs ~0.2 ms and every step is sampled; when the CPU is
        contended the cost grows and the sampler thins out (fewer notifications to encode,
        send and decode) instead of building a backlog that delays every notification.
        """
        waker = Waker(asyncio.get_running_loop())
        target = time.monotonic_ns()
        spacing = 1.0 / SAMPLER_DUTY - 1.0
        max_shed = int(MAX_SHED_S * 1e9)
        try:
            while not stop.is_set():
                watched = any(v.datachange_callbacks for v in self._values.values())
                if watched:
                    try:
                        await self.refresh(monitored_only=True)
                    except TimeoutError:
                        log.error("process image outputs stay torn; is the loop alive?")
                    self.samples += 1
                now = time.monotonic_ns()
                if watched:
                    cost = now - max(target, now - self.period_ns * 20)
                    earliest = now + min(int(cost * spacing), max_shed)
                    target = self._next_sample_ns(now, target)
                    if target < earliest:
                        self.shed += 1
                        target = earliest
                else:
                    target = now + int(MAX_POLL_S * 1e9)
                await waker.sleep_until(target)
        finally:
            waker.close()

    def counters(self) -> dict:
        return self.guard.counters()


@functools.lru_cache(maxsize=None)
def _property_names(pname: str, dtype: int) -> tuple:
    """(LocalizedText, QualifiedName, DataType NodeId) of a property, one set shared by all the
    nodes that have that property (asyncua never edits these in place)."""
    return ua.LocalizedText(pname), ua.QualifiedName(pname, 0), ua.NodeId(dtype)


@functools.lru_cache(maxsize=None)
def _node_id(numeric: int) -> ua.NodeId:
    """A namespace-0 NodeId, shared (reference and type definition ids of every item)."""
    return ua.NodeId(numeric)


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
    item.ReferenceTypeId = _node_id(reftype)
    item.TypeDefinition = _node_id(typedef)
    item.NodeAttributes = attrs
    return item
