"""The SoftPLC's I/O: a Modbus TCP master over one connection (pymodbus 3.16 sync client).

Tags are planned once into blocks: each block is one request on a contiguous range of
one table (at most 125 registers / 2000 bits per read, 123 registers / 1968 coils per
write). Reads use FC3/FC4/FC1/FC2 per table; writes always use FC16 for registers and
FC15 for coils, even for a single value, as widely used SoftPLCs do.

Every transport failure (refused, reset, timeout, garbled answer) raises `CommError`
and closes the connection: the next connect starts clean, so a late answer to a timed-out
request can never be taken for the answer to a new one. A Modbus exception answer to a
read is a `CommError` too (the scan has no data); to a write it is counted by the caller.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hil.tagmap.modbus import BIT_TABLES, CompiledMap, Tag

MAX_READ = {"coil": 2000, "discrete_input": 2000, "input_register": 125, "holding_register": 125}
MAX_WRITE = {"coil": 1968, "holding_register": 123}
# Preference when a signal is mapped several times: the most precise encoding.
_RANK = {"float64": 0, "float32": 1, "int32": 2, "uint32": 2, "int16": 3, "uint16": 3, "bool": 4}


class CommError(Exception):
    """The request did not get a valid answer (transport or exception response)."""


class WriteRejected(Exception):
    """The server answered a write with a Modbus exception (code in .code)."""

    def __init__(self, code: int, block: "Block"):
        super().__init__(f"write to {block.table} {block.address}..{block.end} answered 0x{code:02X}")
        self.code = code


@dataclass(frozen=True)
class Block:
    table: str
    address: int
    count: int
    tags: tuple[Tag, ...]

    @property
    def end(self) -> int:
        return self.address + self.count - 1


def pick_tag(cmap: CompiledMap, signal: str, writable: bool) -> Tag:
    """The tag the PLC uses for `signal`: writable ones for outputs, most precise first."""
    tags = [t for t in cmap.tags if t.signal == signal and (t.writable or not writable)]
    if not writable:
        # a measurement is a sensor or an input's command as read back; prefer the sensor
        tags.sort(key=lambda t: (t.source == "command", _RANK[t.encoding], t.table, t.address))
    else:
        tags.sort(key=lambda t: (_RANK[t.encoding], t.table, t.address))
    if not tags:
        raise KeyError(f"{signal!r} has no {'writable ' if writable else ''}Modbus tag")
    return tags[0]


def plan_blocks(tags, max_count: dict[str, int]) -> tuple[Block, ...]:
    """Group tags into contiguous per-table blocks of at most max_count addresses."""
    blocks: list[Block] = []
    by_table: dict[str, list[Tag]] = {}
    for t in sorted(set(tags), key=lambda t: (t.table, t.address)):
        by_table.setdefault(t.table, []).append(t)
    for table, ts in by_table.items():
        cur: list[Tag] = []
        for t in ts:
            if cur and (t.address != cur[-1].address + cur[-1].n_words
                        or t.address + t.n_words - cur[0].address > max_count[table]):
                blocks.append(_block(table, cur))
                cur = []
            cur.append(t)
        if cur:
            blocks.append(_block(table, cur))
    return tuple(blocks)


def _block(table: str, tags: list[Tag]) -> Block:
    first, last = tags[0], tags[-1]
    return Block(table, first.address, last.address + last.n_words - first.address, tuple(tags))


class ModbusMaster:
    """One connection to the server; read and write planned blocks."""

    def __init__(self, host: str, port: int, unit_id: int, timeout_s: float):
        from pymodbus.client import ModbusTcpClient

        logging.getLogger("pymodbus").setLevel(logging.CRITICAL)  # we report comm state ourselves
        self.unit_id = unit_id
        self.client = ModbusTcpClient(host, port=port, timeout=timeout_s, retries=0)
        self.requests = 0

    @property
    def connected(self) -> bool:
        return self.client.connected

    def connect(self) -> bool:
        return bool(self.client.connect())

    def close(self) -> None:
        self.client.close()

    def _call(self, fn, *args, **kw):
        self.requests += 1
        try:
            rr = fn(*args, device_id=self.unit_id, **kw)
        except Exception as exc:  # ConnectionException, ModbusIOException, socket errors
            self.close()
            raise CommError(f"{type(exc).__name__}: {exc}") from None
        if rr is None:
            self.close()
            raise CommError("no response")
        return rr

    def read(self, blocks) -> dict[Tag, float]:
        """Values (plant units) of every tag of `blocks`; CommError on any failure."""
        c = self.client
        out: dict[Tag, float] = {}
        for b in blocks:
            fn = {"input_register": c.read_input_registers, "holding_register": c.read_holding_registers,
                  "coil": c.read_coils, "discrete_input": c.read_discrete_inputs}[b.table]
            rr = self._call(fn, b.address, count=b.count)
            if rr.isError():
                raise CommError(f"read {b.table} {b.address}..{b.end} answered "
                                f"0x{getattr(rr, 'exception_code', 0):02X}")
            if b.table in BIT_TABLES:
                bits = rr.bits
                if len(bits) < b.count:
                    self.close()
                    raise CommError("short answer")
                for t in b.tags:
                    out[t] = float(t.from_bit(bits[t.address - b.address]))
                    # a bit reads as on/off value; thresholds in the map define its meaning
            else:
                regs = rr.registers
                if len(regs) != b.count:
                    self.close()
                    raise CommError("short answer")
                for t in b.tags:
                    o = t.address - b.address
                    out[t] = t.from_registers(regs[o:o + t.n_words], sentinel_nan=True)
        return out

    def write(self, blocks, values: dict[Tag, float]) -> list[WriteRejected]:
        """Write every block (FC16 / FC15); returns the rejected blocks, CommError on failure."""
        c = self.client
        rejected = []
        for b in blocks:
            if b.table == "coil":
                payload = [t.to_bit(values[t]) for t in b.tags]
                rr = self._call(c.write_coils, b.address, payload)
            else:
                regs: list[int] = []
                for t in b.tags:
                    regs.extend(t.to_registers(values[t]))
                rr = self._call(c.write_registers, b.address, regs)
            if rr.isError():
                rejected.append(WriteRejected(getattr(rr, "exception_code", 0), b))
        return rejected
