"""Adding many nodes to an asyncua 2.1 address space in time linear in their number.

asyncua's AddNodes service (`NodeManagementService._add_node`) checks each new node against
every reference its parent already holds, twice: a HasProperty browse-name duplicate scan
(building a NodeId per reference) and the unique-reference scan. Under one folder with n
children that is O(n^2): case118's ~3200 signals (8700 nodes with their EURange and
EngineeringUnits properties) took 7-9 s of the OPC UA server's start on a loaded 2-core
machine, nearly all of it in those scans.

`add_nodes(iserver, items)` makes the same nodes with the same checks, keeping per parent a
set of its HasProperty browse names and of its (ReferenceTypeId, NodeId, IsForward) keys
instead of rescanning the list. A node made here is indistinguishable from one made by the
service (tests/adapters/test_opcua_bulk.py compares two address spaces built both ways
attribute by attribute, reference by reference). If asyncua's private helpers are not there
(another version), the service itself is used.

The attributes and the node's own references are made as asyncua's helpers make them
(`_add_node_attributes`, `_add_ref_to_parent`, `_add_type_definition`), with less work per
node (after the scans, these were 2.0-2.6 s of case118's start): an attribute whose value
recurs (AccessLevel, DataType, ValueRank, a property's DisplayName...) gets one DataValue
shared by all the nodes that have it (asyncua replaces an attribute's DataValue on a write
and never edits one in place, and each node keeps its own AttributeValue, which holds the
callbacks), the Value attribute's time stamps are the batch's start (asyncua reads the clock
per node), and the reference to the parent and to the type definition are copied from the
first one asyncua's helper made for that parent or type (each node its own copy).

`LazyAdder` registers nodes with the same checks and builds each (the same way) on first
access, through `PendingNodes`, the node mapping it puts in the address space.

A refused item raises `BulkAddError` naming the node id and the status code, like
`AddNodesResult.StatusCode.check()` after the service would; nodes before it stay added.
"""

from __future__ import annotations

import collections
import collections.abc
import dataclasses
from datetime import datetime, timezone

from asyncua import ua
from asyncua.server.address_space import AttributeValue, NodeData

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


# asyncua 2.1 NodeManagementService._add_nodeattributes: (attribute, variant type, is_array),
# in its order (UserWriteMask twice: the second, UInt32, is the one that stays).
_REQUESTED = (
    ("AccessLevel", ua.VariantType.Byte, False), ("ArrayDimensions", ua.VariantType.UInt32, True),
    ("BrowseName", ua.VariantType.QualifiedName, False), ("ContainsNoLoops", ua.VariantType.Boolean, False),
    ("DataType", ua.VariantType.NodeId, False), ("Description", ua.VariantType.LocalizedText, False),
    ("DisplayName", ua.VariantType.LocalizedText, False), ("EventNotifier", ua.VariantType.Byte, False),
    ("Executable", ua.VariantType.Boolean, False), ("Historizing", ua.VariantType.Boolean, False),
    ("InverseName", ua.VariantType.LocalizedText, False), ("IsAbstract", ua.VariantType.Boolean, False),
    ("MinimumSamplingInterval", ua.VariantType.Double, False), ("NodeClass", ua.VariantType.Int32, False),
    ("NodeId", ua.VariantType.NodeId, False), ("Symmetric", ua.VariantType.Boolean, False),
    ("UserAccessLevel", ua.VariantType.Byte, False), ("UserExecutable", ua.VariantType.Boolean, False),
    ("UserWriteMask", ua.VariantType.Byte, False), ("ValueRank", ua.VariantType.Int32, False),
    ("WriteMask", ua.VariantType.UInt32, False), ("UserWriteMask", ua.VariantType.UInt32, False),
    ("DataTypeDefinition", ua.VariantType.ExtensionObject, False), ("Value", None, False),
)
_SPEC = tuple((name, int(getattr(ua.NodeAttributesMask, name)), getattr(ua.AttributeIds, name), vtype, is_array)
              for name, vtype, is_array in _REQUESTED)


def _memo_key(value):
    """A dictionary key standing for `value` (equal keys: equal values), or None if it has none."""
    t = type(value)
    if t is ua.LocalizedText:
        return t, value.Locale, value.Text
    if t is ua.QualifiedName:
        return t, value.NamespaceIndex, value.Name
    if t is list or t is tuple:
        keys = tuple(_memo_key(v) for v in value)
        return None if None in keys else (t, keys)
    try:
        hash(value)
    except TypeError:
        return None
    return t, value


