"""Plots of a recording: true vs measured outputs, commanded vs applied inputs, setpoints.

    hil plot RECORDING [-o out.png] [--signals glucose,dissolved_oxygen,ph]

One panel per signal, sharing the time axis in hours. For an output, the true value
(`y.`) and the measured one (`meas.`, as served to the PLC) when they differ; for an input,
the commanded (`cmd.`) and applied (`app.`) values. Setpoints (a constant, or a recorded
column) are drawn dashed.

Array groups (`node.temp`, from `_meta.json` "groups") get one panel with a line per element
(true outputs, or applied inputs); by default every output group is one panel and every
output outside a group one panel of its own. Element names (`node_3.temp`) plot as any signal.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_recording(path: str | Path, out_png: str | Path | None = None, signals: list[str] | None = None,
                   setpoints: dict[str, float] | None = None, title: str | None = None,
                   extra: dict[str, "object"] | None = None) -> Path:
    """Write a PNG of `signals` (default: every output) and return its path.

    extra: {panel_name: pandas.Series indexed by t_s} drawn as additional panels (e.g.
    the SoftPLC's outputs from its scan log).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hil.recorder import read_meta, read_recording

    path = Path(path)
    df = read_recording(path)
    meta = read_meta(path)
    units = meta.get("units", {})
    groups = _groups(df, meta)
    if signals is None:
        grouped = {n for kind, g, names in groups.values() if kind == "outputs" for n in names}
        signals = [c[2:] for c in df.columns if c.startswith("y.") and c[2:] not in grouped]
        signals += [g for g, (kind, _, _) in groups.items() if kind == "outputs"]
    setpoints = setpoints or {}
    extra = extra or {}
    n = len(signals) + len(extra)
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.9 * n + 0.8), sharex=True, squeeze=False)
    hours = df["t_s"].to_numpy() / 3600.0
    for ax, name in zip(axes[:, 0], signals):
        if name in groups:
            kind, unit, names = groups[name]
            prefix = "y." if kind == "outputs" else "app."
            for el in names:
                ax.plot(hours, df[prefix + el].to_numpy(), lw=0.8, label=el)
            ax.set_ylabel(f"{name}[{len(names)}]\n[{unit}]" if unit else name, fontsize=8)
            ax.grid(alpha=0.3)
            if len(names) <= 10:
                ax.legend(loc="upper right", fontsize=6, ncol=2)
            continue
        if f"y.{name}" in df:
            true, meas = df[f"y.{name}"].to_numpy(), df[f"meas.{name}"].to_numpy()
            unit = units.get(f"y.{name}", "")
            ax.plot(hours, true, color="tab:blue", lw=1.2, label="true")
            if not np.array_equal(true, meas, equal_nan=True):
                ax.plot(hours, meas, color="tab:orange", lw=0.6, alpha=0.8, label="measured")
        elif f"cmd.{name}" in df:
            unit = units.get(f"cmd.{name}", "")
            ax.plot(hours, df[f"cmd.{name}"], color="tab:gray", lw=0.8, label="commanded")
            ax.plot(hours, df[f"app.{name}"], color="tab:green", lw=1.2, label="applied")
        else:
            raise KeyError(f"{name!r} is neither an output nor an input of this recording")
        if name in setpoints:
            ax.axhline(setpoints[name], color="tab:red", ls="--", lw=1, label="setpoint")
        ax.set_ylabel(f"{name}\n[{unit}]" if unit else name, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=7)
    for ax, (name, series) in zip(axes[len(signals):, 0], extra.items()):
        ax.plot(np.asarray(series.index) / 3600.0, series.to_numpy(), color="tab:purple", lw=1.0)
        ax.set_ylabel(name, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("simulated time [h]")
    fig.suptitle(title or f"{meta.get('plant', '')}: {path.name}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    out = Path(out_png) if out_png else path / "plot.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _groups(df, meta: dict) -> dict[str, tuple[str, str, list[str]]]:
    """{group name: (kind, unit, element names)} of the output and input groups recorded
    (`_meta.json` "groups": "<kind>.<group>" -> [start, size, unit], in the spec's order)."""
    cols = {"outputs": [c[2:] for c in df.columns if c.startswith("y.")],
            "inputs": [c[4:] for c in df.columns if c.startswith("cmd.")]}
    out = {}
    for key, (start, size, unit) in (meta.get("groups") or {}).items():
        kind, _, name = key.partition(".")
        if kind in cols and start + size <= len(cols[kind]):
            out[name] = (kind, unit, cols[kind][start:start + size])
    return out
