"""Process layout of the protocol servers: each server in its own process.

asyncio servers hold the GIL for milliseconds at a time; sharing the loop's interpreter
gave p99 lateness of 1-8 ms in the prototype whatever the priority. In their own processes,
attached to the process image by name, they cannot delay the loop at all: the loop never
waits for them (seqlocks, no lock on the loop side).

`start_servers` returns once every server listens (or raises, after stopping the ones that
did start), so a PLC that connects right after `hil run` prints its first status line finds
the servers up.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass

SERVERS = {
    "modbus": "adapters.modbus",
    "opcua": "adapters.opcua",
}


@dataclass
class ServerProcess:
    kind: str
    process: mp.Process
    stop: object  # multiprocessing.Event


def _server_main(module_name: str, scenario, image_name: str, ready, stop, kwargs: dict) -> None:
    import importlib

    from hil.rt import die_with_parent, set_normal

    set_normal()  # never inherit the loop's SCHED_FIFO
    if not die_with_parent():  # SIGTERM (a clean stop) when the loop dies, even by SIGKILL
        return
    try:
        importlib.import_module(module_name).serve_forever(scenario, image_name, ready=ready, stop=stop, **kwargs)
    except (OSError, RuntimeError) as exc:  # cannot listen, bad certificate...: one line, the parent names the port
        import sys

        print(f"{module_name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


def _wait_ready(ready, proc, timeout_s: float) -> bool:
    """Wait for `ready`, but no longer than the child lives (a server that dies is seen at once)."""
    deadline = time.monotonic() + timeout_s
    while not ready.wait(min(0.1, max(deadline - time.monotonic(), 0.0))):
        if not proc.is_alive() or time.monotonic() >= deadline:
            return ready.is_set()
    return True


def start_servers(scenario, image_name: str, timeout_s: float = 30.0,
                  modbus_request_log: str | None = None) -> list[ServerProcess]:
    """Start a server process for each of [modbus] and [opcua] the scenario configures.

    modbus_request_log: where the Modbus server dumps its per-request timing log at
    shutdown (JSONL; `hil profile` turns it into a latency profile).
    """
    ctx = mp.get_context("spawn")
    started: list[ServerProcess] = []
    try:
        for kind, module_name in SERVERS.items():
            if getattr(scenario, kind) is None:
                continue
            ready, stop = ctx.Event(), ctx.Event()
            kwargs = {"request_log_path": modbus_request_log} if kind == "modbus" and modbus_request_log else {}
            proc = ctx.Process(target=_server_main, args=(module_name, scenario, image_name, ready, stop, kwargs),
                               name=f"hil-{kind}", daemon=True)
            proc.start()
            started.append(ServerProcess(kind, proc, stop))
            if not _wait_ready(ready, proc, timeout_s):
                section = getattr(scenario, kind)
                where = f"{kind} server on {section.host}:{section.port}"
                code = proc.exitcode
                raise RuntimeError(f"{where} exited with code {code} before listening (see its log above)"
                                   if code is not None else f"{where} did not start within {timeout_s:g} s")
    except BaseException:
        stop_servers(started)
        raise
    return started


def stop_servers(servers: list[ServerProcess], timeout_s: float = 5.0) -> None:
    """Ask each server to stop, then terminate and kill what is left."""
    for s in servers:
        s.stop.set()
    for s in servers:
        s.process.join(timeout_s)
        if s.process.is_alive():
            s.process.terminate()
            s.process.join(2.0)
        if s.process.is_alive():
            s.process.kill()
            s.process.join(1.0)
