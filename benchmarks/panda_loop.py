"""The Panda at 1 kHz in real time: the loop with the plant and its gaps, and the
loop -> policy -> safety -> loop round trip.

    python benchmarks/panda_loop.py [--wall 10] [--part loop|bus|both]

- loop: `hil run configs/panda.toml --wall W` (servers up, no client): steps, overruns and
  overruns per 10k steps, lateness percentiles, scheduling obtained;
- bus: `hil run configs/panda_policy.toml --wall W` (policy v1 and the safety wrapper as
  processes, ipc bus, watchdog 2 periods): the fraction of steps on which no valid action had
  arrived within the watchdog and the loop applied its own fallback (`fallback_steps`), the
  watchdog trips, the policy's and the safety's counters.
Human lines on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import errno
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hil.scenario.ports import with_free_ports  # noqa: E402


def _run(config: str, wall_s: float, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "-m", "hil.cli", "run", str(ROOT / "configs" / config), "--wall", str(wall_s),
                "--json", "--quiet", "--no-record"] + extra
        if "policy" in config:
            args += ["--set", f"safety.decision_log='{tmp}/safety.jsonl'"]
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=wall_s + 300)
        if proc.returncode != 0 and "already in use" in proc.stderr:  # taken since chosen: fresh ports
            raise OSError(errno.EADDRINUSE, proc.stderr[-500:])
        if proc.returncode != 0:
            raise SystemExit(f"{config}: exit {proc.returncode}: {proc.stderr[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wall", type=float, default=10.0, help="wall seconds per run")
    ap.add_argument("--part", choices=("loop", "bus", "both"), default="both")
    args = ap.parse_args()
    out: dict = {"wall_s": args.wall}
    if args.part in ("loop", "both"):
        s = with_free_ports(lambda ports: _run("panda.toml", args.wall, ["--set", f"modbus.port={ports[0]}",
                                                                         "--set", f"opcua.port={ports[1]}"]), 2)
        steps = max(s["steps"], 1)
        out["loop"] = {"steps": s["steps"], "overruns": s["overruns"],
                       "overruns_per_10k": 1e4 * s["overruns"] / steps, "lateness_us": s["lateness_us"],
                       "scheduling": s["scheduling"]}
        print(f"loop: {s['steps']} steps, {s['overruns']} overruns ({out['loop']['overruns_per_10k']:.2f} per 10k), "
              f"lateness p99 {s['lateness_us']['p99']:.1f} us, {s['scheduling']['policy']}", file=sys.stderr)
    if args.part in ("bus", "both"):
        s = _run("panda_policy.toml", args.wall, [])
        bus = s.get("bus", {})
        steps = max(s["steps"], 1)
        out["bus"] = {"steps": s["steps"], "overruns": s["overruns"], "lateness_us": s["lateness_us"],
                      "fallback_steps": bus.get("fallback_steps"), "watchdog_trips": bus.get("watchdog_trips"),
                      "no_action_steps": bus.get("no_action_steps"), "actions_applied": bus.get("actions_applied"),
                      "fallback_fraction": (bus.get("fallback_steps", 0) + bus.get("no_action_steps", 0)) / steps,
                      "action_superseded": bus.get("action_superseded"),
                      "action_dropped_too_old": bus.get("action_dropped_too_old"),
                      "scheduling": s["scheduling"], "safety": s.get("safety", {}), "policy": s.get("policy", {})}
        print(f"bus: {s['steps']} steps, watchdog fallback on {out['bus']['fallback_fraction']:.4f} of them "
              f"({bus.get('watchdog_trips')} trips), {s['overruns']} overruns", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
