"""adapters/opcua_stdcache.py: a server started from the cached standard address space is the
server built afresh, node for node; a cache that is corrupt, foreign or from another asyncua
is never read (the space is built and the file written again); writes are atomic.

Each server runs the whole of asyncua's init (standard space, then its fixes and set-up writes),
one with `standard_cache` unset (asyncua's own build), one from a cache file written by a
first start. Compared for every node of the fresh space: node id, browse name, display name,
node class, data type, access levels, value rank, every attribute's value and status (time
stamps aside: asyncua stamps them at build time), and the references (all fields, in order).
"""

from __future__ import annotations

import asyncio
import os

import pytest
from asyncua import ua

from adapters import opcua_stdcache
from adapters.opcua_writes import GuardedInternalServer


async def _server(cache) -> GuardedInternalServer:
    iserver = GuardedInternalServer()
    iserver.standard_cache = cache
    await iserver.init()
    return iserver


def _node(iserver, nid) -> tuple:
    data = iserver.aspace[nid]
    attrs = {aid: (av.value.Value, av.value.StatusCode) for aid, av in data.attributes.items()}
    refs = [(r.ReferenceTypeId, r.IsForward, r.NodeId, r.BrowseName, r.DisplayName, r.NodeClass, r.TypeDefinition)
            for r in data.references]
    return attrs, refs


def test_cached_standard_space_equals_fresh_node_for_node(tmp_path):
    path = tmp_path / "std.pickle"

    async def build():
        first = await _server(path)  # builds, then writes the cache
        assert first.standard_space_note.startswith("built (no cache yet"), first.standard_space_note
        assert path.is_file() and (path.stat().st_mode & 0o077) == 0
        fresh = await _server(None)
        cached = await _server(path)
        assert cached.standard_space_note == f"read from {path}"
        assert isinstance(cached.aspace._nodes, opcua_stdcache.LazyNodes)
        lazy_before = cached.aspace._nodes.stored
        assert lazy_before > 4000  # most standard nodes not read by the set-up
        nids = list(fresh.aspace.keys())
        assert len(nids) > 6000
        assert set(cached.aspace.keys()) == set(nids)  # iteration covers the unread nodes too
        assert len(cached.aspace._nodes) == len(nids)
        return [(nid, _node(fresh, nid), _node(cached, nid)) for nid in nids]

    compared = asyncio.run(build())
    for nid, a, b in compared:
        assert a == b, nid
    # the attributes the brief names, for one variable of the Server object
    nid = ua.NodeId(ua.ObjectIds.Server_ServerStatus_CurrentTime)
    attrs = dict(next(a for n, a, _ in compared if n == nid)[0])
    for aid in (ua.AttributeIds.BrowseName, ua.AttributeIds.DataType, ua.AttributeIds.AccessLevel,
                ua.AttributeIds.ValueRank):
        assert aid in attrs


@pytest.fixture(scope="module")
def cache_bytes(tmp_path_factory) -> bytes:
    """A valid cache file's bytes, written by one server start."""
    path = tmp_path_factory.mktemp("stdcache") / "std.pickle"
    asyncio.run(_server(path))
    return path.read_bytes()


def _cache(tmp_path, data: bytes):
    path = tmp_path / "std.pickle"
    path.write_bytes(data)
    os.chmod(path, 0o600)
    return path


@pytest.mark.parametrize("damage", ["truncate", "flip", "header", "group_writable"])
def test_damaged_or_foreign_cache_is_rebuilt_not_read(tmp_path, damage, cache_bytes):
    path = _cache(tmp_path, cache_bytes)
    opcua_stdcache.read(path)  # valid before the damage

    async def run():
        data = cache_bytes
        if damage == "truncate":
            path.write_bytes(data[: len(data) // 2])
        elif damage == "flip":
            k = len(data) - 1000
            path.write_bytes(data[:k] + bytes([data[k] ^ 0xFF]) + data[k + 1:])
        elif damage == "header":
            path.write_bytes(b"x" + data[1:])
        else:
            os.chmod(path, 0o620)
        again = await _server(path)
        return again.standard_space_note

    note = asyncio.run(run())
    assert note.startswith(f"built (cache {path} not used: "), note
    why = {"truncate": "checksum", "flip": "checksum", "header": "header", "group_writable": "writable by group"}
    assert why[damage] in note
    assert "standard space cached at" in note  # written again, complete
    opcua_stdcache.read(path)  # and valid


def test_other_asyncua_version_is_not_read(tmp_path, monkeypatch, cache_bytes):
    path = _cache(tmp_path, cache_bytes)
    monkeypatch.setattr(opcua_stdcache, "asyncua_version", lambda: "0.0-other")
    with pytest.raises(opcua_stdcache.CacheRejected, match="written by asyncua"):
        opcua_stdcache.read(path)
    assert "0.0-other" in opcua_stdcache.cache_path().name


def test_cache_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("HIL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert opcua_stdcache.cache_path().parent == tmp_path / "xdg" / "hil" / "opcua"
    monkeypatch.setenv("HIL_CACHE_DIR", str(tmp_path / "own"))
    assert opcua_stdcache.cache_path().parent == tmp_path / "own" / "opcua"


def test_write_is_atomic_and_leaves_no_temporary(tmp_path, cache_bytes):
    """A second writer replaces the file whole; a reader holding the first copy is unaffected."""
    path = _cache(tmp_path, cache_bytes)
    held = opcua_stdcache.read(path)
    nodes = {ua.NodeId.from_string(k): __import__("pickle").loads(v) for k, v in list(held.items())[:50]}
    opcua_stdcache.write(path, nodes)
    assert [p.name for p in tmp_path.iterdir()] == ["std.pickle"]
    assert len(opcua_stdcache.read(path)) == 50
    assert len(held) > 6000


def test_lazy_nodes_is_a_mapping():
    import pickle

    from asyncua.server.address_space import NodeData

    a, b = ua.NodeId(1, 0), ua.NodeId("x", 2)
    m = opcua_stdcache.LazyNodes({a.to_string(): pickle.dumps(NodeData(a))})
    assert a in m and b not in m and len(m) == 1 and m.stored == 1
    assert m[a].nodeid == a and m.stored == 0 and m.get(b) is None
    m[b] = NodeData(b)
    assert set(m) == {a, b} and len(m) == 2
    del m[a]
    assert a not in m and len(m) == 1
    with pytest.raises(KeyError):
        del m[a]
