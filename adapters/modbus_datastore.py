"""Modbus requests against the process image: the datastore behind our pymodbus server.

`ImageDatastore` implements the two calls every pymodbus 3.16 request PDU makes in its
`datastore_update(context, device_id)` (the same contract pymodbus's own `SimCore` and
`ModbusServerContext` fulfil):

    await async_getValues(device_id, func_code, address, count) -> list | ExcCodes
    await async_setValues(device_id, func_code, address, values) -> ExcCodes | None

Nothing is copied in advance: every read takes one consistent `snapshot()` of the image
(outputs and applied inputs) and/or one consistent copy of the commanded inputs, and
encodes just the requested tags, so a value is as old as the loop's last publish.

Rules (codes are Modbus exception codes):
- a read or write touching an unmapped address, or a write to a read-only tag, answers
  ILLEGAL DATA ADDRESS (0x02);
- a write must cover whole values: writing one register of a float32 (or any part of a
  multi-register value) answers ILLEGAL DATA ADDRESS (0x02): the address/count pair does
  not name whole data items. Nothing is written;
- a written value that decodes to non-finite, or lies outside the input's physical
  bounds by more than the encoding's round-off, answers ILLEGAL DATA VALUE (0x03); a
  value within the round-off of a bound is clamped to it;
- a multi-register or multi-coil write is all or nothing: every value is checked first,
  then all are written with one `image.write_inputs` (atomic for the loop).
"""

from __future__ import annotations

import math
import time

from pymodbus.constants import ExcCodes

from hil.image import H_OUT_SEQ, ProcessImage
from hil.tagmap.modbus import BIT_TABLES, CompiledMap, Tag

FC_TABLE = {1: "coil", 5: "coil", 15: "coil", 2: "discrete_input", 4: "input_register",
            3: "holding_register", 6: "holding_register", 16: "holding_register",
            22: "holding_register", 23: "holding_register"}
MAX_READ = {"coil": 2000, "discrete_input": 2000, "input_register": 125, "holding_register": 125}
MAX_WRITE = {"coil": 1968, "holding_register": 123}
PLAN_CACHE_SIZE = 4096  # resolved (fc, address, count) reads kept; pollers repeat theirs


