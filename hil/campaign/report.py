"""Campaign reports: JUnit XML (one test case per run and criterion) and one self-contained
HTML file (the scenario x fault matrix of pass rates, the per-criterion statistics with
Clopper-Pearson bounds and the worst run linked, and per run an inline SVG plot of the
report's signals with the fault window shaded and the safety's interventions marked).
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from xml.etree import ElementTree as ET

from hil.campaign.stats import matrix, summarize


def split_canaries(results: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the campaign's runs, the canary runs)."""
    return ([r for r in results if not r["run"].get("canary")], [r for r in results if r["run"].get("canary")])


def canary_summary(c, canary_results: list[dict]) -> dict:
    """Per canary: its runs, which failed as they must, which did not. A canary run that passed,
    errored (proved nothing) or is missing makes the campaign INVALID."""
    out: dict = {}
    by = {r["run"]["run_id"]: r for r in canary_results}
    from hil.campaign.expand import expand

    for run in (r for r in expand(c) if r.canary):
        s = out.setdefault(run.canary, {"description": c.canaries[run.canary].description, "runs": 0,
                                        "failed_as_expected": 0, "passed": [], "not_run": [], "caught_by": {}})
        s["runs"] += 1
        r = by.get(run.run_id)
        if r is None or r.get("verdict") == "error":
            s["not_run"].append(run.run_id)
        elif r.get("verdict") == "pass":
            s["passed"].append(run.run_id)
        else:
            s["failed_as_expected"] += 1
            for n in r.get("failed", []):
                s["caught_by"][n] = s["caught_by"].get(n, 0) + 1
    return out


def seen_rates(c, results: list[dict]) -> dict:
    """Per scenario|fault (faulted runs only): runs in which the fault was seen (hil/campaign/paired.py)."""
    out: dict = {}
    for r in results:
        if r.get("seen") is None:
            continue
        key = f"{r['run']['scenario']}|{r['run']['fault']}"
        cell = out.setdefault(key, {"seen": 0, "runs": 0})
        cell["runs"] += 1
        cell["seen"] += bool(r["seen"])
    for cell in out.values():
        cell["rate"] = cell["seen"] / cell["runs"] if cell["runs"] else 0.0
    return out


def invalid_banner(canaries: dict) -> str | None:
    """The INVALID sentence, or None when every canary run failed as it must."""
    bad = {n: s for n, s in canaries.items() if s["passed"] or s["not_run"]}
    if not bad:
        return None
    parts = [f"{n}: " + ", ".join([f"{x} PASSED" for x in s["passed"]] + [f"{x} did not run" for x in s["not_run"]])
             for n, s in bad.items()]
    return ("CAMPAIGN INVALID: known-bad canary runs did not fail, so these criteria cannot be trusted to "
            "catch what they claim (" + "; ".join(parts) + ")")


def write_junit(c, results: list[dict], path: Path) -> None:
    suites = ET.Element("testsuites", name=c.name)
    by_scn: dict = {}
    results, canary_runs = split_canaries(results)
    for r in canary_runs:
        rid = r["run"]["run_id"]
        tc = ET.Element("testcase", classname=f"{c.name}.canaries", name=f"{rid}::must_fail",
                        time=str(r.get("wall_s", 0)))
        if r.get("verdict") == "pass":
            ET.SubElement(tc, "failure", message="a known-bad canary run passed every criterion: campaign INVALID",
                          type="canary")
        elif r.get("verdict") == "error":
            ET.SubElement(tc, "error", message=r.get("error", "")).text = r.get("traceback", "")
        by_scn.setdefault("__canaries__", []).append(tc)
    for r in results:
        by_scn.setdefault(r["run"]["scenario"], []).append(r)
    for scn, rs in by_scn.items():
        cases = []
        if scn == "__canaries__":
            suite = ET.SubElement(suites, "testsuite", name=f"{c.name}.canaries", tests=str(len(rs)),
                                  failures=str(sum(tc.find("failure") is not None for tc in rs)),
                                  errors=str(sum(tc.find("error") is not None for tc in rs)))
            suite.extend(rs)
            continue
        for r in rs:
            rid = r["run"]["run_id"]
            if r.get("verdict") == "error":
                tc = ET.Element("testcase", classname=f"{c.name}.{scn}", name=f"{rid}::run",
                                time=str(r.get("wall_s", 0)))
                ET.SubElement(tc, "error", message=r.get("error", "")).text = r.get("traceback", "")
                cases.append(tc)
                continue
            for name, cr in r.get("criteria", {}).items():
                tc = ET.Element("testcase", classname=f"{c.name}.{scn}", name=f"{rid}::{name}",
                                time=str(r.get("wall_s", 0)))
                if cr["status"] == "fail":
                    ET.SubElement(tc, "failure", message=cr.get("detail", "")[:500],
                                  type=name).text = f"{rid}: {cr.get('detail', '')}"
                elif cr["status"] == "n/a":
                    ET.SubElement(tc, "skipped", message=cr.get("detail", ""))
                cases.append(tc)
        suite = ET.SubElement(suites, "testsuite", name=f"{c.name}.{scn}", tests=str(len(cases)),
                              failures=str(sum(tc.find("failure") is not None for tc in cases)),
                              errors=str(sum(tc.find("error") is not None for tc in cases)),
                              skipped=str(sum(tc.find("skipped") is not None for tc in cases)))
        suite.extend(cases)
    ET.indent(suites)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"]
