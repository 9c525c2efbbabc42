"""IEC 60870-5-104 server over the process image (the `c104` package, which wraps lib60870-C).

One station (common address `[iec104] common_address`) whose information objects are the
scenario's map (hil/tagmap/iec104.py): measured values M_ME_TF_1 (short float, CP56Time2a
time tag), double points M_DP_TB_1 (breakers), set-points C_SE_NC_1, single commands C_SC_TA_1
and double commands C_DC_TA_1, in select-before-operate (`command_mode`, default) or direct mode.

- General interrogation (C_IC_NA_1, station): c104 answers from the objects' values, which the
  sampler keeps equal to the image's last publish (adapters/iec104_image.py `Monitor`).
- Spontaneous transmission (COT 3): after each new publish, the objects whose value moved by
  more than their deadband (double points: changed state), batched per type; a cyclic period
  (`report_ms`) adds periodic reports (COT 1) where configured.
- Time tags: the wall-clock time (UTC, ms) of the image publish in which the object's value last
  changed (a GI returns the time of that change, as a substation's event time).
- Quality: IV (invalid) while the value is not a number, e.g. before the loop's first publish.
- Commands: c104 confirms the select (SbO) and calls back on the execute; the callback checks
  the command (`Commands.apply`: a plc-driven input's bounds, a published image) and writes the
  image in one atomic write. A single or double command with a pulse qualifier (QU short / long
  pulse) is released by the sampler once the loop has read it; otherwise it holds. A refused execute gets a negative activation confirmation (P/N = 1)
  and is counted by reason; so is a command to an unknown IOA or of the wrong type, which c104
  answers negatively itself (COT 47 / 44). An execute without its select is refused by c104
  before any callback (not counted). Nothing on the wire reaches the loop otherwise.

Process layout as the other servers (adapters/process.py): `serve_forever(scenario, image_name,
ready, stop, summary_path=None)` runs until `stop` is set or SIGTERM / SIGINT; `ready` is set
once clients can connect. Final counters (`final_counters`, JSON at `summary_path`):
connections, commands_accepted, commands_refused (by reason), pulses_released, spontaneous
(objects sent), publishes (image publishes sampled), points.
"""

import datetime as dt
import logging
import os
import signal
import threading
import time

import numpy as np

try:
    import c104
except ImportError as exc:  # one line in the run's log (adapters/process.py), not a traceback
    raise RuntimeError("the [iec104] server needs the c104 package: pip install -e '.[iec104]'") from exc

from adapters.iec104_image import Commands, Monitor
from hil.atomic import write_json_atomic
from hil.image import H_OUT_SEQ, ProcessImage
from hil.tagmap.iec104 import Iec104Section, Point, compile_points

log = logging.getLogger("hil.iec104")
MIN_POLL_S = 0.01     # the sampler looks for a new publish at most this often (s) ...
MAX_POLL_S = 0.1      # ... and at least this often

_UNEXPECTED_REASON = {"UNKNOWN_IOA": "unknown_ioa", "MISMATCHED_TYPE_ID": "wrong_type",
                      "UNKNOWN_TYPE_ID": "unknown_type", "UNKNOWN_CA": "unknown_common_address",
                      "INVALID_COT": "invalid_cot", "UNKNOWN_COT": "unknown_cot",
                      "INVALID_TYPE_ID": "invalid_type", "UNIMPLEMENTED_GROUP": "unimplemented_group"}


