"""Run the dashboard for one live run: attach, bind, serve until SIGINT/SIGTERM.

`serve(entry, ...)` is what `hil dashboard` and the process that `hil run --dashboard` starts
execute. The listening socket is bound before anything else, so a port in use is a clear
error at once; the first stdout line is `dashboard: http://HOST:PORT/` once it is bound.
"""

from __future__ import annotations

import ipaddress
import socket
import sys

from hil.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050
DEFAULT_RATE_HZ = 10.0
MAX_RATE_HZ = 50.0


def parse_listen(text: str | None) -> tuple[str, int]:
    """`[HOST:]PORT` -> (host, port); HOST defaults to 127.0.0.1. ConfigError names the problem."""
    if text is None or str(text).strip() == "":
        return DEFAULT_HOST, DEFAULT_PORT
    host, sep, port = str(text).strip().rpartition(":")
    host = host.strip("[]") if sep else DEFAULT_HOST
    try:
        p = int(port)
    except ValueError:
        raise ConfigError("--dashboard", f"{text!r}: expected [HOST:]PORT with PORT a number") from None
    if not 0 <= p <= 65535:
        raise ConfigError("--dashboard", f"{text!r}: port {p} is outside 0..65535")
    return host or DEFAULT_HOST, p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int, allow_remote: bool = False) -> socket.socket:
    """The listening socket. Off loopback only with allow_remote (the page is plain HTTP)."""
    if not is_loopback(host) and not allow_remote:
        raise ConfigError("--listen", f"{host} is not a loopback address; the dashboard is plain HTTP: "
                          "pass --allow-remote to serve it off this machine (behind a TLS proxy)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError("--listen", f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(64)
    return sock


def attach_run(entry: dict, chosen: list[str] | tuple = ()):
    """(Sampler, hello) for a live-run entry: the page's layout from the scenario as it runs."""
    from hil.scenario.config import parse_scenario
    from hil.dashboard.layout import build_layout
    from hil.dashboard.sampler import Sampler

    sc = parse_scenario(entry["scenario_config"])
    model = sc.plant.load()
    spec = model.spec
    panels = build_layout(sc, spec, model.panels, chosen)
    hello = {"type": "hello", "scenario": sc.name, "plant": spec.name, "pid": entry["pid"],
             "lockstep": entry.get("lockstep"), "step_s": entry.get("step_s"), "period_s": entry.get("period_s"),
             "record_path": entry.get("record_path"), "has_safety": bool(entry.get("safety_status")),
             "names": {"y": list(spec.names("outputs")), "u": list(spec.names("inputs"))},
             "units": {"y": [q.unit for q in spec.outputs], "u": [q.unit for q in spec.inputs]},
             "groups": {src: {g.name: [g.start, g.size] for g in spec.groups if g.kind == kind}
                        for src, kind in (("y", "outputs"), ("u", "inputs"))},
             "panels": panels}
    return Sampler(entry), hello


def control_for(entry: dict):
    """The blocking operator-request function for the run's safety process."""
    from hil.scenario.config import parse_scenario
    from hil.safety.control_client import ControlError, control_request

    sc = parse_scenario(entry["scenario_config"])

    def control(msg: dict) -> dict:
        if sc.bus is None or sc.safety is None or not entry.get("safety_status"):
            raise ControlError(f"the run of {sc.name} has no safety process: nothing to send {msg['op']} to")
        return control_request(sc, msg, 2.0)

    return control


def _no_control(msg: dict) -> dict:
    from hil.safety.control_client import ControlError

    raise ControlError(f"a campaign has no safety process to send {msg['op']} to")


def serve(entry: dict | None, *, listen: str | None = None, password: str | None = None, chosen=(),
          rate_hz: float = DEFAULT_RATE_HZ, allow_remote: bool = False, finder=None,
          campaign_dir: str | None = None) -> None:
    """Serve the live run `entry`, or (entry None) the campaign in `campaign_dir`."""
    import asyncio

    import uvicorn

    from hil.dashboard.app import Hub, build_app
    from hil.dashboard.auth import Auth

    if not 0 < rate_hz <= MAX_RATE_HZ:
        raise ConfigError("--rate", f"{rate_hz:g} Hz is outside (0, {MAX_RATE_HZ:g}]")
    host, port = parse_listen(listen)
    sock = bind(host, port, allow_remote)
    try:
        if campaign_dir is not None:
            from hil.dashboard.campaign import attach_campaign

            hub = Hub(lambda _e: attach_campaign(campaign_dir), rate_hz)
            hub.attach({})
            password, what = None, f"campaign in {campaign_dir}"  # a campaign has no operator actions
            control = _no_control
        else:
            hub = Hub(lambda e: attach_run(e, chosen), rate_hz, finder)
            hub.attach(entry)
            control, what = control_for(entry), f"scenario {entry['scenario']}"
        hosts = None if allow_remote else sorted({host, "127.0.0.1", "localhost", "::1", "[::1]"})
        app = build_app(hub, Auth(password), control, allowed_hosts=hosts)
        shown = f"[{host}]" if ":" in host else host
        print(f"dashboard: http://{shown}:{sock.getsockname()[1]}/ ({what}, "
              f"{'operator login enabled' if password else 'read-only: no password given'})", flush=True)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", ws="websockets-sansio"))
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()
        sys.stdout.flush()
