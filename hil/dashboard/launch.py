"""The dashboard as a process beside a run (`hil run --dashboard`, `hil demo`).

Started niced (NICE) from the runtime's `on_started` callback: after the run is announced
(hil/live_runs.py) and before the loop raises its priority, so it never inherits SCHED_FIFO;
it attaches to exactly that loop (by pid). Its output goes to stderr (the run's stdout may
end in a JSON summary). Stopped with SIGTERM when the run ends (SIGKILL after a bound).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from hil.dashboard.serve import bind, parse_listen

STOP_TIMEOUT_S = 5.0
NICE = 10  # niceness of the dashboard process beside a run


def check_listen(listen: str | None, allow_remote: bool = False) -> str:
    """The page's URL if `listen` can be bound now (ConfigError otherwise), checked before the run."""
    host, port = parse_listen(listen)
    sock = bind(host, port, allow_remote)
    port = sock.getsockname()[1]
    sock.close()
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


class DashboardProcess:
    """`hil dashboard TARGET` as a child: TARGET a scenario file (with the loop's pid at start)
    or a campaign output directory."""

    def __init__(self, target: str, listen: str, password_file: str | None = None,
                 signals=(), allow_remote: bool = False):
        # niced: a viewer yields the CPU to the run's own processes (servers, SoftPLC, policy)
        nice = ["nice", "-n", str(NICE)] if shutil.which("nice") else []
        self.cmd = nice + [sys.executable, "-m", "hil.cli", "dashboard", target, "--listen", listen,
                           "--wait", "30"]
        if password_file:
            self.cmd += ["--password-file", password_file]
        for s in signals:
            self.cmd += ["--signal", s]
        if allow_remote:
            self.cmd.append("--allow-remote")
        self.proc: subprocess.Popen | None = None

    def start(self, loop_pid: int | None = None) -> None:
        """Start it (for a run: before the loop raises its priority, Runtime.run's on_started)."""
        pid = ["--pid", str(loop_pid)] if loop_pid is not None else []
        self.proc = subprocess.Popen(self.cmd + pid, stdout=sys.stderr, stdin=subprocess.DEVNULL)

    def stop(self) -> int | None:
        """Stop it; its exit code (None if it was never started)."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return p.returncode