class Iec104Server:
    """The c104 server, its station and objects, bound to one process image."""

    def __init__(self, section: Iec104Section, points: list[Point], image: ProcessImage):
        self.c104 = c104
        self.section = section
        self.image = image
        self.points = points
        self.commands = Commands(points, image)
        self.monitor = Monitor(points)
        self.connections = 0
        self.spontaneous = 0
        self.publishes = 0
        self._lock = threading.Lock()
        self.server = c104.Server(ip=section.host, port=section.port, tick_rate_ms=section.tick_ms,
                                  select_timeout_ms=section.select_timeout_ms,
                                  max_connections=section.max_connections)
        self.station = self.server.add_station(common_address=section.common_address)
        mode = (c104.CommandMode.SELECT_AND_EXECUTE if section.command_mode == "select_and_execute"
                else c104.CommandMode.DIRECT)
        self.objects: list = []   # monitor objects, in Monitor order
        for p in points:
            ctype = getattr(c104.Type, p.type_id)
            if p.is_command:
                obj = self.station.add_point(io_address=p.ioa, type=ctype, command_mode=mode)
                obj.on_receive(callable=self._on_command)
            else:
                obj = self.station.add_point(io_address=p.ioa, type=ctype, report_ms=p.report_ms)
                self.objects.append(obj)
        self._invalid = c104.Quality.Invalid
        self._good = c104.Quality()
        self._states = {1.0: c104.Double.ON, 0.0: c104.Double.OFF}
        for obj, p in zip(self.objects, self.monitor.points):   # IV until the first publish
            self._set(obj, p, float("nan"), None)
        self.server.on_connect(callable=self._on_connect)
        self.server.on_unexpected_message(callable=self._on_unexpected)

    # ---- callbacks (c104's thread) ----
    def _on_connect(self, server: c104.Server, ip: str) -> bool:
        with self._lock:
            self.connections += 1
        return True

    def _on_unexpected(self, server: c104.Server, message: c104.IncomingMessage, cause: c104.Umc) -> None:
        if getattr(message, "type", None) is not None and message.type.name.startswith("C_"):
            self.commands.count_refused(_UNEXPECTED_REASON.get(cause.name, cause.name.lower()))

    def _on_command(self, point: c104.Point, previous_info: c104.Information,
                    message: c104.IncomingMessage) -> c104.ResponseState:
        qualifier = getattr(message.info, "qualifier", None)
        pulse = getattr(qualifier, "name", "") in ("SHORT_PULSE", "LONG_PULSE")
        why = self.commands.apply(point.io_address, point.value, pulse=pulse)
        if why is None:
            return self.c104.ResponseState.SUCCESS
        log.info("IEC 104 command to IOA %d (%s) refused: %s", point.io_address, point.type.name, why)
        return self.c104.ResponseState.FAILURE

    # ---- values ----
    def _set(self, obj, p: Point, value: float, when: dt.datetime | None) -> None:
        bad = value != value
        quality = self._invalid if bad else self._good
        if p.type == "double_point":
            obj.info = c104.DoubleInfo(state=c104.Double.INDETERMINATE if bad else self._states[value],
                                       quality=quality, recorded_at=when)
        else:
            obj.info = c104.ShortInfo(actual=0.0 if bad else value, quality=quality, recorded_at=when)

    def sample(self, snap) -> int:
        """Serve one image publish: update the changed objects, transmit the spontaneous ones
        (when a client is connected); returns how many were transmitted."""
        when = dt.datetime.now(dt.timezone.utc) - dt.timedelta(
            microseconds=max(0, time.monotonic_ns() - snap.publish_ns) / 1e3)
        values, changed, spont = self.monitor.update(snap.outputs)
        points, objects = self.monitor.points, self.objects
        for i in np.flatnonzero(changed | spont):
            self._set(objects[i], points[i], float(values[i]), when)
        self.publishes += 1
        idx = np.flatnonzero(spont)
        if not idx.size or not self.server.has_active_connections:
            return 0
        by_type: dict[str, list] = {}
        for i in idx:
            by_type.setdefault(points[i].type, []).append(objects[i])
        cause = self.c104.Cot.SPONTANEOUS
        for objs in by_type.values():
            for k in range(0, len(objs), BATCH):
                self.server.transmit_batch(self.c104.Batch(cause=cause, points=objs[k:k + BATCH]))
        self.spontaneous += int(idx.size)
        return int(idx.size)

    def start(self) -> None:
        self.server.start()
        deadline = time.monotonic() + 5.0
        while not self.server.is_running:
            if time.monotonic() > deadline:
                raise RuntimeError(f"IEC 104 server on {self.section.host}:{self.section.port} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.stop()

    def counters(self) -> dict:
        with self._lock:
            connections = self.connections
        return {"connections": connections, **self.commands.counters(), "spontaneous": self.spontaneous,
                "publishes": self.publishes, "points": len(self.points)}


BATCH = 30  # objects per ASDU batch: a 253-octet APDU holds 16 M_ME_TF_1 objects; c104 splits further


def _poll_s(scenario, image: ProcessImage) -> float:
    period = image.period_s or (scenario.loop.period_s if scenario.loop is not None else MAX_POLL_S)
    return min(max(period, MIN_POLL_S), MAX_POLL_S)


def serve(scenario, image: ProcessImage, stop: threading.Event, ready=None, spec=None) -> dict:
    """Serve until `stop` is set; returns the final counters."""
    section = scenario.iec104 if scenario.iec104 is not None else Iec104Section()
    spec = spec or scenario.plant.load().spec
    points = compile_points(section, spec, scenario)
    srv = Iec104Server(section, points, image)
    srv.start()
    poll_s = _poll_s(scenario, image)
    n_cmd = sum(p.is_command for p in points)
    log.info("IEC 60870-5-104 server on %s:%d, common address %d: %d monitor and %d command objects (%s), "
             "sampling every %.0f ms", section.host, section.port, section.common_address, len(points) - n_cmd,
             n_cmd, section.command_mode.replace("_", " "), 1e3 * poll_s)
    seen = -1
    try:
        if ready is not None:
            ready.set()
        while not stop.is_set():
            seq = int(image.header[H_OUT_SEQ])
            if seq != seen and seq > 0 and not seq & 1:
                snap = image.snapshot()
                srv.sample(snap)
                seen = seq
            srv.commands.release_pulses()
            stop.wait(poll_s)
    finally:
        srv.stop()
    return srv.counters()


def final_counters_line(c: dict) -> str:
    refused = ", ".join(f"{k} {v}" for k, v in c["commands_refused"].items()) or "none"
    return (f"{c['connections']} connections, commands {c['commands_accepted']} accepted, refused: {refused}, "
            f"{c['spontaneous']} spontaneous objects over {c['publishes']} publishes, {c['points']} objects")


def serve_forever(scenario, image_name: str, ready=None, stop=None, *, summary_path: str | None = None,
                  spec=None) -> None:
    """Run the IEC 104 server for `scenario` over the image `image_name` (blocking). `spec`: the
    loop's PlantSpec (handed over by adapters/process.py), else the plant is loaded here.

    `ready` (e.g. multiprocessing.Event) is set once clients can connect; the server stops
    when `stop` is set, or on SIGTERM / SIGINT (main thread only).
    """
    image = ProcessImage.attach(image_name)
    done = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
    if stop is not None:
        def watch() -> None:
            while not done.is_set():
                if stop.wait(0.05):
                    done.set()
        threading.Thread(target=watch, name="hil-iec104-stop", daemon=True).start()
    log.info("IEC 104 server process %d", os.getpid())
    try:
        c = serve(scenario, image, done, ready, spec=spec)
        log.info("IEC 104 server stopped: %s", final_counters_line(c))
        if summary_path:
            write_json_atomic(summary_path, c, indent=1)
    finally:
        image.close()
