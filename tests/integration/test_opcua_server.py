"""hil's OPC UA server in its own process, seen by an asyncua client over real sockets.

The test process owns the process image and plays the loop: it publishes outputs and
reads the commanded inputs the clients wrote. Signal names come from the bioreactor SPEC.
"""

import asyncio
import math
import threading
import time
from datetime import datetime, timezone

import numpy as np
import pytest
from asyncua import Client, ua

from hil.tagmap.opcua import UNECE_CODES, unece_unit_id
from tests.integration import opcua_helpers as H

SPEC = H.spec()
SENSOR = SPEC.outputs[0]
ACT = SPEC.inputs[0]  # driver "plc" (the default)
ACT2 = SPEC.inputs[1]
FIXED = SPEC.inputs[2]  # driven by "fixed": no actuator node, still in Applied
INT_ACT = next(q for q in SPEC.inputs[3:] if q.high - q.low >= 10)
FLOAT_ACT, BOOL_ACT, INT16_ACT = [q for q in SPEC.inputs if q not in (ACT, ACT2, FIXED, INT_ACT)][:3]
NARROW = (ACT2.low, ACT2.low + 0.5 * (ACT2.high - ACT2.low))
NS_URI = f"urn:hil:{H.SCENARIO}"
S = ua.StatusCodes
pytestmark = pytest.mark.timeout(120)


