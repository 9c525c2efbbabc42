"""Run a command beside a CPU hog: `per_cpu` busy-loop processes on each CPU, killed after.

    python tests/cpu_hog.py --per-cpu 3 -- python -m pytest -q tests     # `make test-loaded`

The suite must pass on a loaded machine (readiness by handshake, no fixed short start-up bounds:
hil/readiness.py); this is how to check it. The hogs run at normal priority (nice 0), as another
user's jobs would. Exit code: the command's. The load average (1 min) is printed to stderr at
the start and at the end, so a report can quote the load the command ran under.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

BUSY = "import signal, sys; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nwhile True: pass"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-cpu", type=int, default=3, help="busy processes per CPU (default 3)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command (put it after --)")
    if args.per_cpu < 0:
        ap.error("--per-cpu must be >= 0")
    n = args.per_cpu * (os.cpu_count() or 1)
    hogs = [subprocess.Popen([sys.executable, "-c", BUSY], stdin=subprocess.DEVNULL) for _ in range(n)]
    print(f"cpu_hog: {n} busy process(es) ({args.per_cpu} per CPU); load average {os.getloadavg()[0]:.2f}",
          file=sys.stderr, flush=True)
    code = 1
    try:
        code = subprocess.call(cmd)
    except KeyboardInterrupt:
        code = 130
    finally:
        print(f"cpu_hog: load average {os.getloadavg()[0]:.2f} at the end; stopping the hogs", file=sys.stderr,
              flush=True)
        for h in hogs:
            if h.poll() is None:
                h.send_signal(signal.SIGTERM)
        for h in hogs:
            try:
                h.wait(5)
            except subprocess.TimeoutExpired:
                h.kill()
                h.wait(5)
    return code


if __name__ == "__main__":
    sys.exit(main())
