"""Malformed requests of served function codes, as raw Modbus TCP frames over a plain socket
to the server in its own process: each answers ILLEGAL DATA VALUE (0x03), as the Modbus
specification's state diagrams say, and writes nothing to the process image.

(mbpoll and pymodbus's client refuse to build these requests; pyModbusTCP's custom_request
sends a raw PDU and is used as a client we did not write.)
"""

import socket
import struct

import numpy as np
import pytest
from pyModbusTCP.client import ModbusClient

from hil.image import H_IN_WRITES
from tests.integration import modbus_helpers as H
from tests.integration.test_modbus_limits import _ask, _mbap, _recv_exact

pytestmark = pytest.mark.timeout(120)
PUMP = H.SPEC.index("inputs", "pump")  # coil 0
INFLOW = H.SPEC.index("inputs", "inflow")  # holding registers 0-1 (float32), 4 (uint16 x100)


def _req(fc, *fields, fmt=None, tail=b""):
    return struct.pack(">B" + (fmt or "H" * len(fields)), fc, *fields) + tail


MALFORMED = {
    "FC5 value 0x1234": _req(5, 0, 0x1234),
    "FC5 value 0x00FF": _req(5, 0, 0x00FF),
    "FC5 value 0xFFFF": _req(5, 0, 0xFFFF),
    "FC5 value 0x0001": _req(5, 0, 0x0001),
    "FC1 quantity 0": _req(1, 0, 0),
    "FC1 quantity 2001": _req(1, 0, 2001),
    "FC2 quantity 0": _req(2, 0, 0),
    "FC2 quantity 2001": _req(2, 0, 2001),
    "FC3 quantity 0": _req(3, 0, 0),
    "FC3 quantity 126": _req(3, 0, 126),
    "FC4 quantity 0": _req(4, 0, 0),
    "FC4 quantity 126": _req(4, 0, 126),
    "FC15 quantity 0": _req(15, 0, 0, 0, fmt="HHB"),
    "FC15 quantity 1969": _req(15, 0, 1969, 247, fmt="HHB", tail=bytes(247)),
    "FC15 byte count 2 for 1 coil": _req(15, 0, 1, 2, fmt="HHB", tail=b"\x01\x00"),
    "FC15 byte count 1, no data": _req(15, 0, 1, 1, fmt="HHB"),
    "FC16 quantity 0": _req(16, 0, 0, 0, fmt="HHB"),
    "FC16 quantity 124": _req(16, 0, 124, 248, fmt="HHB", tail=bytes(248)),
    "FC16 byte count 2 for 2 registers": _req(16, 0, 2, 2, fmt="HHB", tail=b"\x42\x48"),
    "FC16 byte count 4, 2 bytes follow": _req(16, 0, 2, 4, fmt="HHB", tail=b"\x42\x48"),
    "FC16 byte count 4, 6 bytes follow": _req(16, 0, 2, 4, fmt="HHB", tail=bytes(6)),
    "FC3 truncated": bytes([3, 0, 0, 0]),
    "FC6 trailing byte": _req(6, 4, 500, tail=b"\x00"),
}


