"""Statistics of a campaign: per criterion pass counts with exact (Clopper-Pearson) bounds.

"held in 200/200 runs: >= 98.5 % at 95 % confidence" is the one-sided lower bound of the
binomial pass probability: the p with P(X >= k | n, p) = alpha, i.e. beta.ppf(alpha, k, n-k+1)
(0 when k = 0). Runs where a criterion is n/a (e.g. fallback_within without a fault) do not count.
"""

from __future__ import annotations

import math


def clopper_pearson_lower(k: int, n: int, confidence: float = 0.95) -> float:
    """One-sided lower confidence bound of the pass probability after k passes in n runs."""
    from scipy.stats import beta

    if n <= 0 or k <= 0:
        return 0.0
    return float(beta.ppf(1.0 - confidence, k, n - k + 1))


def clopper_pearson_upper(k: int, n: int, confidence: float = 0.95) -> float:
    from scipy.stats import beta

    if n <= 0 or k >= n:
        return 1.0
    return float(beta.ppf(confidence, k + 1, n - k))


def summarize(results: list[dict], confidence: float = 0.95) -> dict:
    """{criterion: {"passed", "runs", "failed", "lower", "upper", "worst_run", "sentence"}}.

    The worst run: the one with the smallest margin to the criterion's limit (a failed run before
    any passing one; the criteria give "margin" in the criterion's unit, e.g. % x s for an IAE);
    without margins the largest value."""
    out: dict = {}
    for r in results:
        for name, cr in r.get("criteria", {}).items():
            s = out.setdefault(name, {"passed": 0, "runs": 0, "failed": [], "_worst": None})
            if cr["status"] == "n/a":
                continue
            s["runs"] += 1
            ok = cr["status"] == "pass"
            s["passed"] += ok
            if not ok:
                s["failed"].append(r["run"]["run_id"])
            v = cr.get("margin")
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                v = -v  # smaller margin = worse
            else:
                v = cr.get("value")
            score = (0 if ok else 1, v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                     else (math.inf if not ok else -math.inf))
            if s["_worst"] is None or score > s["_worst"][0]:
                s["_worst"] = (score, r["run"]["run_id"])
    for name, s in out.items():
        k, n = s["passed"], s["runs"]
        s["lower"] = clopper_pearson_lower(k, n, confidence)
        s["upper"] = clopper_pearson_upper(k, n, confidence)
        s["worst_run"] = s.pop("_worst")[1] if s["_worst"] else None
        s["sentence"] = (f"held in {k}/{n} runs: >= {100 * s['lower']:.1f} % at {100 * confidence:.0f} % confidence"
                         if n else "not applicable in any run")
    errors = [r["run"]["run_id"] for r in results if r.get("verdict") == "error"]
    if errors:
        out["_errors"] = {"passed": 0, "runs": len(errors), "failed": errors, "lower": 0.0, "upper": 1.0,
                          "worst_run": errors[0], "sentence": f"{len(errors)} run(s) could not run"}
    return out


def matrix(results: list[dict]) -> dict:
    """{(scenario, fault): [passed runs, runs]} over whole-run verdicts."""
    m: dict = {}
    for r in results:
        key = (r["run"]["scenario"], r["run"]["fault"])
        cell = m.setdefault(key, [0, 0])
        cell[1] += 1
        cell[0] += r.get("verdict") == "pass"
    return m