class _NodeMaker:
    """Attributes and own references of new nodes, as asyncua's helpers make them (module doc)."""

    def __init__(self, service):
        self.service = service
        self.now = datetime.now(timezone.utc)
        self.server_ts = self.now if service._aspace.force_server_timestamp else None
        self.shared: dict = {}  # (attribute id, variant type, is_array, value key) -> DataValue
        self.refs: dict = {}  # (parent or type id, reference type) -> fields of the reference asyncua made

    def _value(self, aid, value, vtype, is_array: bool, memo: bool) -> ua.DataValue:
        key = _memo_key(value) if memo else None
        if key is not None:
            key = (aid, vtype, is_array, key)
            dv = self.shared.get(key)
            if dv is not None:
                return dv
        dv = ua.DataValue(ua.Variant(value, vtype, is_array=is_array))
        if key is not None:
            self.shared[key] = dv
        return dv

    def attributes(self, node: NodeData, item: ua.AddNodesItem) -> None:
        """NodeManagementService._add_node_attributes(node, item, add_timestamps=True)."""
        out = node.attributes
        out[ua.AttributeIds.NodeId] = AttributeValue(ua.DataValue(ua.Variant(node.nodeid, ua.VariantType.NodeId)))
        out[ua.AttributeIds.BrowseName] = AttributeValue(
            self._value(ua.AttributeIds.BrowseName, item.BrowseName, ua.VariantType.QualifiedName, False, False))
        out[ua.AttributeIds.NodeClass] = AttributeValue(
            self._value(ua.AttributeIds.NodeClass, item.NodeClass, ua.VariantType.Int32, False, True))
        attrs = item.NodeAttributes
        specified = attrs.SpecifiedAttributes
        for name, bit, aid, vtype, is_array in _SPEC:
            if not specified & bit:
                continue
            value = getattr(attrs, name)
            if name == "Value":
                dv = ua.DataValue(ua.Variant(value, vtype, is_array=is_array), SourceTimestamp=self.now,
                                  ServerTimestamp=self.server_ts)
            elif name == "DataTypeDefinition" and not isinstance(value, ua.DataTypeDefinition):
                dv = ua.DataValue(ua.Variant(None, ua.VariantType.Null))
            else:
                dv = self._value(aid, value, vtype, is_array, name not in ("NodeId", "BrowseName"))
            out[aid] = AttributeValue(dv)

    def own_references(self, node: NodeData, item: ua.AddNodesItem, parent: NodeData) -> None:
        """_add_ref_to_parent then, with a type definition, _add_type_definition."""
        self._copy_or_make(node, ("parent", item.ParentNodeId, item.ReferenceTypeId),
                           lambda n: self.service._add_ref_to_parent(n, item, parent))
        if not item.TypeDefinition.is_null():
            self._copy_or_make(node, ("type", item.TypeDefinition),
                               lambda n: self.service._add_type_definition(n, item))

    def _copy_or_make(self, node: NodeData, key, make) -> None:
        template = self.refs.get(key)
        if template is None:
            scratch = NodeData(node.nodeid)
            make(scratch)
            template = self.refs[key] = {f.name: getattr(scratch.references[0], f.name) for f in
                                         dataclasses.fields(ua.ReferenceDescription)} if scratch.references else False
        if template is False:  # asyncua added nothing (a parent without NodeClass)
            return
        for r in node.references:  # asyncua's unique-reference rule (a new node has one at most)
            if r.ReferenceTypeId == template["ReferenceTypeId"] and r.NodeId == template["NodeId"]:
                return
        node.references.append(ua.ReferenceDescription(**template))


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
    maker = _NodeMaker(service)
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
        maker.attributes(node, item)
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
        maker.own_references(node, item, parent.data)  # to its parent, to its type
    return len(items)


# ---- nodes registered now, built on first access ------------------------------------------


class PendingNodes(collections.abc.MutableMapping):
    """The dict asyncua keeps its nodes in (`aspace._nodes`), with nodes that are registered but
    not built yet: `pending` maps their NodeId to a function that builds them (and puts them in
    `inner`). Looking a pending node up (get, [], a client's read or browse of it) builds it
    first; `in`, iteration and len count it already. `inner`: the mapping it wraps (asyncua's
    dict or opcua_stdcache.LazyNodes)."""

    def __init__(self, inner):
        self.inner = inner
        self.pending: dict = {}

    def build(self, key) -> None:
        """Build the pending node `key` (KeyError if it is not pending)."""
        self.pending.pop(key)()

    def __getitem__(self, key):
        try:
            return self.inner[key]
        except KeyError:
            if key not in self.pending:
                raise
        self.build(key)
        return self.inner[key]

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __setitem__(self, key, value) -> None:
        self.pending.pop(key, None)
        self.inner[key] = value

    def __delitem__(self, key) -> None:
        if key in self.pending:
            self.build(key)  # asyncua deletes what it can look at
        del self.inner[key]

    def __contains__(self, key) -> bool:
        return key in self.pending or key in self.inner

    def __iter__(self):
        yield from list(self.inner)
        yield from list(self.pending)

    def __len__(self) -> int:
        return len(self.inner) + len(self.pending)


