"""Per-client counters and the bounded request log of the Modbus server.

Counters (`ClientStats.as_dict()`), keyed by the client's "host:port":

    {"clients": {"127.0.0.1:50412": {"requests": 12, "reads": 10, "writes": 2,
                                     "exceptions": {"0x02": 1, "0x03": 1},
                                     "connects": 1, "connected": false,
                                     "first_ns": ..., "last_ns": ...}, ...},
     "totals": {"requests": ..., "reads": ..., "writes": ..., "exceptions": {...},
                "connects": ..., "evicted_clients": 0,
                "refused_connections": 0, "idle_closed": 0}}

At most `max_clients` clients are kept; beyond that the least recently active
disconnected client is folded into the totals only (`evicted_clients` counts them), so a
tool that opens one connection per request cannot grow the dict without bound.

Request log: one record per answered request, kept in a ring of `size` records (oldest
dropped, `dropped` counts them) and written at shutdown by `RequestLog.dump(path)`:
JSON Lines for a `.jsonl` path, Parquet (pyarrow) for `.parquet`. Columns / keys:

    t_ns        int   time.monotonic_ns() when the request was decoded (server process)
    dur_ns      int   decode -> response handed to the transport
    peer        str   client "host:port"
    unit        int   unit id (device id) of the request
    fc          int   function code
    address     int   first address (FC23: the write address if it wrote, else read)
    count       int   addresses read or written (FC23: read count)
    wrote       bool  the request changed the image (an accepted write)
    exc         int   exception code answered, 0 if none
    step        int   loop step of the image publish a read was served from, -1 if none
    publish_ns  int   monotonic ns of that publish (same clock as t_ns: age = t_ns - it)
    write_seq   int   image input-write count after an accepted write, -1 if none
                      (the loop's `input_writes_applied` reaching it = write took effect)
    served_ns   int   monotonic ns right after the image snapshot a read was served from was
                      taken (-1 if none): served_ns - publish_ns = age of the values when they
                      left the image, without the server's decode/encode or the transport
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from pathlib import Path

FIELDS = ("t_ns", "dur_ns", "peer", "unit", "fc", "address", "count", "wrote", "exc",
          "step", "publish_ns", "write_seq", "served_ns")


def _new_client() -> dict:
    return {"requests": 0, "reads": 0, "writes": 0, "exceptions": {}, "connects": 0,
            "connected": False, "first_ns": 0, "last_ns": 0}


class ClientStats:
    """Requests, writes and exception codes per client, plus totals."""

    def __init__(self, max_clients: int = 1024):
        self.max_clients = max_clients
        self.clients: OrderedDict[str, dict] = OrderedDict()
        self.totals = {"requests": 0, "reads": 0, "writes": 0, "exceptions": {}, "connects": 0,
                       "evicted_clients": 0, "refused_connections": 0, "idle_closed": 0}

    def _client(self, peer: str, t_ns: int) -> dict:
        c = self.clients.get(peer)
        if c is None:
            c = self.clients[peer] = _new_client()
            c["first_ns"] = t_ns
            self._evict()
        else:
            self.clients.move_to_end(peer)
        c["last_ns"] = t_ns
        return c

    def _evict(self) -> None:
        while len(self.clients) > self.max_clients:
            victim = next((p for p, c in self.clients.items() if not c["connected"]), None)
            if victim is None:
                return
            del self.clients[victim]
            self.totals["evicted_clients"] += 1

    def connected(self, peer: str, t_ns: int) -> None:
        c = self._client(peer, t_ns)
        c["connects"] += 1
        c["connected"] = True
        self.totals["connects"] += 1

    def refused(self) -> None:
        """A connection beyond `[modbus] max_connections`, closed at once (no client entry)."""
        self.totals["refused_connections"] += 1

    def idle_closed(self) -> None:
        """A connection closed by the server after `[modbus] idle_timeout_s` of silence."""
        self.totals["idle_closed"] += 1

    def disconnected(self, peer: str, t_ns: int) -> None:
        c = self.clients.get(peer)
        if c is not None:
            c["connected"] = False
            c["last_ns"] = t_ns

    def request(self, peer: str, t_ns: int, wrote_attempt: bool, exc: int) -> None:
        c = self._client(peer, t_ns)
        for d in (c, self.totals):
            d["requests"] += 1
            d["writes" if wrote_attempt else "reads"] += 1
            if exc:
                key = f"0x{exc:02X}"
                d["exceptions"][key] = d["exceptions"].get(key, 0) + 1

    def exceptions_of(self, peer: str) -> dict[str, int]:
        return dict(self.clients.get(peer, {}).get("exceptions", {}))

    def as_dict(self) -> dict:
        return {
            "clients": {p: {**c, "exceptions": dict(c["exceptions"])} for p, c in self.clients.items()},
            "totals": {**self.totals, "exceptions": dict(self.totals["exceptions"])},
        }


class RequestLog:
    """Bounded ring of request records (tuples in FIELDS order)."""

    def __init__(self, size: int = 100_000):
        self.size = size
        self.records: deque = deque(maxlen=size)
        self.appended = 0

    def append(self, record: tuple) -> None:
        self.appended += 1
        if self.size:
            self.records.append(record)

    @property
    def dropped(self) -> int:
        return self.appended - len(self.records)

    def rows(self) -> list[dict]:
        return [dict(zip(FIELDS, r)) for r in self.records]

    def dump(self, path: str | Path) -> Path:
        """Write the kept records: Parquet if the path ends in .parquet, else JSON Lines."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        if path.suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            cols = list(zip(*self.records)) if self.records else [[] for _ in FIELDS]
            types = [pa.int64(), pa.int64(), pa.string(), pa.int64(), pa.int64(), pa.int64(),
                     pa.int64(), pa.bool_(), pa.int64(), pa.int64(), pa.int64(), pa.int64(), pa.int64()]
            table = pa.table({f: pa.array(list(c), type=t) for f, c, t in zip(FIELDS, cols, types)})
            pq.write_table(table, tmp)
        else:
            with open(tmp, "w") as fh:
                for r in self.records:
                    fh.write(json.dumps(dict(zip(FIELDS, r)), separators=(",", ":")) + "\n")
        tmp.replace(path)
        return path


def read_request_log(path: str | Path):
    """The dumped log as a pandas DataFrame (either format)."""
    import pandas as pd

    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    return pd.read_json(path, lines=True)
