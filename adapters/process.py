"""Process layout of the protocol servers: each server in its own process.

asyncio servers hold the GIL for milliseconds at a time; sharing the loop's interpreter
gave p99 lateness of 1-8 ms in the prototype whatever the priority. In their own processes,
attached to the process image by name, they cannot delay the loop at all: the loop never
waits for them (seqlocks, no lock on the loop side).

`start_servers` starts every server process at once and returns once every one listens
(or raises, after stopping the ones that did start), so a PLC that connects right after `hil run` prints its first status line finds
the servers up.

Final counters: each server writes its totals as JSON (`summary_path`, a file in a private
temporary directory made by `start_servers`) when it stops; `stop_servers` returns them as
{"modbus": {...}, "opcua": {...}, "iec104": {...}} for the run summary (a server that left none
gives {"error": "..."}). Fields: adapters.modbus.final_counters, adapters.opcua.final_counters,
adapters.iec104 (module doc).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SERVERS = {
    "modbus": "adapters.modbus",
    "opcua": "adapters.opcua",
    "iec104": "adapters.iec104",
}


@dataclass
class ServerProcess:
    kind: str
    process: mp.Process
    stop: object  # multiprocessing.Event
    summary_path: str | None = None  # the server's final counters (JSON), written when it stops


def _server_main(module_name: str, scenario, image_name: str, ready, stop, kwargs: dict) -> None:
    import importlib
    import inspect

    from hil.loop.rt import die_with_parent, set_normal

    set_normal()  # never inherit the loop's SCHED_FIFO
    if not die_with_parent():  # SIGTERM (a clean stop) when the loop dies, even by SIGKILL
        return
    serve_forever = importlib.import_module(module_name).serve_forever
    if "spec" in kwargs and "spec" not in inspect.signature(serve_forever).parameters:
        kwargs = {k: v for k, v in kwargs.items() if k != "spec"}  # a server that loads the plant itself
    try:
        serve_forever(scenario, image_name, ready=ready, stop=stop, **kwargs)
    except (OSError, RuntimeError) as exc:  # cannot listen, bad certificate...: one line, the parent names the port
        import sys

        print(f"{module_name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


def _wait_ready(ready, proc, max_s: float | None) -> str | None:
    """Wait for `ready` while the child lives and makes progress (hil/readiness.py): None when it
    is up, else why not (it died: seen at once; no CPU progress for readiness.STALL_S; max_s)."""
    from hil import readiness

    return readiness.wait_ready(ready.is_set, [proc.pid], proc.is_alive, wait=ready.wait,
                                max_s=readiness.MAX_S if max_s is None else max_s, poll_s=0.1)


def start_servers(scenario, image_name: str, timeout_s: float | None = None,
                  modbus_request_log: str | None = None, shared_list: str | None = None,
                  spec=None) -> list[ServerProcess]:
    """Start a server process for each of [modbus], [opcua] and [iec104] the scenario configures
    and does not switch off (`enabled = false`).

    The processes start together and are then waited for one by one, so their start-ups
    (imports, address space) overlap instead of adding up. `spec`: the plant's PlantSpec,
    handed to the servers so that they do not build the plant again (a grid's case file,
    model and ratings: seconds for a large case); without it, or to a server whose
    `serve_forever` takes no `spec`, each server loads the plant.

    modbus_request_log: where the Modbus server dumps its per-request timing log at
    shutdown (JSONL; `hil profile` turns it into a latency profile). shared_list: where the
    Modbus server writes the actuators writable over both Modbus and OPC UA (one per line; its
    log names the first few and this file).
    """
    ctx = mp.get_context("spawn")
    started: list[ServerProcess] = []
    waiting: list[tuple[ServerProcess, object]] = []
    counters_dir = tempfile.mkdtemp(prefix="hil-servers-")  # 0700, removed by stop_servers
    served_spec = None if spec is None else dataclasses.replace(spec, randomize=None)  # picklable
    try:
        for kind, module_name in SERVERS.items():
            if scenario.served(kind) is None:  # absent, or switched off: bind nothing
                continue
            ready, stop = ctx.Event(), ctx.Event()
            summary_path = str(Path(counters_dir) / f"{kind}.json")
            kwargs: dict = {"summary_path": summary_path}
            if served_spec is not None:
                kwargs["spec"] = served_spec
            if kind == "modbus" and modbus_request_log:
                kwargs["request_log_path"] = modbus_request_log
            if kind == "modbus" and shared_list:
                kwargs["shared_list_path"] = shared_list
            proc = ctx.Process(target=_server_main, args=(module_name, scenario, image_name, ready, stop, kwargs),
                               name=f"hil-{kind}", daemon=True)
            proc.start()
            server = ServerProcess(kind, proc, stop, summary_path)
            started.append(server)
            waiting.append((server, ready))
        for server, ready in waiting:
            proc, kind = server.process, server.kind
            why = _wait_ready(ready, proc, timeout_s)
            if why is not None:
                section = getattr(scenario, kind)
                where = f"{kind} server on {section.host}:{section.port}"
                code = proc.exitcode
                raise RuntimeError(f"{where} exited with code {code} before listening (see its log above)"
                                   if code is not None else f"{where} did not start: {why}")
    except BaseException:
        stop_servers(started)
        shutil.rmtree(counters_dir, ignore_errors=True)
        raise
    if not started:
        shutil.rmtree(counters_dir, ignore_errors=True)
    return started


def stop_servers(servers: list[ServerProcess], timeout_s: float = 5.0) -> dict[str, dict]:
    """Ask each server to stop, then terminate and kill what is left.

    Returns each server's final counters by kind ({"modbus": {...}, "opcua": {...}}).
    """
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
    out: dict[str, dict] = {}
    dirs = set()
    for s in servers:
        if s.summary_path is None:
            continue
        path = Path(s.summary_path)
        dirs.add(path.parent)
        try:
            out[s.kind] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            out[s.kind] = {"error": f"{s.kind} server left no final counters "
                           f"(exit code {s.process.exitcode}): {type(exc).__name__}"}
    for d in dirs:  # the servers of one start_servers call share it
        shutil.rmtree(d, ignore_errors=True)
    return out


def _codes(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) if d else "none"


def counters_line(kind: str, c: dict) -> str:
    """One human line of a server's final counters (the `hil run` summary)."""
    if "error" in c:
        return c["error"]
    if kind == "iec104":
        from adapters.iec104 import final_counters_line

        return final_counters_line(c)
    if kind == "modbus":
        return (f"{c['connections']} connections ({c['refused_connections']} refused, {c['idle_closed']} closed "
                f"idle), {c['requests']} requests ({c['reads']} reads, {c['writes']} writes), "
                f"exceptions: {_codes(c['exceptions'])}")
    return (f"{c['sessions']} sessions, {c['connections']} connections ({c['refused_connections']} refused, "
            f"{c['idle_closed']} closed idle), {c['reads']} reads, writes {c['writes_accepted']} accepted, "
            f"refused: {_codes(c['writes_refused'])}, {c['subscriptions']} subscriptions, "
            f"{c['monitored_items']} monitored items")
