"""adapters/opcua_space.py LAZY_NODES: an address space whose nodes are built on first access is
the address space built at once, node for node.

Two servers over one process image for configs/grid118.toml (thousands of signals, Boolean
breakers, [[opcua.folders]]): one with every node built before it listens (LAZY_NODES = False,
adapters/opcua_bulk.add_nodes), one with its nodes registered and built when looked up.
In the lazy one a few nodes are looked up first (a property before its variable), the loop
publishes a step before the rest are built (the values committed to nodes not built yet), then
the rest are built as the server's background task does. Compared for every node of the
scenario's namespace and its parent (Objects): every attribute's value and status (time stamps
aside, as in test_opcua_bulk) and the references (all fields, in order).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
from asyncua import ua

from adapters import opcua_bulk, opcua_space
from adapters.opcua import start_server
from hil.image import ProcessImage
from hil.scenario.config import load_scenario
from tests.integration.net import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)


def _node(aspace, nid) -> tuple:
    data = aspace[nid]
    attrs = {aid: (av.value.Value, av.value.StatusCode) for aid, av in data.attributes.items()}
    refs = [(r.ReferenceTypeId, r.IsForward, r.NodeId, r.BrowseName, r.DisplayName, r.NodeClass, r.TypeDefinition)
            for r in data.references]
    return attrs, refs


@pytest.fixture(scope="module")
def grid118():
    sc = load_scenario(ROOT / "configs" / "grid118.toml")
    spec = sc.plant.load().spec
    return sc, spec


async def _start(sc, spec, img, lazy: bool, monkeypatch):
    monkeypatch.setattr(opcua_space, "LAZY_NODES", lazy)
    section = sc.opcua.model_copy(update={"port": free_port()})
    return await start_server(section, spec, sc, img, 0.01)


def test_lazy_space_equals_space_built_at_once(grid118, monkeypatch):
    sc, spec = grid118
    img = ProcessImage.create(spec.n_inputs, spec.n_outputs)
    y = np.linspace(0.0, 1.0, spec.n_outputs)
    y[3] = math.nan  # one dropout: BadSensorFailure
    u = np.asarray(spec.nominal("inputs"), dtype=float)

    async def main():
        eager_server, eager = await _start(sc, spec, img, False, monkeypatch)
        lazy_server, lazy = await _start(sc, spec, img, True, monkeypatch)
        try:
            ns = eager.ns_index
            assert lazy.ns_index == ns
            ea, la = eager_server.iserver.aspace, lazy_server.iserver.aspace
            own = [nid for nid in ea.keys() if nid.NamespaceIndex == ns]
            assert len(own) > 8000  # grid118: ~3200 signals with their properties, folders, status
            assert eager.lazily_added == 0 and eager._lazy is None
            pending = la._nodes.pending
            assert lazy.lazily_added == len(pending) > 8000  # nothing built before the first look-up
            assert set(la.keys()) == set(ea.keys())  # iteration covers the pending nodes
            assert all(nid in la for nid in own)
            # looked up before the rest: a property (its variable is built first), a Boolean signal, a status node
            breaker = next(nid for nid, info in lazy.nodes_by_id.items() if info.data_type == "Boolean")
            prop = next(nid for nid in own if str(nid.Identifier).endswith(".EURange"))
            for nid in (prop, breaker, lazy._status["Step"]):
                assert _node(la, nid) == _node(ea, nid), nid
            assert lazy._values[breaker] is la[breaker].attributes[ua.AttributeIds.Value]
            img.publish(y, u, 1, 1.0)
            for adapter in (eager, lazy):
                assert await adapter.refresh()
            left = len(pending)
            assert left > 8000
            assert len(lazy._unbuilt) > 3000  # values of signals not built yet, waiting for them
            await lazy.build_pending()
            assert not pending and not lazy._unbuilt
            assert len(lazy._values) == len(eager._values) == len(eager.nodes_by_id) + 5
            for nid in [*own, ua.NodeId(ua.ObjectIds.ObjectsFolder)]:
                assert _node(la, nid) == _node(ea, nid), nid
            s0 = next(nid for nid, info in lazy.nodes_by_id.items() if info.kind == "sensor" and info.index == 0)
            assert la[s0].attributes[ua.AttributeIds.Value].value.Value.Value == pytest.approx(y[0])
        finally:
            await lazy_server.stop()
            await eager_server.stop()

    try:
        asyncio.run(main())
    finally:
        img.close()


def test_pending_nodes_build_on_lookup_only():
    built = []
    inner = {"a": 1}
    nodes = opcua_bulk.PendingNodes(inner)
    nodes.pending["b"] = lambda: (built.append("b"), inner.__setitem__("b", 2))
    assert "b" in nodes and len(nodes) == 2 and set(nodes) == {"a", "b"} and not built
    assert nodes.get("c") is None and not built
    assert nodes["b"] == 2 and built == ["b"] and not nodes.pending
    assert nodes.get("b") == 2 and built == ["b"]  # built once
    with pytest.raises(KeyError):
        nodes["c"]
