"""check_request: the spec's quantity, value and byte-count rules on raw request PDUs."""

import struct

import pytest
from pymodbus.constants import ExcCodes

from adapters.modbus_requests import check_request


def pdu(fc, fmt, *fields, tail=b""):
    return struct.pack(">B" + fmt, fc, *fields) + tail


@pytest.mark.parametrize("fc,limit", [(1, 2000), (2, 2000), (3, 125), (4, 125)])
def test_read_quantities_outside_the_spec_range_are_illegal_data_value(fc, limit):
    assert check_request(pdu(fc, "HH", 7, 1)) is None
    assert check_request(pdu(fc, "HH", 7, limit)) is None
    for bad in (0, limit + 1, 0xFFFF):
        r = check_request(pdu(fc, "HH", 7, bad))
        assert r.code == ExcCodes.ILLEGAL_VALUE and f"quantity {bad}" in r.reason
        assert (r.address, r.count) == (7, bad)


@pytest.mark.parametrize("value", [0x0001, 0x00FF, 0x1234, 0xFF01, 0xFFFF, 0x8000])
def test_write_single_coil_takes_only_off_and_on(value):
    assert check_request(pdu(5, "HH", 3, 0x0000)) is None
    assert check_request(pdu(5, "HH", 3, 0xFF00)) is None
    r = check_request(pdu(5, "HH", 3, value))
    assert r.code == ExcCodes.ILLEGAL_VALUE and f"0x{value:04X}" in r.reason


def test_write_multiple_coils_quantity_and_byte_count():
    assert check_request(pdu(15, "HHB", 0, 9, 2, tail=b"\xff\x01")) is None
    assert check_request(pdu(15, "HHB", 0, 1968, 246, tail=bytes(246))) is None
    bad = [pdu(15, "HHB", 0, 0, 0),  # quantity 0
           pdu(15, "HHB", 0, 1969, 247, tail=bytes(247)),  # above 1968
           pdu(15, "HHB", 0, 9, 1, tail=b"\xff"),  # 9 coils need 2 bytes
           pdu(15, "HHB", 0, 9, 2, tail=b"\xff"),  # 2 announced, 1 follows
           pdu(15, "HHB", 0, 9, 2, tail=b"\xff\x01\x00"),  # 3 follow
           pdu(15, "HH", 0, 9)]  # truncated before the byte count
    for p in bad:
        assert check_request(p).code == ExcCodes.ILLEGAL_VALUE, p.hex()


def test_write_multiple_registers_quantity_and_byte_count():
    assert check_request(pdu(16, "HHBHH", 0, 2, 4, 1, 2)) is None
    assert check_request(pdu(16, "HHB", 0, 123, 246, tail=bytes(246))) is None
    bad = [pdu(16, "HHB", 0, 0, 0), pdu(16, "HHB", 0, 124, 248, tail=bytes(248)),
           pdu(16, "HHBH", 0, 2, 2, 1), pdu(16, "HHBH", 0, 2, 4, 1), pdu(16, "HHBHHH", 0, 2, 4, 1, 2, 3)]
    for p in bad:
        assert check_request(p).code == ExcCodes.ILLEGAL_VALUE, p.hex()


def test_read_write_multiple_registers_quantities_and_byte_count():
    assert check_request(pdu(23, "HHHHBH", 0, 125, 4, 1, 2, 9)) is None
    bad = [pdu(23, "HHHHBH", 0, 0, 4, 1, 2, 9), pdu(23, "HHHHBH", 0, 126, 4, 1, 2, 9),
           pdu(23, "HHHHB", 0, 1, 4, 0, 0), pdu(23, "HHHHB", 0, 1, 4, 122, 244, tail=bytes(244)),
           pdu(23, "HHHHBH", 0, 1, 4, 1, 4, 9)]
    for p in bad:
        assert check_request(p).code == ExcCodes.ILLEGAL_VALUE, p.hex()


def test_lengths_that_do_not_fit_the_function_code_are_refused():
    for p in (bytes([3, 0, 0, 0]), pdu(6, "HHB", 0, 1, 0), pdu(22, "HH", 0, 1), bytes([5])):
        r = check_request(p)
        assert r.code == ExcCodes.ILLEGAL_VALUE and "byte request" in r.reason, p.hex()
    assert check_request(pdu(6, "HH", 0, 0xFFFF)) is None
    assert check_request(pdu(22, "HHH", 0, 0xFF00, 0x00FF)) is None


def test_codes_it_does_not_know_are_left_to_the_server():
    assert check_request(bytes([8, 0, 0, 0, 0])) is None
    assert check_request(bytes([43, 14, 1, 0])) is None
