"""c104's client (lib60870-C's client side) for the tests: connect, start data transfer, send
commands, and see the frames on the wire.

A known race of c104 2.2's client on loopback: when the server's confirmation of a select
arrives before the client starts waiting for it, the client logs `set_command_success` before
`await_command_success`, reports False and never sends the execute (seen with
c104.set_debug_mode(c104.Debug.Connection)). `command` repeats a select-before-operate command
when the client reports False, no execute frame for the IOA was seen sent and no negative
answer received, at most `tries` times; any other failure is returned as it is. The frame
callbacks run on c104's thread, so a repeat may follow an execute that did go out: a repeat
re-sends the same value (the same image write for a set-point), and tests that count
commands send them with scapy's frames instead (tests/integration/iec104_scapy.py).
"""

import time

import c104


class Wire:
    """Frames (c104.explain_bytes_dict) the connection received and sent."""

    def __init__(self, con):
        self.received: list[dict] = []
        self.sent: list[dict] = []

        def on_receive_raw(connection: c104.Connection, data: bytes) -> None:
            self.received.append(c104.explain_bytes_dict(apdu=data))

        def on_send_raw(connection: c104.Connection, data: bytes) -> None:
            self.sent.append(c104.explain_bytes_dict(apdu=data))

        con.on_receive_raw(callable=on_receive_raw)
        con.on_send_raw(callable=on_send_raw)

    def clear(self) -> None:
        self.received.clear()
        self.sent.clear()

    def negative(self, ioa: int) -> bool:
        """A negative answer (P/N = 1, any cause) for `ioa` was received."""
        return any(f.get("negative") and f.get("firstInformationObjectAddress") == ioa for f in list(self.received))

    def executed(self, ioa: int) -> bool:
        """An execute (S/E = 0) activation for `ioa` was sent."""
        return any(f.get("format") == "I" and f.get("firstInformationObjectAddress") == ioa and not f.get("select")
                   and f.get("cot") == c104.Cot.ACTIVATION for f in list(self.sent))


def open_connection(con, bound_s: float, alive=lambda: True) -> None:
    """Wait for the TCP connection, then start data transfer (STARTDT) if the client did not."""
    deadline = time.monotonic() + bound_s
    while con.state != c104.ConnectionState.OPEN:
        if con.state == c104.ConnectionState.OPEN_MUTED:
            con.unmute()
        assert alive(), "the server went away"
        assert time.monotonic() < deadline, con.state
        time.sleep(0.02)


def command(point, value, wire: Wire, tries: int = 3) -> bool:
    """Send a command (select and execute in SELECT_AND_EXECUTE mode); True when confirmed."""
    for _ in range(tries):
        wire.clear()
        point.value = value
        if point.transmit(cause=c104.Cot.ACTIVATION):
            return True
        sbo = point.command_mode == c104.CommandMode.SELECT_AND_EXECUTE
        if not sbo or wire.executed(point.io_address) or wire.negative(point.io_address):
            return False
    return False


def refused(point, value, wire: Wire, bound_s: float) -> bool:
    """Send a command that the server must refuse; True once a negative answer for it is on the wire.

    The select race above can leave a select-before-operate command unexecuted in all of
    `command`'s tries (seen once under a loaded CI run: three confirmed selects, no execute, so no
    answer to wait for). Then the command is sent again, until a negative answer arrives or
    `bound_s` runs out; a refused command writes nothing, so repeating it is harmless.
    """
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        command(point, value, wire)
        settle = min(deadline, time.monotonic() + 5.0)
        while time.monotonic() < settle:
            if wire.negative(point.io_address):
                return True
            time.sleep(0.02)
    return wire.negative(point.io_address)
