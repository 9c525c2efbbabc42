"""A cache of asyncua's standard OPC UA address space, so that a server start does not rebuild it.

asyncua 2.1 builds the standard address space (~6200 nodes: the types, the Server object...)
at every `Server.init()` from generated Python code: 1.6-1.9 s of the OPC UA server's start
on a loaded 2-core machine, the same nodes every time. The first start builds them as before
and stores them here; later starts read them back lazily: a node is unpickled the first time
something looks it up (the server's own set-up touches a few hundred), as asyncua's own
`load_aspace_shelf` does, but from one file read into memory at once.

Where: `opcua/standard-space-asyncua<version>-py<major>.<minor>.pickle` under
`$HIL_CACHE_DIR`, else `$XDG_CACHE_HOME/hil`, else `~/.cache/hil` (the directory of the
Numba step cache, hil/loop/specialize.py). The asyncua and Python versions are in the name
and checked again inside, so an upgrade never reads an old file. Removing the file is always
safe (the next start writes it again).

Format: a header line (`MAGIC`), the SHA-256 of the payload (hex, one line), then the payload:
a pickle of {"asyncua", "python", "nodes": {NodeId string: pickled NodeData}}. The file is
read only if it is a regular file owned by this user and not writable by group or others
(a pickle runs code when read: nobody else may be able to write it), its header and hash
match and its versions are this process's; anything else is logged and the space is built
afresh and the file written again. Written atomically (a private temporary file in the same
directory, then os.replace): two servers starting at once each write a complete file and
one of them stays; a reader never sees a partial one.

`LazyNodes` behaves as the dict asyncua keeps its nodes in (iteration and len cover the
nodes not yet read too, unlike asyncua's LazyLoadingDict). tests/adapters/test_opcua_stdcache.py
compares a server started from the cache with a fresh one node for node.
"""

from __future__ import annotations

import collections.abc
import hashlib
import logging
import os
import pickle
import stat
import sys
import tempfile
from pathlib import Path

import asyncua
from asyncua import ua

log = logging.getLogger("hil.opcua")
MAGIC = b"hil-opcua-standard-space 1\n"
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def asyncua_version() -> str:
    return str(getattr(asyncua, "__version__", "unknown"))


def _python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def cache_path() -> Path:
    """The cache file for this asyncua and Python (it may not exist)."""
    base = os.environ.get("HIL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hil")
    name = f"standard-space-asyncua{asyncua_version()}-py{_python()}.pickle"
    return Path(base) / "opcua" / name


class CacheRejected(Exception):
    """The cache file exists but is not used (the message says why)."""


class LazyNodes(collections.abc.MutableMapping):
    """NodeId -> NodeData, reading each stored node on first access.

    `source`: {NodeId string: pickled NodeData}. A node read, set or deleted leaves the
    source, so the mapping is always exactly the loaded nodes plus the ones still stored.
    """

    def __init__(self, source: dict[str, bytes]):
        self._source = source
        self._cache: dict = {}
        # namespaces with stored nodes (the standard space: 0): a lookup of another namespace's
        # node (the scenario's, thousands at start-up) skips NodeId.to_string
        self._stored_ns = {int(k[3:k.index(";")]) if k.startswith("ns=") else 0 for k in source}

    def __getitem__(self, key):
        try:
            return self._cache[key]
        except KeyError:
            pass
        if not isinstance(key, ua.NodeId):
            raise KeyError(key)
        blob = self._source.pop(key.to_string(), None)
        if blob is None:
            raise KeyError(key)
        node = self._cache[key] = pickle.loads(blob)
        return node

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __setitem__(self, key, value) -> None:
        if isinstance(key, ua.NodeId):
            self._source.pop(key.to_string(), None)
        self._cache[key] = value

    def __delitem__(self, key) -> None:
        if key in self._cache:
            del self._cache[key]
        elif not isinstance(key, ua.NodeId) or self._source.pop(key.to_string(), None) is None:
            raise KeyError(key)

    def __contains__(self, key) -> bool:
        return key in self._cache or (isinstance(key, ua.NodeId) and key.NamespaceIndex in self._stored_ns
                                      and key.to_string() in self._source)

    def __iter__(self):
        yield from list(self._cache)
        for s in list(self._source):
            yield ua.NodeId.from_string(s)

    def __len__(self) -> int:
        return len(self._cache) + len(self._source)

    @property
    def stored(self) -> int:
        """Nodes not read yet."""
        return len(self._source)


def _check_file(path: Path) -> bytes:
    """The file's bytes if it may be trusted to unpickle (ours, not writable by others)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheRejected("not a regular file")
        if st.st_uid != os.getuid():
            raise CacheRejected(f"owned by uid {st.st_uid}, not by this user ({os.getuid()})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise CacheRejected(f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def read(path: Path) -> dict[str, bytes]:
    """The stored nodes of a valid cache file; raises CacheRejected (why) or OSError."""
    data = _check_file(path)
    if not data.startswith(MAGIC):
        raise CacheRejected("not a hil standard-space cache (header)")
    head = len(MAGIC)
    digest, payload = data[head:head + 64], data[head + 65:]
    if data[head + 64:head + 65] != b"\n" or hashlib.sha256(payload).hexdigest().encode() != digest:
        raise CacheRejected("checksum mismatch (truncated or corrupt)")
    try:
        content = pickle.loads(payload)
    except Exception as exc:  # a file that passed the checks but does not load (e.g. moved classes)
        raise CacheRejected(f"does not unpickle: {type(exc).__name__}: {exc}") from None
    if not isinstance(content, dict) or content.get("asyncua") != asyncua_version() \
            or content.get("python") != _python():
        raise CacheRejected(f"written by asyncua {content.get('asyncua')!r} / Python {content.get('python')!r}"
                            if isinstance(content, dict) else "unexpected content")
    nodes = content.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        raise CacheRejected("no nodes")
    return nodes


def write(path: Path, nodes) -> int:
    """Store `nodes` ({NodeId: NodeData}, asyncua's standard space before any server set-up)
    atomically at `path` (mode 0600, directory 0700); returns the file's size in bytes."""
    blobs = {}
    for nid, node in nodes.items():
        if node.call is not None:  # a method callback: not the standard space as generated
            raise ValueError(f"node {nid} has a method callback; only the generated standard space is cached")
        blobs[nid.to_string()] = pickle.dumps(node, _PROTOCOL)
    payload = pickle.dumps({"asyncua": asyncua_version(), "python": _python(), "nodes": blobs}, _PROTOCOL)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC)
            f.write(hashlib.sha256(payload).hexdigest().encode() + b"\n")
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return len(payload) + len(MAGIC) + 65


def load_into(aspace, path: Path | None = None) -> str | None:
    """Put the cached standard space into `aspace` (an empty asyncua AddressSpace): None when it
    did, else why not (no file yet, or rejected; the caller then builds it and calls `store`)."""
    path = path or cache_path()
    try:
        nodes = read(path)
    except FileNotFoundError:
        return f"no cache yet at {path}"
    except (OSError, CacheRejected) as exc:
        return f"cache {path} not used: {exc}"
    aspace._nodes = LazyNodes(nodes)
    return None


def store(aspace, path: Path | None = None) -> str:
    """Write the freshly built standard space of `aspace` to the cache; returns what happened
    (a failure to write is reported, never raised: the server runs without the cache)."""
    path = path or cache_path()
    try:
        size = write(path, aspace._nodes)
    except (OSError, ValueError, pickle.PicklingError) as exc:
        return f"standard space not cached at {path}: {type(exc).__name__}: {exc}"
    return f"standard space cached at {path} ({size / 1e6:.1f} MB)"