def _data(port):
    return H.scenario_data(
        port,
        inputs={FIXED.name: {"driver": "fixed", "value": FIXED.nominal}},
        opcua={"nodes": [{"signal": SENSOR.name, "display_name": "PrimarySensor", "data_type": "Float"},
                         {"signal": INT_ACT.name, "data_type": "Int32"},
                         {"signal": ACT2.name, "eu_range": list(NARROW)},
                         {"signal": FLOAT_ACT.name, "data_type": "Float"},
                         {"signal": BOOL_ACT.name, "data_type": "Boolean"},
                         {"signal": INT16_ACT.name, "data_type": "Int16"}]},
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = H.OpcuaServer(_data(H.free_port()), tmp_path_factory.mktemp("opcua"))
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log()  # SIGTERM: clean exit


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def nid(kind: str, name: str, ns: int = 2) -> ua.NodeId:
    return ua.NodeId(f"{H.node_ids()[kind]}{name}", ns)


async def _names(node) -> list[str]:
    return [(await c.read_browse_name()).Name for c in await node.get_children()]


def test_address_space_browse(server):
    async def go():
        async with Client(server.url) as c:
            idx = await c.get_namespace_index(NS_URI)
            root = await c.nodes.objects.get_child(f"{idx}:{H.SCENARIO}")
            folders = {(await f.read_browse_name()).Name: f for f in await root.get_children()}
            assert set(folders) == {"Sensors", "Actuators", "Applied", "Status"}
            sensors = await _names(folders["Sensors"])
            assert sensors == [q.name for q in SPEC.outputs]  # browse names are the signal names
            primary = c.get_node(nid("sensor", SENSOR.name, idx))
            assert (await primary.read_display_name()).Text == "PrimarySensor"  # only the label differs
            actuators = await _names(folders["Actuators"])
            assert FIXED.name not in actuators and actuators == [q.name for q in SPEC.inputs if q is not FIXED]
            assert await _names(folders["Applied"]) == list(SPEC.names("inputs"))
            assert await _names(folders["Status"]) == ["Step", "SimTime", "LoopState", "AcceptedWrites",
                                                        "RejectedWrites"]
            s = c.get_node(nid("sensor", SENSOR.name, idx))
            a = c.get_node(nid("actuator", ACT.name, idx))
            assert await s.read_data_type() == ua.NodeId(ua.ObjectIds.Float)
            assert await a.read_data_type() == ua.NodeId(ua.ObjectIds.Double)
            assert await c.get_node(nid("actuator", INT_ACT.name, idx)).read_data_type() == ua.NodeId(ua.ObjectIds.Int32)
            read, write = ua.AccessLevel.CurrentRead.mask, ua.AccessLevel.CurrentWrite.mask
            for node, level in ((s, read), (a, read | write), (c.get_node(nid("applied", ACT.name, idx)), read)):
                assert (await node.read_attribute(ua.AttributeIds.AccessLevel)).Value.Value == level
                assert (await node.read_attribute(ua.AttributeIds.UserAccessLevel)).Value.Value == level
            assert await s.read_type_definition() == ua.NodeId(ua.ObjectIds.AnalogItemType)
            desc = (await a.read_description()).Text
            assert ACT.unit in desc

    run(go())


def test_units_and_ranges_come_from_the_spec(server):
    async def go():
        async with Client(server.url) as c:
            idx = await c.get_namespace_index(NS_URI)
            for kind, quantities in (("sensor", SPEC.outputs), ("applied", SPEC.inputs)):
                for q in quantities:
                    node = c.get_node(nid(kind, q.name, idx))
                    rng = await (await node.get_child("0:EURange")).read_value()
                    eu = await (await node.get_child("0:EngineeringUnits")).read_value()
                    assert (rng.Low, rng.High) == (q.low, q.high), q.name
                    assert eu.DisplayName.Text == q.unit
                    code = UNECE_CODES.get(q.unit, (None,))[0]
                    assert eu.UnitId == (unece_unit_id(code) if code else -1), q.name
                    assert eu.NamespaceUri == "http://www.opcfoundation.org/UA/units/un/cefact"
            narrowed = c.get_node(nid("actuator", ACT2.name, idx))
            rng = await (await narrowed.get_child("0:EURange")).read_value()
            assert (rng.Low, rng.High) == NARROW

    run(go())


def test_values_follow_the_image_with_publish_timestamps(server):
    out = SPEC.nominal("outputs")
    out[1] = SPEC.outputs[1].low + 0.25 * (SPEC.outputs[1].high - SPEC.outputs[1].low)
    app = SPEC.nominal("inputs")
    app[0] = ACT.high
    before = datetime.now(timezone.utc)
    server.publish(out, app, step=1234, sim_time_s=1234.0)
    after = datetime.now(timezone.utc)
    time.sleep(0.3)  # served values must keep the publish time, not the read time

    async def go():
        async with Client(server.url) as c:
            idx = await c.get_namespace_index(NS_URI)
            dv = await c.get_node(nid("sensor", SPEC.outputs[1].name, idx)).read_data_value()
            assert dv.Value.Value == out[1] and dv.StatusCode.is_good()
            slack = 0.005  # s: monotonic -> wall conversion and datetime rounding
            assert (before - dv.SourceTimestamp).total_seconds() < slack
            assert (dv.SourceTimestamp - after).total_seconds() < slack
            assert dv.ServerTimestamp > after
            f32 = await c.get_node(nid("sensor", SENSOR.name, idx)).read_data_value()
            assert f32.Value.VariantType == ua.VariantType.Float
            assert f32.Value.Value == pytest.approx(out[0], rel=1e-6)  # float32 resolution
            assert await c.get_node(nid("applied", ACT.name, idx)).read_value() == ACT.high
            assert await c.get_node(nid("status", "Step", idx)).read_value() == 1234
            assert await c.get_node(nid("status", "SimTime", idx)).read_value() == 1234.0

    run(go())


def _wv(node_id, variant, attr=ua.AttributeIds.Value, index_range=None):
    wv = ua.WriteValue()
    wv.NodeId = node_id
    wv.AttributeId = attr
    wv.IndexRange = index_range
    wv.Value = ua.DataValue(variant)
    return wv


async def _write(c, items) -> list[str]:
    params = ua.WriteParameters()
    params.NodesToWrite = items
    return [r.name for r in await c.uaclient.write(params)]


def test_bad_writes_get_their_status_and_change_nothing(server):
    start = SPEC.nominal("inputs")
    server.image.write_inputs(list(range(SPEC.n_inputs)), start)
    writes_before = server.image.counters()["input_writes"]
    D = ua.VariantType.Double
    cases = [
        (nid("actuator", ACT.name), ua.Variant(ACT.high * 2 + 1, D), "BadOutOfRange"),
        (nid("actuator", ACT.name), ua.Variant(ACT.low - 1.0, D), "BadOutOfRange"),
        (nid("actuator", ACT.name), ua.Variant(math.nan, D), "BadOutOfRange"),
        (nid("actuator", ACT.name), ua.Variant(math.inf, D), "BadOutOfRange"),
        (nid("actuator", ACT2.name), ua.Variant(NARROW[1] + 0.01 * (ACT2.high - ACT2.low), D), "BadOutOfRange"),
        (nid("actuator", INT_ACT.name), ua.Variant(int(INT_ACT.high) + 1, ua.VariantType.Int32), "BadOutOfRange"),
        (nid("actuator", ACT.name), ua.Variant(True, ua.VariantType.Boolean), "BadTypeMismatch"),
        (nid("actuator", ACT.name), ua.Variant(int(ACT.high) + 1, ua.VariantType.Int32), "BadOutOfRange"),
        (nid("actuator", ACT.name), ua.Variant("0.1", ua.VariantType.String), "BadTypeMismatch"),
        (nid("actuator", ACT.name), ua.Variant([ACT.low, ACT.low], D), "BadTypeMismatch"),
        (nid("actuator", INT_ACT.name), ua.Variant(INT_ACT.low + 0.5, D), "BadTypeMismatch"),  # a fraction
        (nid("actuator", INT_ACT.name), ua.Variant(2.0**31, D), "BadOutOfRange"),  # beyond Int32
        (nid("actuator", INT16_ACT.name), ua.Variant(40000, ua.VariantType.Int32), "BadOutOfRange"),
        (nid("actuator", FLOAT_ACT.name), ua.Variant(1e39, D), "BadOutOfRange"),  # beyond float32
        (nid("actuator", BOOL_ACT.name), ua.Variant(2, ua.VariantType.Int32), "BadOutOfRange"),
        (nid("sensor", SPEC.outputs[1].name), ua.Variant(SPEC.outputs[1].low, D), "BadNotWritable"),
        (nid("applied", ACT.name), ua.Variant(ACT.low, D), "BadNotWritable"),
        (nid("status", "Step"), ua.Variant(1, ua.VariantType.UInt64), "BadNotWritable"),
        (ua.NodeId(f"{H.node_ids()['actuator']}{ACT.name}.EURange", 2),
         ua.Variant(ua.Range(0.0, 1.0), ua.VariantType.ExtensionObject), "BadNotWritable"),
        (nid("actuator", FIXED.name), ua.Variant(FIXED.low, D), "BadNodeIdUnknown"),
    ]

    async def go():
        async with Client(server.url) as c:
            got = await _write(c, [_wv(n, v) for n, v, _ in cases])
            assert got == [code for _, _, code in cases]
            attr = await _write(c, [_wv(nid("actuator", ACT.name), ua.Variant(ua.LocalizedText("x")),
                                        attr=ua.AttributeIds.DisplayName)])
            rng = await _write(c, [_wv(nid("actuator", ACT.name), ua.Variant(ACT.low, D), index_range="0")])
            assert attr == ["BadNotWritable"] and rng == ["BadIndexRangeInvalid"]
            assert await c.get_node(nid("status", "RejectedWrites")).read_value() >= len(cases) + 2
            # the node still shows the commanded value, untouched
            assert await c.get_node(nid("actuator", ACT.name)).read_value() == start[0]

    run(go())
    np.testing.assert_array_equal(server.image.read_inputs(), start)
    assert server.image.counters()["input_writes"] == writes_before


def test_valid_writes_reach_the_image_at_once(server):
    v1 = ACT.low + 0.3 * (ACT.high - ACT.low)
    v2 = NARROW[1]  # the (narrowed) EU range is inclusive
    vi = int(INT_ACT.low + 0.5 * (INT_ACT.high - INT_ACT.low))

    async def go():
        async with Client(server.url) as c:
            single = await _write(c, [_wv(nid("actuator", ACT.name), ua.Variant(v1, ua.VariantType.Double))])
            assert single == ["Good"]
            assert server.image.read_inputs()[server.input_index(ACT.name)] == v1
            writes = server.image.counters()["input_writes"]
            batch = await _write(c, [_wv(nid("actuator", ACT2.name), ua.Variant(v2, ua.VariantType.Double)),
                                     _wv(nid("actuator", INT_ACT.name), ua.Variant(vi, ua.VariantType.Int32)),
                                     _wv(nid("sensor", SENSOR.name), ua.Variant(1.0, ua.VariantType.Float))])
            assert batch == ["Good", "Good", "BadNotWritable"]
            assert server.image.counters()["input_writes"] == writes + 1  # one atomic image write
            u = server.image.read_inputs()
            assert (u[server.input_index(ACT2.name)], u[server.input_index(INT_ACT.name)]) == (v2, vi)
            assert await c.get_node(nid("actuator", INT_ACT.name)).read_value() == vi
            assert await c.get_node(nid("status", "AcceptedWrites")).read_value() >= 3

    run(go())


def f32(x: float) -> float:
    import struct

    return struct.unpack("<f", struct.pack("<f", x))[0]


def test_writes_of_other_numeric_types_convert_and_reach_the_image(server):
    """A PLC writes its own types (REAL = Float, DINT = Int32, BOOL): what reaches the image
    is the value the node's data type holds."""
    i = server.input_index
    real = f32(ACT.low + 0.3 * (ACT.high - ACT.low))  # a REAL setpoint into a Double node
    dint = int(INT_ACT.low + 10)  # a DINT into a Double node and into an Int32 node
    lreal = FLOAT_ACT.low + 0.123 * (FLOAT_ACT.high - FLOAT_ACT.low)  # a Double into a Float node

    async def go():
        async with Client(server.url) as c:
            got = await _write(c, [
                _wv(nid("actuator", ACT.name), ua.Variant(real, ua.VariantType.Float)),
                _wv(nid("actuator", FLOAT_ACT.name), ua.Variant(lreal, ua.VariantType.Double)),
                _wv(nid("actuator", BOOL_ACT.name), ua.Variant(True, ua.VariantType.Boolean)),
                _wv(nid("actuator", INT_ACT.name), ua.Variant(float(dint), ua.VariantType.Double)),
                _wv(nid("actuator", INT16_ACT.name), ua.Variant(7, ua.VariantType.Int32)),
            ])
            assert got == ["Good"] * 5
            u = server.image.read_inputs()
            assert u[i(ACT.name)] == real  # exactly the REAL's value
            assert u[i(FLOAT_ACT.name)] == f32(lreal) and f32(lreal) != lreal  # rounded to float32
            assert u[i(BOOL_ACT.name)] == BOOL_ACT.high  # True = the EU range's high end
            assert u[i(INT_ACT.name)] == dint and u[i(INT16_ACT.name)] == 7.0
            assert await _write(c, [_wv(nid("actuator", ACT2.name), ua.Variant(0, ua.VariantType.Int32)),
                                    _wv(nid("actuator", BOOL_ACT.name),
                                        ua.Variant(False, ua.VariantType.Boolean))]) == ["Good", "Good"]
            u = server.image.read_inputs()
            assert u[i(ACT2.name)] == 0.0 and u[i(BOOL_ACT.name)] == BOOL_ACT.low
            dv = await c.get_node(nid("actuator", FLOAT_ACT.name)).read_data_value()
            assert dv.Value.VariantType == ua.VariantType.Float and dv.Value.Value == f32(lreal)

    run(go())


def test_browse_path_by_signal_name(server):
    async def go():
        async with Client(server.url) as c:
            idx = await c.get_namespace_index(NS_URI)
            path = ["0:Objects", f"{idx}:{H.SCENARIO}", f"{idx}:Sensors", f"{idx}:dissolved_oxygen"]
            node = await c.nodes.root.get_child(path)
            assert node.nodeid == nid("sensor", "dissolved_oxygen", idx)

    run(go())


def test_writes_by_another_driver_show_on_the_actuator_node(server):
    v = ACT.low + 0.7 * (ACT.high - ACT.low)
    server.image.write_inputs([server.input_index(ACT.name)], [v])  # e.g. the Modbus server

    async def go():
        async with Client(server.url) as c:
            assert await c.get_node(nid("actuator", ACT.name)).read_value() == v

    run(go())


class _Collector:
    def __init__(self):
        self.values: list[float] = []
        self.done = asyncio.Event()
        self.final = None

    def datachange_notification(self, node, val, data):
        self.values.append(val)
        if val == self.final:
            self.done.set()


def _publisher(server, idx: int, values, stop: threading.Event, period_s: float = 0.001) -> None:
    """Plays a 1 kHz loop: one new value of output `idx` per step, absolute deadlines."""
    out = SPEC.nominal("outputs")
    app = SPEC.nominal("inputs")
    t0 = time.monotonic()
    for k, v in enumerate(values):
        if stop.is_set():
            return
        out[idx] = v
        server.publish(out, app, step=10_000 + k, sim_time_s=float(k))
        delay = t0 + (k + 1) * period_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)