_MARK = {"fallback_enter": "#d62728", "silent_enter": "#ff7f0e", "rollback": "#9467bd", "clip": "#bcbd22",
         "loop_fallback": "#e377c2", "alarm": "#8c564b"}


def svg_plot(res: dict, signals: list[str], width: int = 760, row_h: int = 90) -> str:
    """Stacked small plots (one row per signal: true and served / commanded and applied)."""
    plot = res.get("plot") or {}
    t = plot.get("t_s") or []
    if not t:
        return "<p>(no recording)</p>"
    t0, t1 = t[0], t[-1] if t[-1] > t[0] else t[0] + 1
    left, right = 150, 10
    rows = [s for s in signals if any(k in plot for k in (f"y.{s}", f"meas.{s}", f"cmd.{s}", f"app.{s}", s))]
    h = row_h * max(1, len(rows)) + 20
    X = lambda v: left + (v - t0) / (t1 - t0) * (width - left - right)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" font-size="10">']
    f = res.get("fault") or {}
    if f.get("start_s") is not None:
        a = X(max(t0, f["start_s"]))
        b = X(min(t1, f["end_s"] if f.get("end_s") is not None else t1))
        parts.append(f'<rect x="{a:.1f}" y="0" width="{max(1.0, b - a):.1f}" height="{h - 20}" fill="#fdd" '
                     f'opacity="0.6"><title>fault {html.escape(f.get("kind", ""))}</title></rect>')
    for ev in res.get("interventions", []):
        x = X(min(max(ev["t_s"], t0), t1))
        col = _MARK.get(ev["kind"], "#000")
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{h - 20}" stroke="{col}" stroke-width="1" '
                     f'stroke-dasharray="3,2"><title>{html.escape(ev["kind"])} t={ev["t_s"]:g} s '
                     f'{html.escape(ev.get("detail", ""))}</title></line>')
    for j, s in enumerate(rows):
        y0 = j * row_h + 4
        series = [(k, plot[k]) for k in (f"y.{s}", f"meas.{s}", f"cmd.{s}", f"app.{s}", s) if k in plot]
        vals = [v for _, vs in series for v in vs if v is not None]
        if not vals:
            continue
        lo, hi = min(vals), max(vals)
        if hi - lo < 1e-12:
            lo, hi = lo - 0.5, hi + 0.5
        Y = lambda v: y0 + (row_h - 12) * (1 - (v - lo) / (hi - lo))  # noqa: E731
        parts.append(f'<text x="4" y="{y0 + 12}">{html.escape(s)}</text>'
                     f'<text x="4" y="{y0 + 26}" fill="#666">{hi:.4g}</text>'
                     f'<text x="4" y="{y0 + row_h - 14}" fill="#666">{lo:.4g}</text>'
                     f'<rect x="{left}" y="{y0}" width="{width - left - right}" height="{row_h - 12}" fill="none" '
                     f'stroke="#ccc"/>')
        for i, (k, vs) in enumerate(series):
            pts, segs = [], []
            for tv, v in zip(t, vs):
                if v is None:
                    if pts:
                        segs.append(pts)
                    pts = []
                else:
                    pts.append(f"{X(tv):.1f},{Y(v):.1f}")
            if pts:
                segs.append(pts)
            for seg in segs:
                parts.append(f'<polyline fill="none" stroke="{_COLORS[i % len(_COLORS)]}" stroke-width="1" '
                             f'points="{" ".join(seg)}"><title>{html.escape(k)}</title></polyline>')
        parts.append(f'<text x="{left + 4}" y="{y0 + 10}" fill="#444">'
                     + " ".join(f'<tspan fill="{_COLORS[i % len(_COLORS)]}">{html.escape(k)}</tspan>'
                                for i, (k, _) in enumerate(series)) + "</text>")
    parts.append(f'<text x="{left}" y="{h - 6}">t = {t0:g} s</text>'
                 f'<text x="{width - right - 80}" y="{h - 6}">{t1:g} s</text></svg>')
    return "".join(parts)