class ImageDatastore:
    """Serves one compiled map from one process image.

    After each call, `last_step` / `last_publish_ns` name the image publish a read was
    served from (-1 if none), `last_served_ns` the monotonic ns right after that snapshot
    was taken (-1 if none) and `last_write_seq` the image's input-write count after a
    write (-1 if none): the request log records them.
    """

    def __init__(self, cmap: CompiledMap, image: ProcessImage):
        self.cmap = cmap
        self.image = image
        self.tags = cmap.tags
        self.lookup = cmap.lookup
        self.unit_ids = frozenset({cmap.unit_id, 0, 255})
        self._plans: dict = {}
        self.begin()

    def begin(self) -> None:
        self.last_step = -1
        self.last_publish_ns = -1
        self.last_served_ns = -1
        self.last_write_seq = -1

    def device_ids(self) -> list[int]:
        return sorted(self.unit_ids)

    def published(self) -> bool:
        """The loop has published outputs at least once (its initial publish, before any
        step): until then there is nothing true to serve and no loop to take a write."""
        return int(self.image.header[H_OUT_SEQ]) > 0

    # ---- pymodbus datastore contract ----
    async def async_getValues(self, device_id: int, func_code: int, address: int, count: int = 1):
        return self.read(func_code, address, count)

    async def async_setValues(self, device_id: int, func_code: int, address: int, values):
        return self.write(func_code, address, values)

    # ---- reads ----
    def read(self, func_code: int, address: int, count: int):
        """Values of `count` addresses from `address` of the table `func_code` addresses."""
        key = (func_code, address, count)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(func_code, address, count)
            if len(self._plans) >= PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[key] = plan
        if not isinstance(plan, tuple):
            return plan  # an exception code
        numbers, segments, bits = plan
        values = self._values_of(numbers)
        tags = self.tags
        if bits:
            return [tags[n].to_bit(values[n]) for n in numbers]
        out: list[int] = []
        for n, w0, w1 in segments:
            out.extend(tags[n].to_registers(values[n])[w0:w1])
        return out

    def check_read(self, func_code: int, address: int, count: int):
        """The exception code a read would answer, or None (nothing is read)."""
        plan = self._plan(func_code, address, count)
        return plan if isinstance(plan, ExcCodes) else None

    def _plan(self, func_code: int, address: int, count: int):
        """Resolve a read once: (tag numbers, (tag, first word, end word) segments, bits?)."""
        table = FC_TABLE.get(func_code)
        if table is None:
            return ExcCodes.ILLEGAL_FUNCTION
        if not 1 <= count <= MAX_READ[table]:
            return ExcCodes.ILLEGAL_VALUE
        lookup = self.lookup[table]
        segments: list[list[int]] = []
        for a in range(address, address + count):
            slot = lookup.get(a)
            if slot is None:
                return ExcCodes.ILLEGAL_ADDRESS
            n, w = slot
            if segments and segments[-1][0] == n and segments[-1][2] == w:
                segments[-1][2] = w + 1
            else:
                segments.append([n, w, w + 1])
        numbers = tuple(s[0] for s in segments)
        return numbers, tuple(tuple(s) for s in segments), table in BIT_TABLES

    def _values_of(self, numbers) -> dict[int, float]:
        """Plant-unit values of the tags: one snapshot and/or one input copy per request."""
        tags = self.tags
        snap = cmd = outputs = applied = None
        out = {}
        for n in numbers:
            t: Tag = tags[n]
            if t.source == "command":
                if cmd is None:
                    cmd = self.image.read_inputs().tolist()
                out[n] = cmd[t.index]
                continue
            if snap is None:
                snap = self.image.snapshot()
                self.last_served_ns = time.monotonic_ns()
                self.last_step, self.last_publish_ns = snap.step, snap.publish_ns
                outputs, applied = snap.outputs.tolist(), snap.applied.tolist()
            out[n] = (outputs if t.source == "measured" else applied)[t.index]
        return out

    # ---- writes ----
    def write(self, func_code: int, address: int, values):
        """Check every value, then write all of them at once; None or an exception code."""
        table = FC_TABLE.get(func_code)
        if table is None or table not in MAX_WRITE:
            return ExcCodes.ILLEGAL_FUNCTION
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        if not 1 <= len(values) <= MAX_WRITE[table]:
            return ExcCodes.ILLEGAL_VALUE
        lookup = self.lookup[table]
        # group the addressed words by tag, checking access and whole-value coverage
        groups: list[tuple[Tag, list]] = []
        a = address
        i = 0
        while i < len(values):
            slot = lookup.get(a)
            if slot is None:
                return ExcCodes.ILLEGAL_ADDRESS
            n, w = slot
            tag = self.tags[n]
            if not tag.writable or w != 0 or i + tag.n_words > len(values):
                return ExcCodes.ILLEGAL_ADDRESS
            groups.append((tag, values[i:i + tag.n_words]))
            i += tag.n_words
            a += tag.n_words
        indices, decoded = [], []
        for tag, raw in groups:
            if table in BIT_TABLES:
                value = tag.from_bit(bool(raw[0]))
            else:
                if any(not 0 <= int(r) <= 0xFFFF for r in raw):
                    return ExcCodes.ILLEGAL_VALUE
                value = tag.from_registers(raw)
            value = _checked(tag, value)
            if value is None:
                return ExcCodes.ILLEGAL_VALUE
            indices.append(tag.index)
            decoded.append(value)
        self.last_write_seq = self.image.write_inputs(indices, decoded)
        return None


def _checked(tag: Tag, value: float) -> float | None:
    """The value to store, clamped within round-off of a bound; None if it is refused."""
    if not math.isfinite(value):
        return None
    if tag.low <= value <= tag.high:
        return value
    tol = tag.tolerance
    if tag.low - tol <= value < tag.low:
        return tag.low
    if tag.high < value <= tag.high + tol:
        return tag.high
    return None
