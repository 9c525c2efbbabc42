"""A second IEC 60870-5-104 client for the tests, independent of c104/lib60870: every frame is
built and decoded by scapy's IEC 104 layer (scapy.contrib.scada.iec104, written from the
standard by another author); this file only keeps the APCI bookkeeping over a plain TCP socket
(send and receive sequence numbers, an S-frame acknowledging every I-frame received).

    with ScapyIec104("127.0.0.1", port) as c:
        c.startdt()
        objects = c.interrogation(common_address=1)      # {ioa: (type name, decoded object)}
        con = c.setpoint(1, 15001, 420.0, select=True)   # the ACT_CON I-frame (its `ack`: 0 / 1)
"""

from __future__ import annotations

import socket
import time

from scapy.contrib.scada.iec104 import (
    IEC104_I_Message_SeqIOA,
    IEC104_I_Message_SingleIOA,
    IEC104_IO_C_DC_TA_1_IOA,
    IEC104_IO_C_IC_NA_1_IOA,
    IEC104_IO_C_SE_NC_1_IOA,
    IEC104_IO_NAMES,
    IEC104_S_Message,
    IEC104_U_Message,
    iec104_decode,
)

COT_CYCLIC, COT_ACT, COT_ACTCON, COT_ACTTERM, COT_SPONT, COT_INROGEN = 1, 6, 7, 10, 3, 20
POSITIVE, NEGATIVE = 0, 1


class ScapyIec104:
    def __init__(self, host: str, port: int, timeout_s: float = 10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.timeout_s = timeout_s
        self.tx = 0
        self.rx = 0
        self.buf = b""
        self.spontaneous: list = []   # (ioa, type name, object) of COT 3 frames seen while waiting
        self.cyclic: list = []        # ... of COT 1 (periodic) frames

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()

    # ---- framing ----
    def _read_apdu(self, deadline: float):
        while True:
            if len(self.buf) >= 2 and len(self.buf) >= 2 + self.buf[1]:
                n = 2 + self.buf[1]
                raw, self.buf = self.buf[:n], self.buf[n:]
                return iec104_decode(raw)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no IEC 104 frame from the server")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.buf += data

    def _next_i(self, deadline: float):
        """The next I-frame (acknowledged at once); U test frames are answered."""
        while True:
            pkt = self._read_apdu(deadline)
            if isinstance(pkt, (IEC104_I_Message_SeqIOA, IEC104_I_Message_SingleIOA)):
                self.rx = (self.rx + 1) % 32768
                self.sock.sendall(bytes(IEC104_S_Message(rx_seq_num=self.rx)))
                return pkt
            if isinstance(pkt, IEC104_U_Message) and pkt.testfr_act:
                self.sock.sendall(bytes(IEC104_U_Message(testfr_con=1)))

    def _send_i(self, io, cot: int, common_address: int) -> None:
        pkt = IEC104_I_Message_SingleIOA(tx_seq_num=self.tx, rx_seq_num=self.rx, cot=cot,
                                         common_asdu_address=common_address, io=[io])
        self.tx = (self.tx + 1) % 32768
        self.sock.sendall(bytes(pkt))

    # ---- procedures ----
    def startdt(self) -> None:
        self.sock.sendall(bytes(IEC104_U_Message(startdt_act=1)))
        deadline = time.monotonic() + self.timeout_s
        while True:
            pkt = self._read_apdu(deadline)
            if isinstance(pkt, IEC104_U_Message) and pkt.startdt_con:
                return

    @staticmethod
    def objects(pkt) -> list[tuple[int, str, object]]:
        """(ioa, type name, information object) of every object of an I-frame."""
        name = IEC104_IO_NAMES.get(pkt.type_id, str(pkt.type_id))
        if isinstance(pkt, IEC104_I_Message_SeqIOA):
            return [(pkt.information_object_address + k, name, io) for k, io in enumerate(pkt.io)]
        return [(io.information_object_address, name, io) for io in pkt.io]

    def interrogation(self, common_address: int) -> dict[int, tuple[str, object]]:
        """Station interrogation (QOI 20): {ioa: (type name, object)} of every object answered
        with COT 20 between the positive ACT_CON and the ACT_TERM."""
        self._send_i(IEC104_IO_C_IC_NA_1_IOA(information_object_address=0, qoi=20), COT_ACT, common_address)
        deadline = time.monotonic() + self.timeout_s
        out: dict[int, tuple[str, object]] = {}
        while True:
            pkt = self._next_i(deadline)
            name = IEC104_IO_NAMES.get(pkt.type_id)
            if name == "C_IC_NA_1" and pkt.cot == COT_ACTCON and pkt.ack == NEGATIVE:
                raise AssertionError("general interrogation refused")
            if name == "C_IC_NA_1" and pkt.cot == COT_ACTTERM:
                return out
            for ioa, tname, io in self.objects(pkt):
                if pkt.cot == COT_INROGEN:
                    out[ioa] = (tname, io)
                elif pkt.cot == COT_SPONT:
                    self.spontaneous.append((ioa, tname, io))

    def _confirm(self, type_name: str, ioa: int):
        """The ACT_CON (or a negative answer of another cause, e.g. 47 unknown IOA) of a command."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            pkt = self._next_i(deadline)
            if IEC104_IO_NAMES.get(pkt.type_id) == type_name and any(o[0] == ioa for o in self.objects(pkt)):
                if pkt.cot == COT_ACTCON or pkt.ack == NEGATIVE:
                    return pkt
            elif pkt.cot == COT_SPONT:
                self.spontaneous.extend(self.objects(pkt))

    def setpoint(self, common_address: int, ioa: int, value: float, select: bool):
        """C_SE_NC_1 (S/E = 1 select, 0 execute); returns the confirmation I-frame."""
        io = IEC104_IO_C_SE_NC_1_IOA(information_object_address=ioa, scaled_value=value, action=int(select), ql=0)
        self._send_i(io, COT_ACT, common_address)
        return self._confirm("C_SE_NC_1", ioa)

    def double_command(self, common_address: int, ioa: int, on: bool, select: bool, qu: int = 0):
        """C_DC_TA_1 (DCS 2 = ON, 1 = OFF; QU 0 none, 1 short pulse, 2 long pulse, 3 persistent) with a
        CP56Time2a of now; returns the confirmation."""
        t = time.gmtime()
        io = IEC104_IO_C_DC_TA_1_IOA(information_object_address=ioa, s_or_e=int(select), qu=qu, dcs=2 if on else 1,
                                     sec_milli=t.tm_sec * 1000, minutes=t.tm_min, hours=t.tm_hour,
                                     day_of_month=t.tm_mday, month=t.tm_mon, year=t.tm_year % 100)
        self._send_i(io, COT_ACT, common_address)
        return self._confirm("C_DC_TA_1", ioa)

    def wait_spontaneous(self, timeout_s: float) -> list:
        """Collect spontaneous (and cyclic, in `cyclic`) objects for `timeout_s` (s)."""
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                pkt = self._next_i(deadline)
                if pkt.cot == COT_SPONT:
                    self.spontaneous.extend(self.objects(pkt))
                elif pkt.cot == COT_CYCLIC:
                    self.cyclic.extend(self.objects(pkt))
        except TimeoutError:
            pass
        return self.spontaneous