@pytest.mark.parametrize("requested_ms", [10.0, 0.0])
def test_subscription_at_10ms_delivers_published_changes(server, requested_ms):
    q = SPEC.outputs[1]
    n = 400
    values = list(np.linspace(q.low, q.high, n))

    out = SPEC.nominal("outputs")
    out[1] = values[0]
    server.publish(out, step=9_999)  # the node starts away from the final value

    async def go():
        async with Client(server.url) as c:
            handler = _Collector()
            params = ua.CreateSubscriptionParameters()
            params.RequestedPublishingInterval = requested_ms
            params.RequestedLifetimeCount = 3000
            params.RequestedMaxKeepAliveCount = 100
            params.PublishingEnabled = True
            sub = await c.create_subscription(params, handler)
            assert sub.parameters.RequestedPublishingInterval == 10.0  # revised up to the floor
            await sub.subscribe_data_change(c.get_node(nid("sensor", q.name)), queuesize=1)
            await asyncio.sleep(0.2)
            handler.values.clear()
            handler.final = values[-1]
            stop = threading.Event()
            pub = threading.Thread(target=_publisher, args=(server, 1, values, stop), daemon=True)
            t0 = time.monotonic()
            pub.start()
            try:
                await asyncio.wait_for(handler.done.wait(), 20)
            finally:
                stop.set()
                pub.join(5)
            elapsed_s = time.monotonic() - t0
            await sub.delete()
            return handler.values, elapsed_s

    got, elapsed_s = run(go())
    assert got[-1] == values[-1]
    assert set(got) <= set(values) and got == sorted(got)  # only published values, in order
    # Queue size 1 at a 10 ms publishing interval: at most one notification per interval
    # (+ slack for the first and a late publish cycle), however long the ramp took; asyncua's
    # own 0 ms interval would send one per change (n of them).
    assert 3 <= len(got) <= elapsed_s / 0.010 + 10