def _pct(a: int, n: int) -> str:
    return f"{100 * a / n:.0f} %" if n else "-"


def write_html(c, results: list[dict], path: Path, confidence: float = 0.95, max_plots: int = 400) -> None:
    all_results = results
    results, canary_runs = split_canaries(results)
    canaries = canary_summary(c, canary_runs)
    banner = invalid_banner(canaries)
    seen = seen_rates(c, results)
    stats = summarize(results, confidence)
    m = matrix(results)
    scns = [s.name for s in c.scenarios]
    faults = list(c.faults)
    esc = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(c.name)}</title><style>"
           "body{font-family:sans-serif;margin:20px}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
           "padding:3px 7px;font-size:13px}.pass{background:#dfd}.fail{background:#fdd}.part{background:#ffd}"
           "details{margin:4px 0}summary{cursor:pointer}</style></head><body>",
           f"<h1>Campaign {esc(c.name)}</h1>"
           + (f"<div style='background:#c00;color:#fff;padding:12px;font-size:18px;font-weight:bold'>"
              f"{esc(banner)}</div>" if banner else "")
           + f"<p>{esc(c.campaign.description)}</p>",
           f"<p>{len(results)} runs, mode {esc(c.campaign.mode)}, {len(c.seed_list())} seeds. "
           f"Verdict: <b>{'INVALID' if banner else 'FAIL' if any(r.get('verdict') != 'pass' for r in results) else 'PASS'}"
           f"</b></p>",
           "<h2>Pass rate by scenario x fault</h2><table><tr><th></th>"
           + "".join(f"<th>{esc(f)}<br><small>{esc(c.faults[f].get('kind', ''))}</small></th>" for f in faults)
           + "</tr>"]
    for s in scns:
        out.append(f"<tr><th>{esc(s)}</th>")
        for f in faults:
            a, n = m.get((s, f), (0, 0))
            cls = "" if not n else "pass" if a == n else "fail" if a == 0 else "part"
            out.append(f"<td class='{cls}'>{_pct(a, n)}<br><small>{a}/{n}</small></td>")
        out.append("</tr>")
    out.append("</table><h2>Canaries (known-bad runs that must fail)</h2><table><tr><th>canary</th><th>failed as "
               "expected</th><th>caught by</th><th>passed (INVALID)</th></tr>")
    for n, s in canaries.items():
        cls = "fail" if s["passed"] or s["not_run"] else "pass"
        out.append(f"<tr class='{cls}'><td>{esc(n)}<br><small>{esc(s['description'])}</small></td>"
                   f"<td>{s['failed_as_expected']}/{s['runs']}</td><td>{esc(', '.join(f'{k} ({v})' for k, v in s['caught_by'].items()))}</td>"
                   f"<td>{esc(', '.join(s['passed'] + [x + ' (not run)' for x in s['not_run']]))}</td></tr>")
    out.append("</table><h2>Faults seen (a paired criterion failed or the fallback detected it)</h2><table>"
               "<tr><th>scenario | fault</th><th>seen</th></tr>")
    for k, v in seen.items():
        out.append(f"<tr><td>{esc(k)}</td><td>{v['seen']}/{v['runs']}</td></tr>")
    out.append("</table><h2>Criteria</h2><table><tr><th>criterion</th><th>held</th><th>bound</th>"
               "<th>worst run</th><th>failed runs</th></tr>")
    for name, s in stats.items():
        cls = "pass" if s["passed"] == s["runs"] else "fail"
        worst = f"<a href='#{esc(s['worst_run'])}'>{esc(s['worst_run'])}</a>" if s.get("worst_run") else ""
        failed = ", ".join(f"<a href='#{esc(x)}'>{esc(x)}</a>" for x in s["failed"][:20])
        if len(s["failed"]) > 20:
            failed += f" ... (+{len(s['failed']) - 20})"
        out.append(f"<tr class='{cls}'><td>{esc(name)}</td><td>{s['passed']}/{s['runs']}</td>"
                   f"<td>{esc(s['sentence'])}</td><td>{worst}</td><td>{failed}</td></tr>")
    out.append("</table><h2>Runs</h2><p>Fault window shaded red; dashed lines: safety interventions "
               + ", ".join(f"<span style='color:{v}'>{k}</span>" for k, v in _MARK.items()) + ".</p>")
    # failing runs first, then the rest; plots for at most max_plots runs
    ordered = sorted(all_results, key=lambda r: r.get("verdict") == "pass")
    for i, r in enumerate(ordered):
        rid = r["run"]["run_id"]
        v = r.get("verdict")
        head = (f"<summary id='{esc(rid)}' class='{'pass' if v == 'pass' else 'fail'}'>{esc(rid)}: {esc(str(v))}"
                + (f" ({esc(', '.join(r.get('failed', [])))})" if r.get("failed") else "")
                + f" <small>seed {r['run']['seed']}, fault at {r['run']['start_s']:g} s, "
                  f"{r.get('wall_s', 0):.1f} s wall</small></summary>")
        body = ["<table><tr><th>criterion</th><th>status</th><th>value</th><th>detail</th></tr>"]
        for name, cr in r.get("criteria", {}).items():
            val = cr.get("value")
            val = f"{val:.6g}" if isinstance(val, float) and math.isfinite(val) else esc(str(val))
            body.append(f"<tr class='{cr['status'] if cr['status'] != 'n/a' else ''}'><td>{esc(name)}</td>"
                        f"<td>{cr['status']}</td><td>{val}</td><td>{esc(cr.get('detail', ''))}</td></tr>")
        body.append("</table>")
        if r.get("error"):
            body.append(f"<pre>{esc(r['error'])}\n{esc(r.get('traceback', ''))}</pre>")
        if i < max_plots:
            body.append(svg_plot(r, c.report.signals))
        body.append(f"<p><small>replay: <code>hil campaign replay {esc(rid)} --campaign {esc(c.source)}</code>"
                    f"; digest {esc(str(r.get('digest', ''))[:16])}</small></p>")
        out.append(f"<details{' open' if v != 'pass' and i < 5 else ''}>{head}{''.join(body)}</details>")
    out.append("</body></html>")
    path.write_text("".join(out))


def write_reports(c, results: list[dict], out_dir: Path, confidence: float = 0.95) -> dict:
    """junit.xml, report.html and summary.json in out_dir; returns the summary."""
    out_dir = Path(out_dir)
    write_junit(c, results, out_dir / "junit.xml")
    write_html(c, results, out_dir / "report.html", confidence)
    results, canary_runs = split_canaries(results)
    canaries = canary_summary(c, canary_runs)
    banner = invalid_banner(canaries)
    stats = summarize(results, confidence)
    m = matrix(results)
    summary = {"campaign": c.name, "runs": len(results),
               "passed_runs": sum(r.get("verdict") == "pass" for r in results),
               "failed_runs": [r["run"]["run_id"] for r in results if r.get("verdict") != "pass"],
               "valid": banner is None, "invalid_reason": banner, "canaries": canaries,
               "seen": seen_rates(c, results),
               "criteria": stats, "matrix": {f"{s}|{f}": v for (s, f), v in m.items()},
               "junit": str(out_dir / "junit.xml"), "html": str(out_dir / "report.html")}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
