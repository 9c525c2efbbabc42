"""The campaign driver: expand, skip what is done, execute, report.

    results = run_campaign(campaign, out_dir, executor="local", workers=0, progress=True)

Layout of `out_dir`: campaign.json (the validated campaign, for replay), results/<run_id>.json
(one per finished run: the resume marker), runs/<run_id>/ (recording, decision log),
junit.xml, report.html, summary.json, progress.json (rewritten after every run: the live
dashboard's campaign view, `hil campaign run --dashboard`; see `CampaignProgress`).

A run that errored (could not run: a helper that did not come up, ...) is retried at once up to
[campaign].retries times; its last error is saved for the report but never counts as done: the
next `hil campaign run` runs it again. Once every run has a result, the paired criteria
(hil/campaign/paired.py) compare each faulted run with its no-fault twin.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hil.campaign.expand import expand
from hil.campaign.worker import run_paths


def load_results(out_dir: Path, runs, include_errors: bool = False) -> list[dict]:
    """The saved results of `runs` (an errored run only with include_errors: it is no verdict)."""
    out = []
    for r in runs:
        _, path = run_paths(out_dir, r.run_id)
        if path.exists():
            try:
                res = json.loads(path.read_text())
            except ValueError:
                continue  # half-written: runs again
            if include_errors or res.get("verdict") != "error":  # an error is no verdict: it runs again
                out.append(res)
    return out


def save_campaign(c, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "campaign.json").write_text(json.dumps(c.model_dump(mode="python"), indent=1))  # inf kept


def read_campaign(out_dir: Path):
    """The campaign saved in an output directory (by run_campaign)."""
    from hil.campaign.schema import Campaign

    return Campaign.model_validate(json.loads((Path(out_dir) / "campaign.json").read_text()))


class CampaignProgress:
    """progress.json in the output directory: total, done, pass/fail counts, the latest results,
    state ("running", then "finished" or "interrupted"), the driver's pid. Written atomically
    after each finished run (never from a worker), so a reader never sees half a file."""

    KEEP = 20  # latest results listed

    def __init__(self, c, out_dir: Path, total: int, done: int, passed: int):
        self.path = Path(out_dir) / "progress.json"
        self.data = {"campaign": c.name, "pid": os.getpid(), "total": total, "done": done, "pass": passed,
                     "fail": done - passed, "state": "running", "started_unix_s": time.time(), "elapsed_s": 0.0,
                     "latest": []}
        self._t0 = time.monotonic()
        self.write()

    def result(self, res: dict) -> None:
        d = self.data
        d["done"] += 1
        d["pass" if res.get("verdict") == "pass" else "fail"] += 1
        d["latest"] = ([{"run_id": res.get("run", {}).get("run_id"), "verdict": res.get("verdict"),
                         "failed": [str(k) for k in (res.get("failed") or [])][:5],
                         "wall_s": res.get("wall_s"), "error": res.get("error")}]
                       + d["latest"])[: self.KEEP]
        self.write()

    def write(self, state: str | None = None) -> None:
        from hil.atomic import write_json_atomic

        if state:
            self.data["state"] = state
        self.data["elapsed_s"] = round(time.monotonic() - self._t0, 3)
        try:
            write_json_atomic(self.path, self.data, default=str)
        except OSError:  # a progress file that cannot be written never stops a campaign
            pass


def run_campaign(c, out_dir: Path, *, executor: str = "local", workers: int = 0, address: str | None = None,
                 progress: bool = True, console=None, realtime: bool | None = None,
                 only: list[str] | None = None, cold: bool = False,
                 policy_cache: bool = True, warm_processes: bool = True) -> list[dict]:
    """Run every run of the campaign that has no result yet; return all results (old and new).
    cold: the local pool starts a fresh worker per run; policy_cache=False: its warm workers do not
    share the policy's Numba cache (both for benchmarks only; see executors.run_local)."""
    out_dir = Path(out_dir)
    save_campaign(c, out_dir)
    runs = expand(c)
    if only:
        runs = [r for r in runs if r.run_id in only]
    done = {r["run"]["run_id"]: r for r in load_results(out_dir, runs)}
    todo = [r for r in runs if r.run_id not in done]
    # real time: one run at a time unless asked (a real-time loop needs a core of its own)
    default = 1 if c.campaign.mode == "realtime" else (os.cpu_count() or 1)
    workers = workers or c.campaign.workers or default
    workers = min(workers, max(1, len(todo)))
    counts = {"pass": sum(r.get("verdict") == "pass" for r in done.values())}
    counts["fail"] = len(done) - counts["pass"]
    results = list(done.values())

    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("[green]{task.fields[ok]} pass[/green] [red]{task.fields[bad]} fail[/red]"),
                       TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                       transient=False)
        task = bar.add_task(c.name, total=len(runs), completed=len(done), ok=counts["pass"], bad=counts["fail"])
        bar.start()

    prog = CampaignProgress(c, out_dir, len(runs), len(done), counts["pass"])

    def on_result(res: dict) -> None:
        prog.result(res)
        results.append(res)
        counts["pass" if res.get("verdict") == "pass" else "fail"] += 1
        if bar is not None:
            bar.update(task, advance=1, ok=counts["pass"], bad=counts["fail"])

    t0 = time.monotonic()
    state = "interrupted"
    try:
        if todo:
            if executor == "ray":
                from hil.campaign.ray_executor import run_ray

                run_ray(c, todo, out_dir, address, on_result, realtime=realtime)
            else:
                from hil.campaign.executors import run_local

                run_local(c, todo, out_dir, workers, on_result, realtime=realtime, cold=cold,
                          policy_cache=policy_cache, warm_processes=warm_processes)
        state = "finished"
    finally:
        prog.write(state)
        if bar is not None:
            bar.stop()
    from hil.campaign.paired import apply_paired

    apply_paired(c, results, out_dir)
    elapsed = time.monotonic() - t0
    order = {r.run_id: i for i, r in enumerate(runs)}
    results.sort(key=lambda r: order.get(r["run"]["run_id"], 1 << 30))
    (out_dir / "last_execution.json").write_text(json.dumps(
        {"executor": executor, "workers": workers, "runs_executed": len(todo), "runs_skipped": len(done),
         "wall_s": round(elapsed, 3)}))
    return results