def test_quality_follows_the_loop(tmp_path):
    srv = H.OpcuaServer(H.scenario_data(H.free_port()), tmp_path)
    try:
        async def read(name):
            async with Client(srv.url) as c:
                return await c.get_node(nid("sensor", name)).read_data_value(raise_on_bad_status=False)

        first = SPEC.outputs[0].name
        dv = run(read(first))
        assert dv.StatusCode.value == S.BadWaitingForInitialData  # nothing published yet
        out = SPEC.nominal("outputs")
        out[0] = math.nan  # a sensor dropout
        srv.publish(out)
        assert run(read(first)).StatusCode.value == S.BadSensorFailure
        assert run(read(SPEC.outputs[1].name)).StatusCode.is_good()
        srv.image.set_loop_state("stopped")
        dv = run(read(SPEC.outputs[1].name))
        assert dv.StatusCode.value == S.UncertainLastUsableValue and dv.Value.Value == out[1]
    finally:
        assert srv.stop() == 0, srv.log()


def test_serve_forever_with_ready_and_stop_events_in_a_spawned_process(tmp_path, monkeypatch):
    """The lead's process layout: multiprocessing (spawn), a picklable scenario, Events."""
    import multiprocessing as mp

    from adapters.opcua import serve_forever
    from hil.scenario.config import parse_scenario
    from hil.image import ProcessImage

    monkeypatch.chdir(tmp_path)  # the child generates its certificate under its working directory
    scenario = parse_scenario(H.scenario_data(H.free_port()))
    image = ProcessImage.create(SPEC.n_inputs, SPEC.n_outputs)
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=serve_forever, args=(scenario, image.name, ready, stop), daemon=True)
    proc.start()
    try:
        assert ready.wait(60), "server never became ready"
        image.publish(SPEC.nominal("outputs"), SPEC.nominal("inputs"), 7, 7.0)

        async def go():
            async with Client(scenario.opcua.endpoint_url()) as c:
                return await c.get_node(nid("status", "Step")).read_value()

        assert run(go()) == 7
        stop.set()
        proc.join(20)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        image.close()
