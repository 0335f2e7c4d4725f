"""Plots of an evaluation: speedup over AR with its CI, τ per prompt, and the acceptance rate
by depth."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mcsd_runtime import metrics
from mcsd_runtime.evaluate.methods import is_hf_reference, short_name
from mcsd_runtime.evaluate.record import Record


def plot(records: list[Record], rows: list[dict], out: Path, title: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    title = textwrap.fill(title, 80, break_on_hyphens=False)

    def save(fig, ax, name: str) -> None:
        ax.set_title(title, fontsize=8)
        ax.tick_params(labelsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120, bbox_inches="tight")
        files.append(name)
        plt.close(fig)

    named = [r for r in rows if r["geomean_vs_ar"] is not None and None not in r["ci_vs_ar"]]
    fig, ax = plt.subplots(figsize=(7, 1.5 + 0.3 * len(named)))
    geo = [r["geomean_vs_ar"] for r in named]
    err = [[g - r["ci_vs_ar"][0] for g, r in zip(geo, named, strict=True)],
           [r["ci_vs_ar"][1] - g for g, r in zip(geo, named, strict=True)]]
    ax.barh([short_name(r["method"]) for r in named], geo, xerr=err, color="tab:blue",
            error_kw={"lw": 1, "capsize": 2})
    ax.axvline(1.0, color="gray", lw=1)
    ax.invert_yaxis()
    ax.set_xlabel("speedup vs AR: geometric mean of per-prompt ratios, 95% CI")
    save(fig, ax, "speedup.png")

    methods = [r["method"] for r in rows
               if r["method"] != "ar" and not is_hf_reference(r["method"])]
    fig, ax = plt.subplots(figsize=(7, 1.5 + 0.3 * len(methods)))
    data = [[metrics.tau(r.new_tokens, r.target_calls) for r in records if r.method == m]
            for m in methods]
    if methods:
        ax.boxplot(data, tick_labels=[short_name(m) for m in methods], vert=False)
        ax.invert_yaxis()
    ax.set_xlabel("τ per prompt (tokens / target call)")
    save(fig, ax, "tau.png")

    fig, ax = plt.subplots(figsize=(9, 4))
    for i, m in enumerate(methods):
        steps = [s for r in records if r.method == m for s in r.steps]
        depth = max((d for d, _ in steps), default=0)
        xs, ys = [], []
        for d in range(1, depth + 1):
            reached = [a for s, a in steps if s >= d and a >= d - 1]
            if reached:
                xs.append(d)
                ys.append(sum(a >= d for a in reached) / len(reached))
        ax.plot(xs, ys, label=short_name(m), **line_style(i))
    ax.set_xlabel("depth d")
    ax.set_ylabel("P(depth d accepted | d-1 accepted)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if methods:  # beside the axes, never over the data
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    save(fig, ax, "acceptance_by_depth.png")
    return files


def line_style(i: int) -> dict:
    """Colour, marker and dash of the i-th line: 10 distinct colours, then the same colours with
    other markers and dashes, so no two of up to 40 lines look alike."""
    import matplotlib

    colours = matplotlib.colormaps["tab10"].colors
    return {"color": colours[i % 10], "marker": "os^D"[i // 10 % 4],
            "linestyle": ("-", "--", "-.", ":")[i // 10 % 4], "markersize": 4}
