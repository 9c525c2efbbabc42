"""The ZeroMQ bus between the loop, the policy and the safety process.

    hil/bus/wire.py       the binary frames: header, payloads per kind, Sender / Receiver
    hil/bus/auth.py       who may speak: the run secret, channel keys, the private run directory
    hil/bus/config.py     the scenario's [bus] section: endpoints, watchdog, deadlines
    hil/bus/endpoint.py   sockets and the loop's end (LoopBusEndpoint; the in-loop shield's end
                          is hil/loop/shield_bus.py)

`from hil.bus import X` gives the endpoint module's public names (sockets, the loop's endpoint,
and the frame names it re-exports), imported on first use: `hil.bus.auth` and `hil.bus.config`
stay cheap to import (no zmq) for the configuration and the operator commands.
"""

from __future__ import annotations

import importlib


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    endpoint = importlib.import_module("hil.bus.endpoint")
    try:
        return getattr(endpoint, name)
    except AttributeError:
        raise AttributeError(f"module 'hil.bus' has no attribute {name!r}") from None
