"""Real-time campaign runs: the real servers, the SoftPLC process behind the link proxy, and the
process faults applied by signals.

The worker starts the Runtime in real time with its Modbus/OPC UA servers on ports chosen free
for this run; `started` (Runtime.run's on_started, before the loop raises its priority) starts
the link proxy (hil/campaign/proxy.py) in front of the Modbus server and the SoftPLC process
(hil/softplc) connected to the proxy, so every link fault acts on the PLC's real socket.

Fault starts and ends come from the loop (FaultStage, simulated time) and are handed to a
control thread here (the loop never blocks on a signal, a pipe or a process start):
    plc_crash     SIGKILL to the SoftPLC
    plc_hang      SIGSTOP, SIGCONT at the end
    plc_restart   SIGKILL, a new SoftPLC process at the end
    policy_hang   SIGSTOP / SIGCONT to the policy process
    link_*        the proxy's mode for the window (drop, delay + jitter, loss, half_open)
Policy NaN / shape / OOD / crash and the safety crash work as in lockstep (in those processes).
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

from hil.scenario.ports import bind_free


def _softplc_main(scenario, port: int, stop, record_path: str, results) -> None:
    from hil.loop.rt import set_normal
    from hil.softplc import run_softplc

    set_normal()
    results.put(run_softplc(scenario, None, stop, record_path=record_path, host="127.0.0.1", port=port))


LINK_MODE = {"link_drop": "drop", "link_delay": "delay", "link_loss": "loss", "link_half_open": "half_open"}


class RealtimeControl:
    def __init__(self, scenario, run, run_dir, kind: str, args: dict, controller: str):
        import multiprocessing as mp

        self.sc, self.run, self.run_dir, self.kind, self.args = scenario, run, run_dir, kind, args
        self.controller = controller
        self.ctx = mp.get_context("spawn")
        self.proxy = None
        self.plc_proc = None
        self.plc_stop = None
        self.plc_results = None
        self.plc_stats: list[dict] = []
        self.runtime = None
        self.actions: list[dict] = []
        self.q: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._control, name="campaign-rt-control", daemon=True)
        self.t0 = time.monotonic()

    # ---- life cycle (Runtime callbacks) ----
    def started(self, runtime) -> None:
        self.runtime = runtime
        if self.controller == "softplc":
            from hil.campaign.proxy import LinkProxy

            self.proxy = LinkProxy(bind_free(), self.sc.modbus.host, self.sc.modbus.port, seed=self.run.seed)
            self._start_plc()
        self.thread.start()

    def stopping(self, runtime) -> None:
        self.q.put(None)
        self.thread.join(10.0)
        self._stop_plc()
        self.proxy_counters = self.proxy.stop() if self.proxy is not None else {}

    def info(self) -> dict:
        out = {"softplc": self.plc_stats, "proxy": getattr(self, "proxy_counters", {}), "actions": self.actions}
        s = self.comm_loss_after_fault_s()
        if s is not None:  # in loop periods (wall period = step_s / time_scale)
            out["plc_comm_loss_periods"] = int(round(s / self.sc.loop.period_s))
        return out

    # ---- SoftPLC process ----
    def _start_plc(self) -> None:
        n = len(self.plc_stats) + (1 if self.plc_proc is not None else 0)
        self.plc_stop, self.plc_results = self.ctx.Event(), self.ctx.Queue()
        self.plc_proc = self.ctx.Process(
            target=_softplc_main, name="hil-softplc",
            args=(self.sc, self.proxy.listen_port, self.plc_stop, str(self.run_dir / f"softplc-{n}.csv"),
                  self.plc_results))
        self.plc_proc.start()

    def _stop_plc(self) -> None:
        p = self.plc_proc
        if p is None:
            return
        self.plc_stop.set()
        try:
            os.kill(p.pid, signal.SIGCONT)  # a hung PLC must be able to exit
        except (ProcessLookupError, TypeError):
            pass
        try:
            self.plc_stats.append(self.plc_results.get(timeout=10) if p.exitcode in (None, 0) else
                                  {"exitcode": p.exitcode})
        except queue.Empty:
            self.plc_stats.append({"error": "no stats"})
        p.join(5.0)
        if p.is_alive():
            p.kill()
            p.join(2.0)
        self.plc_proc = None

    # ---- the FaultStage's interface (called from the loop: only queue) ----
    def tick(self, k: int) -> None:
        pass

    def halt(self) -> None:
        self.q.put(("halt", self.kind))

    def resume(self, restart: bool, k: int) -> None:
        self.q.put(("resume", self.kind))

    def external(self, fault, begin: bool) -> None:
        if begin:
            self.fault_wall = time.monotonic()  # the loop's step at the fault start (CLOCK_MONOTONIC)
        self.q.put(("begin" if begin else "end", fault.kind))

    def comm_loss_after_fault_s(self) -> float | None:
        """Wall seconds from the fault start to the SoftPLC's first scan in comm_loss (its safe
        outputs), from its scan logs; None if it never declared a comm loss after the fault."""
        import csv

        t_f = getattr(self, "fault_wall", None)
        if t_f is None:
            return None
        best = None
        for n, st in enumerate(self.plc_stats):
            t0, path = st.get("t0_monotonic"), st.get("record_path")
            if t0 is None or not path:
                continue
            try:
                with open(path) as f:
                    for row in csv.DictReader(f):
                        if row["state"] == "comm_loss":
                            t = t0 + float(row["t_s"])
                            if t >= t_f:
                                best = t - t_f if best is None else min(best, t - t_f)
                                break
            except (OSError, KeyError, ValueError):
                continue
        return best

    def _control(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            what, kind = item
            t = round(time.monotonic() - self.t0, 4)
            try:
                self._act(what, kind)
                self.actions.append({"wall_s": t, "action": what, "kind": kind})
            except Exception as exc:  # noqa: BLE001
                self.actions.append({"wall_s": t, "action": what, "kind": kind, "error": str(exc)})

    def _act(self, what: str, kind: str) -> None:
        if kind.startswith("plc_"):
            if what == "halt" and self.plc_proc is not None:
                if kind == "plc_hang":
                    os.kill(self.plc_proc.pid, signal.SIGSTOP)
                else:
                    os.kill(self.plc_proc.pid, signal.SIGKILL)
                    self.plc_proc.join(5.0)
                    self.plc_stats.append({"killed": True, "exitcode": self.plc_proc.exitcode})
                    self.plc_proc = None
            elif what == "resume":
                if kind == "plc_hang" and self.plc_proc is not None:
                    os.kill(self.plc_proc.pid, signal.SIGCONT)
                elif kind == "plc_restart":
                    self._start_plc()
        elif kind == "policy_hang":
            h = getattr(self.runtime, "_policy_handles", None)
            if h is not None:
                os.kill(h.policy.pid, signal.SIGSTOP if what == "begin" else signal.SIGCONT)
        elif kind in LINK_MODE and self.proxy is not None:
            if what == "begin":
                a = self.args
                self.proxy.set(LINK_MODE[kind], **{k: a[k] for k in ("delay_s", "jitter_s", "probability") if k in a})
            else:
                self.proxy.set("pass")
