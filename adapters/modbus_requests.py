"""Field checks of a Modbus request PDU, before pymodbus decodes it (Modbus Application
Protocol Specification V1.1b3, section 6, the per-function state diagrams).

`check_request(pdu)` takes the PDU of one complete request (function code onward, the
bytes the MBAP length covers after the unit id) of a served data-access code and returns
None if its fields are well-formed, or a `Refusal(code, reason, address, count)`:
ILLEGAL DATA VALUE (0x03) for

- FC1/FC2 with a quantity outside 1..2000 (0x7D0), FC3/FC4 outside 1..125 (0x7D);
- FC5 (write single coil) with an output value other than 0x0000 (OFF) or 0xFF00 (ON):
  pymodbus decodes any non-zero value as ON;
- FC15 with a quantity outside 1..1968 (0x7B0), FC16 outside 1..123 (0x7B), FC23 with a
  read quantity outside 1..125 or a write quantity outside 1..121 (0x79);
- FC15/FC16/FC23 whose byte count is not the one the quantity needs (ceil(n/8) bytes of
  coils, 2 bytes per register) or not the number of value bytes that follow;
- a PDU whose length is not the one its function code's fields take (a truncated request
  or trailing bytes).

pymodbus 3.16 answers most of these ILLEGAL FUNCTION (0x01) (its decoder raises on a
count it does not like) or, for FC5, writes the coil ON: hence this check runs first.
Addresses are the datastore's business (ILLEGAL DATA ADDRESS, 0x02), as in the spec's
order: function code, then quantity/value, then address.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from pymodbus.constants import ExcCodes

COIL_OFF, COIL_ON = 0x0000, 0xFF00
MAX_READ_BITS = 2000  # FC1/FC2 quantity (coils, discrete inputs)
MAX_READ_REGISTERS = 125  # FC3/FC4, FC23 read quantity (registers)
MAX_WRITE_COILS = 1968  # FC15 quantity
MAX_WRITE_REGISTERS = 123  # FC16 quantity
MAX_RW_WRITE_REGISTERS = 121  # FC23 write quantity
NAMES = {1: "read coils", 2: "read discrete inputs", 3: "read holding registers",
         4: "read input registers", 5: "write single coil", 6: "write single register",
         15: "write multiple coils", 16: "write multiple registers", 22: "mask write register",
         23: "read/write multiple registers"}
FIXED_LENGTH = {1: 5, 2: 5, 3: 5, 4: 5, 5: 5, 6: 5, 22: 7}  # PDU bytes, function code included


class Refusal(NamedTuple):
    """Why a request is refused: the exception code, a reason for the log, its span."""

    code: ExcCodes
    reason: str
    address: int
    count: int


def _value(reason: str, address: int = 0, count: int = 0) -> Refusal:
    return Refusal(ExcCodes.ILLEGAL_VALUE, reason, address, count)


def check_request(pdu: bytes) -> Refusal | None:
    """None if the request's fields are well-formed, else why it is refused (see module)."""
    fc = pdu[0]
    name = NAMES.get(fc)
    if name is None:
        return None  # not a data-access code: refused elsewhere (ILLEGAL FUNCTION)
    n = len(pdu)
    fixed = FIXED_LENGTH.get(fc)
    if fixed is not None:
        if n != fixed:
            return _value(f"{name}: {n}-byte request, expected {fixed}")
        address, value = struct.unpack_from(">HH", pdu, 1)
        if fc in (1, 2) and not 1 <= value <= MAX_READ_BITS:
            return _value(f"{name}: quantity {value} outside 1..{MAX_READ_BITS}", address, value)
        if fc in (3, 4) and not 1 <= value <= MAX_READ_REGISTERS:
            return _value(f"{name}: quantity {value} outside 1..{MAX_READ_REGISTERS}", address, value)
        if fc == 5 and value not in (COIL_OFF, COIL_ON):
            return _value(f"{name}: value 0x{value:04X} is neither 0x0000 (off) nor 0xFF00 (on)",
                          address, 1)
        return None
    if fc == 23:
        if n < 10:
            return _value(f"{name}: {n}-byte request, expected at least 10")
        read_address, read_count, address, count, byte_count = struct.unpack_from(">HHHHB", pdu, 1)
        if not 1 <= read_count <= MAX_READ_REGISTERS:
            return _value(f"{name}: read quantity {read_count} outside 1..{MAX_READ_REGISTERS}",
                          read_address, read_count)
        limit, expected, head = MAX_RW_WRITE_REGISTERS, 2 * count, 10
    else:  # 15, 16
        if n < 6:
            return _value(f"{name}: {n}-byte request, expected at least 6")
        address, count, byte_count = struct.unpack_from(">HHB", pdu, 1)
        limit = MAX_WRITE_COILS if fc == 15 else MAX_WRITE_REGISTERS
        expected = (count + 7) // 8 if fc == 15 else 2 * count
        head = 6
    if not 1 <= count <= limit:
        return _value(f"{name}: quantity {count} outside 1..{limit}", address, count)
    if byte_count != expected:
        return _value(f"{name}: byte count {byte_count} for {count} values, expected {expected}",
                      address, count)
    if n - head != byte_count:
        return _value(f"{name}: byte count {byte_count} but {n - head} value bytes follow",
                      address, count)
    return None