class LazyAdder:
    """Adds nodes as `add_nodes` does, but builds each one (attributes, own references) only when
    something first looks it up; `build_some(n)` builds pending ones meanwhile.

    `add(nid, parent, reftype, browse_name, node_class, display_name, typedef, make_item,
    children)` checks what `add_nodes` checks and puts the parent's forward reference in place at
    once (browsing the parent lists the node: same ReferenceDescription, same order); `make_item()`
    returns the node's AddNodesItem when it is built. `children`: (nid, make_item) of nodes whose
    parent is this one (its properties), added when this node is built, in that order (as
    `add_nodes` would have added them right after it); looking one up builds its parent first.
    Children are checked when added (their names are the adapter's fixed property names).
    `on_built(nid, node)` runs after each node is built. A node built here equals the node
    `add_nodes` makes from the same item (tests/adapters/test_opcua_lazy.py).
    """

    def __init__(self, iserver, on_built=None):
        service = iserver.node_mgt_service
        self.aspace = service._aspace
        nodes = self.aspace._nodes
        if not isinstance(nodes, PendingNodes):
            nodes = self.aspace._nodes = PendingNodes(nodes)
        self.nodes = nodes
        self.maker = _NodeMaker(service)
        self.has_property = ua.NodeId(ua.ObjectIds.HasProperty)
        self.parents: dict = {}
        self.on_built = on_built
        self.added = 0  # nodes registered here (children included)
        self.order: collections.deque = collections.deque()  # registration order, for build_some

    def _parent(self, nid, parent_nid) -> _ParentIndex:
        parent = self.parents.get(parent_nid)
        if parent is None:
            pdata = self.aspace.get(parent_nid)
            if pdata is None:
                raise BulkAddError(nid, ua.StatusCodes.BadParentNodeIdInvalid, f"parent {parent_nid} does not exist")
            parent = self.parents[parent_nid] = _ParentIndex(pdata, self.has_property)
        return parent

    def add(self, nid, parent_nid, reftype, browse_name, node_class, display_name, typedef, make_item,
            children=()) -> None:
        if nid in self.nodes:
            raise BulkAddError(nid, ua.StatusCodes.BadNodeIdExists, "already in the address space")
        parent = self._parent(nid, parent_nid)
        if browse_name.Name in parent.property_names:
            raise BulkAddError(nid, ua.StatusCodes.BadBrowseNameDuplicated,
                               f"parent {parent_nid} has a property {browse_name.Name!r}")
        if not typedef.is_null() and typedef not in self.nodes:
            raise BulkAddError(nid, ua.StatusCodes.BadTypeDefinitionInvalid,
                               f"type definition {typedef} does not exist")
        key = (reftype, nid)
        if key not in parent.keys:
            desc = ua.ReferenceDescription()
            desc.ReferenceTypeId = reftype
            desc.NodeId = nid
            desc.NodeClass = node_class
            desc.BrowseName = browse_name
            desc.DisplayName = display_name
            desc.TypeDefinition = typedef
            desc.IsForward = True
            parent.data.references.append(desc)
            parent.keys[key] = True
            if reftype == self.has_property:
                parent.property_names.add(browse_name.Name)
        pending = self.nodes.pending
        pending[nid] = lambda: self._build(nid, make_item, parent, children)
        self.order.append(nid)
        self.added += 1 + len(children)
        for child, _ in children:
            pending[child] = lambda child=child: self._via_parent(nid, child)

    def _build(self, nid, make_item, parent: _ParentIndex, children) -> None:
        item = make_item()
        node = NodeData(nid)
        self.maker.attributes(node, item)
        self.nodes.inner[nid] = node
        self.maker.own_references(node, item, parent.data)
        if self.on_built is not None:
            self.on_built(nid, node)
        for child, make_child in children:  # now as add_nodes would: the child's reference in this node
            self.nodes.pending.pop(child, None)  # popped already when looking it up built this node
            it = make_child()
            self.added -= 1  # counted with this node
            self.add(child, nid, it.ReferenceTypeId, it.BrowseName, it.NodeClass, it.NodeAttributes.DisplayName,
                     it.TypeDefinition, lambda it=it: it)

    def _via_parent(self, parent_nid, nid) -> None:
        self.nodes[parent_nid]  # builds the parent, which adds this node (pending again)
        self.nodes.build(nid)

    def build_some(self, n: int) -> int:
        """Build up to `n` pending nodes (oldest first); returns how many are still pending."""
        pending, order = self.nodes.pending, self.order
        while n > 0 and order:
            nid = order.popleft()
            if nid in pending:  # else built already (looked up, or with its parent)
                self.nodes.build(nid)
                n -= 1
        return len(pending)