def test_malformed_requests_answer_illegal_data_value_and_write_nothing():
    with H.rig(publisher=False) as rig:
        img = rig.image
        s = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
        try:
            # the coil OFF and inflow 0 before: the FC5 0x1234 of the issue set the coil ON
            assert _ask(s, 1, _req(5, 0, 0x0000)) == _req(5, 0, 0x0000)
            before, writes = img.read_inputs(), int(img.header[H_IN_WRITES])
            for tid, (name, pdu) in enumerate(MALFORMED.items(), 10):
                assert _ask(s, tid, pdu) == bytes([pdu[0] | 0x80, 0x03]), name
            assert int(img.header[H_IN_WRITES]) == writes  # not even a same-value write
            assert (img.read_inputs() == before).all() and img.read_inputs()[PUMP] == 0.0
            # well-formed requests on the same connection are served
            assert _ask(s, 100, _req(5, 0, 0xFF00)) == _req(5, 0, 0xFF00)
            assert img.read_inputs()[PUMP] == 1.0
            assert _ask(s, 101, _req(15, 0, 1, 1, fmt="HHB", tail=b"\x00")) == _req(15, 0, 1)
            assert img.read_inputs()[PUMP] == 0.0
            assert _ask(s, 102, _req(16, 4, 1, 2, 500, fmt="HHBH")) == _req(16, 4, 1)
            assert img.read_inputs()[INFLOW] == pytest.approx(5.0)
            assert _ask(s, 103, _req(1, 0, 1)) == bytes([1, 1, 0])
            assert _ask(s, 104, _req(3, 4, 1)) == bytes([3, 2, 0x01, 0xF4])
            # the spec maxima themselves are not refused as malformed (unmapped: 0x02)
            assert _ask(s, 105, _req(3, 0, 125)) == bytes([0x83, 0x02])
            assert _ask(s, 106, _req(1, 0, 2000)) == bytes([0x81, 0x02])
        finally:
            s.close()
        # another client library sends the FC5 0x1234 as a raw PDU
        c = ModbusClient(host="127.0.0.1", port=rig.port, unit_id=1, timeout=5.0)
        try:
            assert c.custom_request(_req(5, 0, 0x0000)) is not None
            writes = int(img.header[H_IN_WRITES])
            assert c.custom_request(_req(5, 0, 0x1234)) is None and c.last_except == 3
            assert c.custom_request(_req(3, 0, 126)) is None and c.last_except == 3
        finally:
            c.close()
        assert int(img.header[H_IN_WRITES]) == writes and img.read_inputs()[PUMP] == 0.0


def test_pipelined_malformed_requests_are_answered_in_order():
    """A malformed request between two good ones in one TCP segment: three answers, in order."""
    with H.rig(publisher=False) as rig:
        s = socket.create_connection(("127.0.0.1", rig.port), timeout=5)
        try:
            s.sendall(_mbap(1, _req(6, 4, 300)) + _mbap(2, _req(5, 0, 0x1234))
                      + _mbap(3, _req(3, 4, 1)) + _mbap(4, _req(16, 4, 0, 0, fmt="HHB")))
            answers = []
            for _ in range(4):
                head = _recv_exact(s, 7)
                answers.append((struct.unpack(">H", head[:2])[0],
                                _recv_exact(s, struct.unpack(">H", head[4:6])[0] - 1)))
        finally:
            s.close()
        assert answers == [(1, _req(6, 4, 300)), (2, bytes([0x85, 0x03])),
                           (3, bytes([3, 2, 0x01, 0x2C])), (4, bytes([0x90, 0x03]))]
        assert rig.image.read_inputs()[H.SPEC.index("inputs", "pump")] == 0.0


def test_before_the_loops_first_publish_every_request_answers_busy_and_writes_nothing():
    """Until the loop publishes its initial outputs there is nothing true to serve: reads and
    writes answer SERVER DEVICE BUSY (0x06), never placeholder values, and nothing is written."""
    from hil.image import ProcessImage

    image = ProcessImage.create(H.SPEC.n_inputs, H.SPEC.n_outputs)
    r = H.Rig(H.scenario(H.free_port()), image)
    try:
        r.start_server()
        s = socket.create_connection(("127.0.0.1", r.sc.modbus.port), timeout=5)
        try:
            for tid, pdu in enumerate((_req(3, 0, 2), _req(4, 0, 2), _req(1, 0, 1), _req(5, 0, 0xFF00),
                                       _req(6, 4, 500), _req(16, 4, 1, 2, 500, fmt="HHBH")), 1):
                assert _ask(s, tid, pdu) == bytes([pdu[0] | 0x80, 0x06]), pdu
            assert int(image.header[H_IN_WRITES]) == 0 and image.read_inputs()[PUMP] == 0.0
            image.publish(np.zeros(H.SPEC.n_outputs), np.zeros(H.SPEC.n_inputs), 0, 0.0)  # the initial publish
            assert _ask(s, 20, _req(5, 0, 0xFF00)) == _req(5, 0, 0xFF00)
            assert image.read_inputs()[PUMP] == 1.0
        finally:
            s.close()
    finally:
        r.close()
