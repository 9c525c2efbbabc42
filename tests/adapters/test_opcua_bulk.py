"""adapters/opcua_bulk.py: nodes added in bulk are the nodes asyncua's AddNodes service makes.

Two address spaces are built from the same AddNodesItems (the adapter's own item builders:
signal variables with their EURange / EngineeringUnits properties, under one folder as the
grid's Sensors folder holds thousands), one by `NodeManagementService.add_nodes`, one by
`opcua_bulk.add_nodes`; every node must have the same attributes (values, not timestamps)
and the same references in the same order, parents included. Refusals must be the service's.
"""

from __future__ import annotations

import asyncio

import pytest
from asyncua import ua
from asyncua.server.internal_server import InternalServer

from adapters import opcua_bulk
from adapters.opcua_space import _attrs, _item

N_SIGNALS = 120  # under one folder: enough to exercise the per-parent indexes


async def _server() -> InternalServer:
    iserver = InternalServer()
    await iserver.init()
    return iserver


def _folder_item(nid: ua.NodeId) -> ua.AddNodesItem:
    a = ua.ObjectAttributes()
    a.DisplayName = ua.LocalizedText("Sensors")
    item = ua.AddNodesItem()
    item.RequestedNewNodeId = nid
    item.BrowseName = ua.QualifiedName("Sensors", 2)
    item.NodeClass = ua.NodeClass.Object
    item.ParentNodeId = ua.NodeId(ua.ObjectIds.ObjectsFolder)
    item.ReferenceTypeId = ua.NodeId(ua.ObjectIds.Organizes)
    item.TypeDefinition = ua.NodeId(ua.ObjectIds.FolderType)
    item.NodeAttributes = a
    return item


def _items(folder: ua.NodeId) -> list[ua.AddNodesItem]:
    """Signal variables as opcua_space builds them, each with its two properties."""
    items = []
    for k in range(N_SIGNALS):
        nid = ua.NodeId(f"s.Sensors.bus_{k}.vm", 2)
        items.append(_item(nid, folder, ua.QualifiedName(f"bus_{k}.vm", 2),
                           _attrs(f"bus_{k}.vm", "voltage magnitude [pu]", ua.VariantType.Double, k % 3 == 0, 100.0),
                           ua.ObjectIds.HasComponent, ua.ObjectIds.AnalogItemType))
        for pname, value, dtype in (
                ("EURange", ua.Variant(ua.Range(Low=0.0, High=2.0 + k), ua.VariantType.ExtensionObject),
                 ua.ObjectIds.Range),
                ("EngineeringUnits", ua.Variant(ua.EUInformation(UnitId=-1, DisplayName=ua.LocalizedText("pu")),
                                                ua.VariantType.ExtensionObject), ua.ObjectIds.EUInformation)):
            a = ua.VariableAttributes()
            a.DisplayName = ua.LocalizedText(pname)
            a.DataType = ua.NodeId(dtype)
            a.Value = value
            a.ValueRank = ua.ValueRank.Scalar
            items.append(_item(ua.NodeId(f"s.Sensors.bus_{k}.vm.{pname}", 2), nid, ua.QualifiedName(pname, 0), a,
                               ua.ObjectIds.HasProperty, ua.ObjectIds.PropertyType))
    return items


def _snapshot(iserver: InternalServer, nids: list[ua.NodeId]) -> dict:
    """Attributes (value, status) and references (all fields) of the given nodes."""
    out = {}
    for nid in nids:
        data = iserver.aspace[nid]
        attrs = {aid: (av.value.Value, av.value.StatusCode) for aid, av in data.attributes.items()}
        refs = [(r.ReferenceTypeId, r.IsForward, r.NodeId, r.BrowseName, r.DisplayName, r.NodeClass,
                 r.TypeDefinition) for r in data.references]
        out[nid] = (attrs, refs)
    return out


def test_bulk_nodes_equal_service_nodes():
    async def build():
        by_service, by_bulk = await _server(), await _server()
        folder = ua.NodeId("s.Sensors", 2)
        for iserver in (by_service, by_bulk):
            iserver.node_mgt_service.add_nodes([_folder_item(folder)])[0].StatusCode.check()
        items_a, items_b = _items(folder), _items(folder)
        for res in by_service.node_mgt_service.add_nodes(items_a):
            res.StatusCode.check()
        assert opcua_bulk.add_nodes(by_bulk, items_b) == len(items_b)
        nids = [folder, ua.NodeId(ua.ObjectIds.ObjectsFolder)] + [it.RequestedNewNodeId for it in items_a]
        return _snapshot(by_service, nids), _snapshot(by_bulk, nids)

    a, b = asyncio.run(build())
    assert len(a) == 2 + 3 * N_SIGNALS
    assert len(a[ua.NodeId("s.Sensors", 2)][1]) == N_SIGNALS + 2  # children + parent + type definition
    for nid in a:
        assert a[nid] == b[nid], nid


def test_bulk_refuses_what_the_service_refuses():
    async def check():
        iserver = await _server()
        folder = ua.NodeId("s.Sensors", 2)
        opcua_bulk.add_nodes(iserver, [_folder_item(folder)])
        items = _items(folder)
        with pytest.raises(opcua_bulk.BulkAddError, match="BadNodeIdExists"):
            opcua_bulk.add_nodes(iserver, [_folder_item(folder)])
        orphan = _items(ua.NodeId("s.Nowhere", 2))[0]
        with pytest.raises(opcua_bulk.BulkAddError, match="BadParentNodeIdInvalid"):
            opcua_bulk.add_nodes(iserver, [orphan])
        twice = _items(folder)[1]  # EURange of bus_0 once more, under a new node id
        twice.RequestedNewNodeId = ua.NodeId("s.Sensors.bus_0.vm.EURange2", 2)
        with pytest.raises(opcua_bulk.BulkAddError, match="BadBrowseNameDuplicated"):
            opcua_bulk.add_nodes(iserver, items[:3] + [twice])
        # the service says the same of the same item
        res = iserver.node_mgt_service.add_nodes([twice])[0]
        assert res.StatusCode.value == ua.StatusCodes.BadBrowseNameDuplicated

    asyncio.run(check())
