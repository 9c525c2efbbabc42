"""One request to a running safety process's control socket (`hil safety ...`, the dashboard).

Status requests travel unsigned (readable by whoever reaches the socket); promote, demote,
rollback and acknowledge are signed with the run's bus key (its 0600 file: the run's user
only), stamped and nonce'd by hil.bus.auth.sign_control, as the safety process requires.
"""

from __future__ import annotations


class ControlError(Exception):
    """The request could not be signed, or no safety process answered in time."""


def control_request(sc, msg: dict, timeout_s: float) -> dict:
    """Send `msg` (a map with "op") to the scenario's safety process; its answer as a dict."""
    import msgpack
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    endpoint = sc.bus.endpoint("control", sc.name)
    try:
        sock.connect(endpoint)
        if msg.get("op") == "status":
            sock.send(msgpack.packb(msg))
        else:
            from hil.bus.auth import read_run_key, sign_control
            from hil.errors import ConfigError

            try:
                sock.send(sign_control(read_run_key(sc.bus, sc.name), msg))
            except ConfigError as exc:
                raise ControlError(f"cannot sign the request: {exc}") from None
        if not sock.poll(int(timeout_s * 1000)):
            raise ControlError(f"no safety process answered on {endpoint} within {timeout_s:g} s")
        return msgpack.unpackb(sock.recv(), raw=False)
    finally:
        sock.close(0)
        ctx.term()
