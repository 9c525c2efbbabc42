"""The OPC UA server's image sampler: wake-ups, schedule, and node updates without rewrites.

In-process asyncua server over a process image this test owns (it plays the loop).
Timing is never asserted beyond ordering (a wake-up is never early).
"""

import asyncio
import math
import time
from types import SimpleNamespace

import numpy as np
import pytest
from asyncua import Client, ua

from adapters.opcua import start_server
from adapters.opcua_space import MAX_POLL_S, SAMPLE_AFTER_PUBLISH, OpcuaAdapter, Waker
from hil.scenario.config import parse_scenario
from hil.image import ProcessImage
from hil.tagmap.opcua import OpcuaSection
from tests.integration import opcua_helpers as H

SPEC = H.spec()
S = ua.StatusCodes
pytestmark = pytest.mark.timeout(120)
MS = 1_000_000


def test_waker_never_wakes_early_and_survives_cancellation():
    async def main():
        waker = Waker(asyncio.get_running_loop())
        try:
            for delay_ns in (200_000, 1_500_000, 0, -5):
                target = time.monotonic_ns() + delay_ns
                await waker.sleep_until(target)
                assert time.monotonic_ns() >= target
            t = asyncio.ensure_future(waker.sleep_until(time.monotonic_ns() + 50 * MS))
            await asyncio.sleep(0.005)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            target = time.monotonic_ns() + 2 * MS  # re-armed after a cancel: still wakes
            await asyncio.wait_for(waker.sleep_until(target), 5)
            assert time.monotonic_ns() >= target
        finally:
            waker.close()
        assert not waker._thread.is_alive()

    asyncio.run(main())


def _sched(period_ns=MS, poll_s=0.001, last=0):
    return SimpleNamespace(period_ns=period_ns, poll_s=poll_s, last_publish_ns=last)


def test_sample_schedule_follows_the_loop_publishes():
    nxt = OpcuaAdapter._next_sample_ns
    now = 10_000 * MS
    # just after a publish: the next sample is just after the next publish
    a = _sched(last=now - 100_000)
    assert nxt(a, now, 0) == now - 100_000 + MS + int(SAMPLE_AFTER_PUBLISH * MS)
    # the next publish is overdue: look again within a period, never in the past
    a = _sched(last=now - 3 * MS // 2)
    t = nxt(a, now, 0)
    assert now < t <= now + MS
    # no publish for 10+ periods (stopped loop) or never: back off to MAX_POLL_S
    for last in (now - 20 * MS, 0):
        assert nxt(_sched(last=last), now, 0) == now + int(MAX_POLL_S * 1e9)
    # sampling slower than the loop (min_sampling_interval 5 ms): a fixed grid, missed slots skipped
    a = _sched(poll_s=0.005, last=now - 100_000)
    assert nxt(a, now, now - 2 * MS) == now + 3 * MS
    assert nxt(a, now, now - 12 * MS) == now + 3 * MS


@pytest.fixture
def rig():
    sc = parse_scenario(H.scenario_data(H.free_port()))
    img = ProcessImage.create(SPEC.n_inputs, SPEC.n_outputs)
    try:
        yield sc, img
    finally:
        img.close()


async def _start(sc, img):
    section = sc.opcua or OpcuaSection()
    server, adapter = await start_server(section, SPEC, sc, img, 0.001)
    return server, adapter, f"opc.tcp://127.0.0.1:{section.port}/hil"


def _sensor(adapter, i=0):
    return next(nid for nid, info in adapter.nodes_by_id.items() if info.kind == "sensor" and info.index == i)


def test_unchanged_nodes_keep_their_datavalue_and_bad_values_are_null(rig):
    sc, img = rig
    y = SPEC.nominal("outputs")
    u = SPEC.nominal("inputs")

    async def main():
        server, adapter, _ = await _start(sc, img)
        try:
            s0, s1 = _sensor(adapter, 0), _sensor(adapter, 1)
            step = adapter._status["Step"]
            av = adapter._values
            assert av[s0].value.StatusCode.value == S.BadWaitingForInitialData
            assert av[s0].value.Value.VariantType == ua.VariantType.Null
            img.publish(y, u, 1, 0.001)
            await adapter.refresh()
            dv0, dv_step = av[s0].value, av[step].value
            assert dv0.StatusCode.is_good() and dv0.Value.Value == pytest.approx(y[0], rel=1e-6)
            assert dv_step.Value.Value == 1 and dv_step.Value.VariantType == ua.VariantType.UInt64
            assert not await adapter.refresh()  # nothing new in the image: nothing done
            y2 = y.copy()
            y2[1] = y[1] + 1.0
            img.publish(y2, u, 2, 0.002)
            assert await adapter.refresh()
            assert av[s0].value is dv0  # same value, same quality: not rewritten
            assert av[step].value is not dv_step and av[step].value.Value.Value == 2
            assert av[s1].value.Value.Value == pytest.approx(y2[1], rel=1e-6)
            assert av[s1].value.SourceTimestamp == av[step].value.SourceTimestamp  # the publish's time
            y3 = y2.copy()
            y3[0] = math.nan  # a sensor dropout
            img.publish(y3, u, 3, 0.003)
            await adapter.refresh()
            dv = av[s0].value
            assert dv.StatusCode.value == S.BadSensorFailure and dv.Value.VariantType == ua.VariantType.Null
            img.publish(y3, u, 4, 0.004)
            await adapter.refresh()
            assert av[s0].value is dv
            img.set_loop_state("stopped")
            await adapter.refresh()
            assert av[s1].value.StatusCode.value == S.UncertainLastUsableValue
        finally:
            await server.stop()

    asyncio.run(main())


def test_sampler_delivers_every_held_step_once_in_order(rig):
    """Steps held 15 ms (longer than the 10 ms publishing interval) all reach a 1 ms-sampled
    subscription, each once, in order; the sampler never runs ahead of the image."""
    sc, img = rig
    y = SPEC.nominal("outputs")
    u = SPEC.nominal("inputs")
    got: list[int] = []

    class Handler:
        def datachange_notification(self, node, val, data):
            got.append(int(val))

    async def main():
        server, adapter, url = await _start(sc, img)
        stop = asyncio.Event()
        poller = asyncio.ensure_future(adapter.poll(stop))
        try:
            img.publish(y, u, 1, 0.001)
            async with Client(url, timeout=10) as c:
                ns = await c.get_namespace_index(f"urn:hil:{H.SCENARIO}")
                node = c.get_node(ua.NodeId(f"{H.SCENARIO}.Status.Step", ns))
                sub = await c.create_subscription(10, Handler())
                await sub.subscribe_data_change([node], queuesize=100, sampling_interval=1)
                await asyncio.sleep(0.05)
                samples0 = adapter.samples
                for k in range(2, 22):
                    img.publish(y + 0.001 * k, u, k, 0.001 * k)
                    await asyncio.sleep(0.015)
                await asyncio.sleep(0.1)
                await sub.delete()
            assert got == list(range(1, 22)), got
            assert adapter.samples > samples0
        finally:
            stop.set()
            await asyncio.wait_for(poller, 5)
            await server.stop()

    asyncio.run(main())
