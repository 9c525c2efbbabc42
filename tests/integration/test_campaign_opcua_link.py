"""OPC UA link faults through the campaign's link proxy (hil/campaign/proxy.py), with an OPC UA
client in the loop: hil's OPC UA server over a process image this test drives as the loop
(publishing the dissolved oxygen), an asyncua client behind the proxy that reads it and writes
the agitation it implies (a P law), reconnecting on its own after a failure. Each link mode is
judged by what reached the image, the loop's side of the wire:

- pass: the client's writes follow the loop's values;
- drop: the client's session is reset, its reconnects are refused, no write reaches the image;
  back to pass, it reconnects and its writes follow again;
- delay: every round trip through the proxy takes at least the delay;
- half_open: nothing forwarded and nothing closed: the client's requests time out, no write
  reaches the image; when the mode ends the proxy resets the stale connection and the client
  comes back.
No timing is asserted but lower bounds a loaded machine cannot break (the delay); every wait is
for a condition, bounded generously."""

import asyncio
import threading
import time

import pytest

from hil.campaign.proxy import LinkProxy
from hil.scenario.ports import bind_free
from tests.integration import opcua_helpers as H

pytestmark = pytest.mark.timeout(300)

SPEC = H.spec()
DO = SPEC.outputs[SPEC.index("outputs", "dissolved_oxygen")]
AGIT = SPEC.inputs[SPEC.index("inputs", "agitation_power")]
WAIT_S = 90.0  # bound of every wait for a condition (a loaded machine is slow, not wrong)


def agitation_for(do: float) -> float:
    """The client's P law: agitation (plant unit) from dissolved oxygen (%), monotonic, in range."""
    return AGIT.low + (AGIT.high - AGIT.low) * min(max(do, 0.0), 100.0) / 100.0


class Client:
    """The OPC UA client in the loop, in a thread of its own: read DO, write agitation, again;
    on any failure count it, drop the session, reconnect after 0.2 s."""

    def __init__(self, url: str, timeout_s: float = 2.0):
        self.url, self.timeout_s = url, timeout_s
        self.cycles = self.errors = self.connects = 0
        self.rtt_s: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        from asyncua import Client as UaClient, ua

        ids = H.node_ids()
        while not self.stop.is_set():
            c = UaClient(self.url, timeout=self.timeout_s)
            try:
                await asyncio.wait_for(c.connect(), 4 * self.timeout_s)
                self.connects += 1
                idx = await c.get_namespace_index(f"urn:hil:{H.SCENARIO}")
                sensor = c.get_node(ua.NodeId(f"{ids['sensor']}{DO.name}", idx))
                act = c.get_node(ua.NodeId(f"{ids['actuator']}{AGIT.name}", idx))
                while not self.stop.is_set():
                    t0 = time.monotonic()
                    do = await sensor.read_value()
                    self.rtt_s.append(time.monotonic() - t0)
                    await act.write_value(ua.DataValue(ua.Variant(agitation_for(float(do)), ua.VariantType.Double)))
                    self.cycles += 1
                    await asyncio.sleep(0.02)
            except Exception:  # noqa: BLE001  (timeouts, resets, refused: the link's faults)
                self.errors += 1
            finally:
                try:
                    await asyncio.wait_for(c.disconnect(), 1.0)
                except Exception:  # noqa: BLE001
                    try:
                        c.disconnect_socket()
                    except Exception:  # noqa: BLE001
                        pass
            await asyncio.sleep(0.2)


def _wait(cond, what: str, bound_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + bound_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound_s:g} s: {what}")
        time.sleep(0.02)


def test_opcua_client_in_the_loop_through_link_faults(tmp_path):
    server = H.OpcuaServer(H.scenario_data(H.free_port()), tmp_path)
    proxy = client = None
    try:
        proxy = LinkProxy(bind_free(), "127.0.0.1", server.section.port, seed=1)
        url = server.url.replace(f":{server.section.port}", f":{proxy.listen_port}")
        i_agit = server.input_index(AGIT.name)
        outputs = SPEC.nominal("outputs")
        i_do = SPEC.index("outputs", "dissolved_oxygen")
        step = [1]

        def publish(do: float) -> None:  # the loop: a new DO value in the image
            outputs[i_do] = do
            server.publish(outputs=outputs, step=step[0], sim_time_s=float(step[0]))
            step[0] += 1

        def written() -> float:
            return float(server.image.read_inputs()[i_agit])

        def follows(do: float) -> bool:
            return written() == agitation_for(do)

        publish(10.0)
        client = Client(url)
        client.thread.start()
        # pass: the client's write follows the loop's value, twice
        _wait(lambda: follows(10.0), "the client's first write")
        publish(20.0)
        _wait(lambda: follows(20.0), "the client's write of a new value")

        # drop: reset, refused; the image keeps the last write while the loop moves on
        errors0, connects0 = client.errors, client.connects
        proxy.set("drop")
        _wait(lambda: client.errors >= errors0 + 3, "the client saw its session reset and its reconnects refused")
        publish(30.0)
        cyc = client.cycles
        _wait(lambda: client.errors >= errors0 + 6, "further refused reconnects")
        assert follows(20.0) and client.cycles == cyc  # nothing of the client's reached the loop
        proxy.set("pass")
        _wait(lambda: follows(30.0), "the client reconnected and writes again")
        assert client.connects > connects0

        # delay: every round trip at least the delay (a lower bound: holds on a loaded machine)
        proxy.set("delay", delay_s=0.3, jitter_s=0.0)
        n0 = len(client.rtt_s)
        publish(40.0)
        _wait(lambda: len(client.rtt_s) >= n0 + 4, "round trips under delay")
        _wait(lambda: follows(40.0), "writes still reaching the loop under delay, late")
        assert min(client.rtt_s[n0 + 1:n0 + 4]) >= 0.3, client.rtt_s[n0:n0 + 4]
        proxy.set("pass")
        publish(45.0)
        _wait(lambda: follows(45.0), "writes after the delay")

        # half open: requests vanish, nothing closed; the client times out, nothing reaches the loop
        errors0, connects0 = client.errors, client.connects
        proxy.set("half_open")
        publish(50.0)
        _wait(lambda: client.errors >= errors0 + 1, "the client timed out on the half-open link")
        assert not follows(50.0) and follows(45.0)
        proxy.set("pass")
        _wait(lambda: follows(50.0), "the client came back after the half-open link")
        assert client.connects > connects0
    finally:
        if client is not None:
            client.stop.set()
            client.thread.join(30.0)
        counters = proxy.stop() if proxy is not None else {}
        code = server.stop()
    assert not client.thread.is_alive()
    assert counters["resets"] >= 2 and counters["refused"] >= 1, counters  # drop, and the half-open's end
    assert counters["delayed"] >= 4, counters
    assert code == 0, server.log()
