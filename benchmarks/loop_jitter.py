"""Loop jitter at a rate (1 kHz by default), in one run: a naive sleep loop, hil's loop, and cyclictest.

    python benchmarks/loop_jitter.py [--rate HZ] [--duration S] [--priority P] [--cpu C]

Issue 19's goals (bioreactor, FIFO 80, pinned): `--rate 10000` 0 overruns per 10k steps,
`--rate 20000` <= 5 per 10k. Per contender: lateness percentiles, a lateness histogram
(`lateness_histogram`: counts per bin of LATENESS_BINS_US) and the cycles later than one
period per 10k (`over_period_per_10k`; hil's own overrun count, a skipped deadline, is
`hil_overruns_per_10k`).

- naive: `time.sleep(period)` after each bioreactor step (the straightforward loop). Its
  lateness is measured against the grid it means to keep (t0 + k*period), so drift counts;
  `naive_interval_error` gives the per-cycle view (wake - previous wake - period) too.
- hil: `hil run configs/bioreactor.toml` at the rate (1 s plant step, time_scale = rate) with
  recording on, at SCHED_FIFO `--priority` (if permitted) pinned to `--cpu`, as a
  subprocess, exactly as a user runs it.
- cyclictest (rt-tests): the OS timer floor at the same priority and CPU: one thread,
  clock_nanosleep on absolute deadlines, mlockall, interval 1e6 / rate us.
- deadline -> image: what a PLC reading the image experiences. The wake-up lateness above
  is measured after the spin, before the step's work; the outputs become visible only once
  the loop has read its inputs, stepped the plant and gaps and written the image. `publish`
  is the loop's own stamp in the image header (H_PUBLISH_NS) minus the step's deadline (from
  the recording: wall_ns - lateness); `visible_to_reader` is when a reader process spinning
  on another CPU saw the new step. Both are compared with cyclictest's wake-up floor.

The last stdout line is one JSON object: naive, hil, cyclictest (p50_us, p99_us, p999_us,
max_us each), hil_overruns, ratio_p99_vs_cyclictest, spin_cpu_fraction, hil_publish_us and
hil_visible_to_reader_us (deadline -> image), ratio_publish_p99/p999_vs_cyclictest, settings.
Timing is never asserted in tests; this script reports what it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hil.loop import rt  # noqa: E402
from hil.loop.stats import LatencyHistogram  # noqa: E402


LATENESS_BINS_US = (0, 5, 10, 20, 50, 100, 200, 500, 1000)  # bin i: [b_i, b_i+1) us; the last is open


def lateness_histogram(lateness_us: np.ndarray) -> dict:
    """Counts of lateness (us) per bin of LATENESS_BINS_US, keyed "lo-hi" (the last "lo+")."""
    edges = np.array(LATENESS_BINS_US + (np.inf,), dtype=np.float64)
    counts, _ = np.histogram(np.asarray(lateness_us, dtype=np.float64), bins=edges)
    keys = [f"{a}-{b}" for a, b in zip(LATENESS_BINS_US[:-1], LATENESS_BINS_US[1:])] + [f"{LATENESS_BINS_US[-1]}+"]
    return dict(zip(keys, (int(c) for c in counts)))


def per_10k(count: int, cycles: int) -> float:
    return round(count * 10_000 / max(cycles, 1), 3)


def summarize(h: LatencyHistogram) -> dict:
    s = h.summary_us()
    return {"p50_us": s["p50"], "p99_us": s["p99"], "p999_us": s["p999"], "max_us": s["max"], "n": s["n"]}


def naive_loop(duration_s: float, period_s: float, priority: int, cpu: int) -> dict:
    """sleep(period) after the work; lateness against the intended grid and per cycle."""
    from plants.base import Plant

    plant = Plant.from_name("bioreactor")
    dt = 1.0 / 3600.0
    plant.step(dt)  # compile before timing
    warn = [w for w in (rt.pin_cpu(cpu), rt.set_fifo(priority)) if w]
    try:
        grid = LatencyHistogram()
        interval = LatencyHistogram()
        n = int(duration_s / period_s)
        period_ns = int(period_s * 1e9)
        t0 = time.monotonic_ns()
        prev = t0
        for k in range(1, n + 1):
            plant.step(dt)
            plant.compute_outputs()
            time.sleep(period_s)
            now = time.monotonic_ns()
            grid.record(max(0, now - (t0 + k * period_ns)))
            interval.record(abs(now - prev - period_ns))
            prev = now
        drift_ms = (prev - (t0 + n * period_ns)) * 1e-6
    finally:
        rt.set_normal()
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return {**summarize(grid), "interval_error": summarize(interval), "drift_ms": round(drift_ms, 3), "warnings": warn}


def _find_image(pid: int, proc, timeout_s: float = 120.0) -> str | None:
    """Name of the process image hil run `pid` created (/dev/shm/hil_<pid>_*), once it exists."""
    import glob

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        names = [os.path.basename(p) for p in glob.glob(f"/dev/shm/hil_{pid}_*") if not p.endswith(".lock")]
        if names:
            return names[0]
        time.sleep(0.01)
    return None


def observe_publishes(proc, cpu: int) -> np.ndarray:
    """Watch hil run's process image as a reader (a PLC-side process) does, spinning on another
    CPU: for each new step, (step, publish_ns stamped by the loop, ns when this reader saw it)."""
    from hil.image import H_OUT_SEQ, H_PUBLISH_NS, H_STEP, ProcessImage

    others = set(os.sched_getaffinity(0)) - {cpu}
    if others:
        os.sched_setaffinity(0, others)
    name = _find_image(proc.pid, proc)
    image = None
    deadline = time.monotonic() + 120.0
    while name is not None and image is None and time.monotonic() < deadline and proc.poll() is None:
        try:  # the block exists before its creator has written the header: retry until it has
            image = ProcessImage.attach(name)
        except ValueError:
            time.sleep(0.001)
    if image is None:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        return np.zeros((0, 3), dtype=np.int64)
    h = image.header
    rows = np.zeros((1 << 21, 3), dtype=np.int64)
    n, last, spins = 0, -1, 0
    try:
        while n < rows.shape[0]:
            s0 = h[H_OUT_SEQ]
            step = h[H_STEP]
            if step != last and not s0 & 1:
                seen = time.monotonic_ns()
                pub = h[H_PUBLISH_NS]
                if h[H_OUT_SEQ] == s0:
                    rows[n] = (step, pub, seen)
                    n += 1
                    last = step
            spins += 1
            if spins & 0x3FFF == 0 and proc.poll() is not None:
                break
    finally:
        del h
        image.close()
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return rows[:n]


def publish_latency(record_dir: str, seen: np.ndarray) -> dict:
    """Deadline -> outputs in the image, per step: `publish` (the loop's own stamp, after the
    step's plant, gaps and image write) and `visible` (when a spinning reader saw the new step).
    Deadline of recorded step k = wall_ns - lateness (both taken as the step started); the image
    carries step k + 1 once step k is published."""
    df = _recording(record_dir)
    deadline = df["wall_ns"].to_numpy(np.float64) - df["lateness_us"].to_numpy(np.float64) * 1e3
    by_step = dict(zip(df["step"].astype(np.int64).to_numpy() + 1, deadline))
    pub, vis = LatencyHistogram(), LatencyHistogram()
    for step, publish_ns, seen_ns in seen:
        d = by_step.get(int(step))
        if d is None:
            continue
        pub.record(max(0, int(publish_ns - d)))
        vis.record(max(0, int(seen_ns - d)))
    return {"publish": summarize(pub), "visible_to_reader": summarize(vis), "steps_observed": int(len(seen)),
            "steps_recorded": int(len(df))}


def _recording(record_dir: str):
    import pandas as pd

    return pd.read_parquet(record_dir, columns=["step", "wall_ns", "lateness_us"])


def hil_loop(duration_s: float, priority: int, cpu: int, record_dir: str, rate_hz: float = 1000.0) -> dict:
    """`hil run` of the bioreactor (1 s plant step) at time_scale = rate_hz: one step per 1 / rate_hz s."""
    cmd = [sys.executable, "-m", "hil.cli", "run", str(ROOT / "configs/bioreactor.toml"), "--json", "--quiet",
           "--duration", str(duration_s * rate_hz), "--record", record_dir,
           "--set", f"loop.time_scale={rate_hz}", "--set", f"loop.priority={priority}", "--set", f"loop.cpu={cpu}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        seen = observe_publishes(proc, cpu)
        stdout, stderr = proc.communicate(timeout=duration_s * 3 + 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"hil run failed: {stderr[-2000:]}")
    summary = json.loads(stdout.strip().splitlines()[-1])
    lat = summary["lateness_us"]
    late = _recording(record_dir)["lateness_us"].to_numpy(np.float64)  # every recorded step (decimate 1)
    period_us = 1e6 / rate_hz
    return {
        "lateness_histogram": lateness_histogram(late), "recorded_steps": int(late.size),
        "over_period_per_10k": per_10k(int((late >= period_us).sum()), int(late.size)),
        "p50_us": lat["p50"], "p99_us": lat["p99"], "p999_us": lat["p999"], "max_us": lat["max"], "n": lat["n"],
        "overruns": summary["overruns"], "late_steps": summary["late_steps"],
        "spin_cpu_fraction": summary["spin_cpu_fraction"], "dropped_rows": summary["dropped_rows"],
        "scheduling": summary.get("scheduling"), "warnings": summary["warnings"],
        "deadline_to_image": publish_latency(record_dir, seen),
    }


def cyclictest(duration_s: float, priority: int, cpu: int, rate_hz: float = 1000.0) -> dict:
    exe = shutil.which("cyclictest")
    if exe is None:
        return {"error": "cyclictest not installed (Debian package rt-tests)"}
    loops = int(duration_s * rate_hz)
    interval_us = max(1, int(round(1e6 / rate_hz)))
    cmd = [exe, "-m", "-q", "-i", str(interval_us), "-l", str(loops), "-h", "20000"]
    cmd += ["-p", str(priority)] if priority > 0 else ["--policy", "other"]
    if cpu >= 0:
        cmd += ["-a", str(cpu)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s * 3 + 60)
    if out.returncode != 0:
        return {"error": f"cyclictest failed: {out.stderr.strip()[-500:]}"}
    counts = np.zeros(20001, dtype=np.int64)
    overflow = 0
    max_us = None
    for line in out.stdout.splitlines():
        if line.startswith("# Max Latencies:"):
            max_us = float(line.split(":")[1].split()[0])
        elif line.startswith("# Histogram Overflows:"):
            overflow = int(line.split(":")[1].split()[0])
        elif line and line[0].isdigit():
            us, c = line.split()[:2]
            counts[int(us)] = int(c)
    n = int(counts.sum()) + overflow
    cum = np.cumsum(counts)

    def pct(q: float) -> float:
        rank = int(np.ceil(q / 100 * n))
        idx = int(np.searchsorted(cum, rank))
        return float(idx) if idx <= 20000 else float(max_us or 20000)

    us = np.arange(counts.size, dtype=np.float64)
    hist = lateness_histogram(np.repeat(us, counts))
    hist[f"{LATENESS_BINS_US[-1]}+"] += overflow  # beyond the 20 ms histogram: late by more than 1 ms too
    over = int(counts[interval_us:].sum()) + overflow
    return {"p50_us": pct(50), "p99_us": pct(99), "p999_us": pct(99.9), "max_us": max_us, "n": n,
            "resolution_us": 1.0, "interval_us": interval_us, "lateness_histogram": hist,
            "over_period_per_10k": per_10k(over, n)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=1000.0, help="loop rate in Hz (issue 19: 10000 and 20000)")
    ap.add_argument("--duration", type=float, default=10.0, help="wall seconds per contender")
    ap.add_argument("--priority", type=int, default=80, help="SCHED_FIFO priority for all three (0 = normal)")
    ap.add_argument("--cpu", type=int, default=1 if (os.cpu_count() or 1) > 1 else 0, help="CPU for all three")
    args = ap.parse_args()
    if not (1.0 <= args.rate <= 100_000.0):
        raise SystemExit(f"--rate: {args.rate:g} Hz is outside 1..100000")
    period_s = 1.0 / args.rate
    print(f"{args.rate:g} Hz, {args.duration:g} s each, priority {args.priority}, cpu {args.cpu}, "
          f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    load_before = os.getloadavg()
    naive = naive_loop(args.duration, period_s, args.priority, args.cpu)
    print(f"naive   p99 {naive['p99_us']:.1f} us (drift {naive['drift_ms']:.1f} ms)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        hil = hil_loop(args.duration, args.priority, args.cpu, os.path.join(tmp, "rec"), args.rate)
    pub = hil["deadline_to_image"]["publish"]
    vis = hil["deadline_to_image"]["visible_to_reader"]
    print(f"hil     wake-up p99 {hil['p99_us']:.1f} us, overruns {hil['overruns']} "
          f"({per_10k(hil['overruns'], hil['n']):g} per 10k), late by a period or more "
          f"{hil['over_period_per_10k']:g} per 10k", file=sys.stderr)
    print(f"hil     deadline -> published p50 {pub['p50_us']:.1f} p99 {pub['p99_us']:.1f} "
          f"p99.9 {pub['p999_us']:.1f} us; seen by a reader p99 {vis['p99_us']:.1f} us", file=sys.stderr)
    ct = cyclictest(args.duration, args.priority, args.cpu, args.rate)
    print(f"cyclict p99 {ct.get('p99_us')} us", file=sys.stderr)
    ratio = hil["p99_us"] / ct["p99_us"] if ct.get("p99_us") else None

    def vs_ct(key: str) -> float | None:
        return round(pub[key] / ct[key], 3) if ct.get(key) else None
    cycles = max(hil["n"], 1)
    result = {
        "benchmark": "loop_jitter",
        "rate_hz": args.rate,
        "load_average": {"before": [round(v, 2) for v in load_before], "after": [round(v, 2) for v in os.getloadavg()],
                         "cpus": os.cpu_count()},
        "duration_s_each": args.duration,
        "priority": args.priority,
        "cpu": args.cpu,
        "naive": naive,
        "hil": hil,
        "cyclictest": ct,
        "hil_overruns": hil["overruns"],
        "hil_overruns_per_10k": per_10k(hil["overruns"], cycles),
        "hil_over_period_per_10k": hil["over_period_per_10k"],
        "cyclictest_over_period_per_10k": ct.get("over_period_per_10k"),
        "goal_overruns_per_10k": (goal := {10000.0: 0.0, 20000.0: 5.0}.get(float(args.rate))),
        "goal_met": None if goal is None else per_10k(hil["overruns"], cycles) <= goal,
        "ratio_p99_vs_cyclictest": None if ratio is None else round(ratio, 4),
        "hil_p999_le_cyclictest_p999": (hil["p999_us"] <= ct["p999_us"]) if ct.get("p999_us") is not None else None,
        "spin_cpu_fraction": hil["spin_cpu_fraction"],
        "hil_publish_us": {k: pub[k] for k in ("p50_us", "p99_us", "p999_us", "max_us", "n")},
        "hil_visible_to_reader_us": {k: vis[k] for k in ("p50_us", "p99_us", "p999_us", "max_us", "n")},
        "ratio_publish_p99_vs_cyclictest": vs_ct("p99_us"),
        "ratio_publish_p999_vs_cyclictest": vs_ct("p999_us"),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
