"""Adding many nodes to an asyncua 2.1 address space in time linear in their number.

asyncua's AddNodes service (`NodeManagementService._add_node`) checks each new node against
every reference its parent already holds, twice: a HasProperty browse-name duplicate scan
(building a NodeId per reference) and the unique-reference scan. Under one folder with n
children that is O(n^2): case118's ~3200 signals (8700 nodes with their EURange and
EngineeringUnits properties) took 7-9 s of the OPC UA server's start on a loaded 2-core
machine, nearly all of it in those scans.

`add_nodes(iserver, items)` makes the same nodes with the same checks, keeping per parent a
set of its HasProperty browse names and of its (ReferenceTypeId, NodeId, IsForward) keys
instead of rescanning the list. The attribute and child-side references are asyncua's own
helpers (`_add_node_attributes`, `_add_ref_to_parent`, `_add_type_definition`), so a node
made here is indistinguishable from one made by the service (tests/adapters/test_opcua_bulk.py
compares two address spaces built both ways attribute by attribute, reference by reference).
If asyncua's private helpers are not there (another version), the service itself is used.

A refused item raises `BulkAddError` naming the node id and the status code, like
`AddNodesResult.StatusCode.check()` after the service would; nodes before it stay added.
"""

from __future__ import annotations

from asyncua import ua
from asyncua.server.address_space import NodeData

_HELPERS = ("_aspace", "_add_node_attributes", "_add_ref_to_parent", "_add_type_definition")


class BulkAddError(RuntimeError):
    """An AddNodesItem the address space refuses (the status code is asyncua's)."""

    def __init__(self, nodeid, code: int, reason: str):
        self.code = ua.StatusCode(code)
        super().__init__(f"OPC UA node {nodeid}: {self.code.name}: {reason}")


def has_fast_path(service) -> bool:
    """Whether `service` (iserver.node_mgt_service) has the asyncua 2.1 helpers used here."""
    return all(hasattr(service, name) for name in _HELPERS)


class _ParentIndex:
    """What the duplicate checks need to know of one parent: its HasProperty browse names and
    its reference keys, read once from its reference list and kept up to date here."""

    def __init__(self, data: NodeData, has_property: ua.NodeId):
        self.data = data
        self.property_names = {r.BrowseName.Name for r in data.references
                               if r.ReferenceTypeId == has_property and r.BrowseName is not None}
        self.keys = {(r.ReferenceTypeId, r.NodeId): r.IsForward for r in data.references}


def add_nodes(iserver, items: list[ua.AddNodesItem]) -> int:
    """Add `items` (with non-null RequestedNewNodeId) as the AddNodes service would; returns
    how many were added. Raises BulkAddError at the first refused item."""
    service = iserver.node_mgt_service
    if not has_fast_path(service):  # another asyncua: the service, checked item by item
        for item, res in zip(items, service.add_nodes(items)):
            if not res.StatusCode.is_good():
                raise BulkAddError(item.RequestedNewNodeId, res.StatusCode.value, "refused by AddNodes")
        return len(items)
    aspace = service._aspace
    has_property = ua.NodeId(ua.ObjectIds.HasProperty)
    parents: dict[ua.NodeId, _ParentIndex] = {}
    for item in items:
        nid = item.RequestedNewNodeId
        if nid.has_null_identifier():
            raise BulkAddError(nid, ua.StatusCodes.BadNodeIdInvalid, "a bulk add needs the node id given")
        if nid in aspace:
            raise BulkAddError(nid, ua.StatusCodes.BadNodeIdExists, "already in the address space")
        parent = parents.get(item.ParentNodeId)
        if parent is None:
            pdata = aspace.get(item.ParentNodeId)
            if pdata is None:
                raise BulkAddError(nid, ua.StatusCodes.BadParentNodeIdInvalid,
                                   f"parent {item.ParentNodeId} does not exist")
            parent = parents[item.ParentNodeId] = _ParentIndex(pdata, has_property)
        if item.BrowseName.Name in parent.property_names:
            raise BulkAddError(nid, ua.StatusCodes.BadBrowseNameDuplicated,
                               f"parent {item.ParentNodeId} has a property {item.BrowseName.Name!r}")
        if not item.TypeDefinition.is_null() and item.TypeDefinition not in aspace:
            raise BulkAddError(nid, ua.StatusCodes.BadTypeDefinitionInvalid,
                               f"type definition {item.TypeDefinition} does not exist")
        node = NodeData(nid)
        service._add_node_attributes(node, item, add_timestamps=True)
        aspace[nid] = node
        # the parent's forward reference (NodeManagementService._add_ref_from_parent)
        key = (item.ReferenceTypeId, nid)
        forward = parent.keys.get(key)
        if forward is None:
            desc = ua.ReferenceDescription()
            desc.ReferenceTypeId = item.ReferenceTypeId
            desc.NodeId = nid
            desc.NodeClass = item.NodeClass
            desc.BrowseName = item.BrowseName
            desc.DisplayName = item.NodeAttributes.DisplayName
            desc.TypeDefinition = item.TypeDefinition
            desc.IsForward = True
            parent.data.references.append(desc)
            parent.keys[key] = True
            if item.ReferenceTypeId == has_property:
                parent.property_names.add(item.BrowseName.Name)
        # the node's own references (few): asyncua's helpers
        service._add_ref_to_parent(node, item, parent.data)
        if not item.TypeDefinition.is_null():
            service._add_type_definition(node, item)
    return len(items)
