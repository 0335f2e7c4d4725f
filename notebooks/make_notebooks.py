"""Writes the three notebooks from the cells below (edit here, then run this file).

Each notebook reads the demo's outputs; `MCSD_DEMO` (default `data/runs/demo`) points it at
another run folder laid out the same way: `collect/`, `stoppers/<name>/`, and the eval files.
"""

from pathlib import Path

import nbformat as nbf

SETUP = """import json, os
from pathlib import Path
import matplotlib.pyplot as plt
import pandas as pd

DEMO = Path(os.environ.get("MCSD_DEMO", "data/runs/demo"))
if not DEMO.exists() and Path("../" + str(DEMO)).exists():  # opened from notebooks/
    DEMO = Path("../" + str(DEMO))
print("reading", DEMO.resolve())"""

NOTEBOOKS = {
    "01_collected_rows.ipynb": [
        ("md", "# Collected rows: draft features against acceptance\n\nOne row per drafted "
               "node (`mcsd collect`). Which cheap draft signals predict that the target "
               "accepts a node?"),
        ("code", SETUP),
        ("code", """from collect import load_manifest, load_rows

run = DEMO / "collect"
manifest = load_manifest(run)
rows = load_rows(run)
print({k: manifest[k] for k in ("k_config", "temperature", "init") if k in manifest})
print(len(rows), "rows,", rows["prompt_id"].nunique(), "prompts")
rows.head()"""),
        ("md", "## Accepted length per step"),
        ("code", """steps = rows.groupby(["prompt_id", "step"])["accepted_length"].first()
ax = steps.value_counts().sort_index().plot.bar()
ax.set_xlabel("accepted length L"); ax.set_ylabel("steps")
print("mean L:", steps.mean())"""),
        ("md", "## Acceptance against each feature\n\nShare of nodes on the accepted path, by "
               "decile of the feature."),
        ("code", """from mcsd_runtime.decisions.features import NODE_FEATURES

fig, axes = plt.subplots(2, 5, figsize=(16, 6))
for ax, name in zip(axes.flat, NODE_FEATURES):
    bins = pd.qcut(rows[name], 10, duplicates="drop")
    rate = rows.groupby(bins, observed=True)["on_accepted_path"].mean()
    ax.plot(range(len(rate)), rate.values, marker="o")
    ax.set_title(name); ax.set_ylim(0, 1)
fig.tight_layout()"""),
        ("md", "## Acceptance by depth"),
        ("code", """by_depth = rows.groupby("depth")["on_accepted_path"].mean()
by_depth.plot(marker="o", ylabel="share of nodes accepted")
by_depth"""),
    ],
    "02_decision_models.ipynb": [
        ("md", "# Decision models: quality, calibration, importance, replayed speed\n\n"
               "Each trained stopper folder holds `metrics.json`, `replay_curve.json` and "
               "plots written by `mcsd train`."),
        ("code", SETUP),
        ("code", """artifacts = sorted(p for p in (DEMO / "stoppers").iterdir()
                   if (p / "metrics.json").is_file())
metrics = {p.name: json.loads((p / "metrics.json").read_text()) for p in artifacts}
pd.DataFrame({name: {**m["metrics"]["test"], **m["headline"]}
              for name, m in metrics.items()}).T"""),
        ("md", "## Calibration"),
        ("code", """fig, ax = plt.subplots()
for name, m in metrics.items():
    cal = m["calibration"]
    ax.plot(cal["mean_predicted"], cal["fraction_positive"], marker="o", label=name)
ax.plot([0, 1], [0, 1], color="gray", lw=1)
ax.set_xlabel("predicted"); ax.set_ylabel("observed"); ax.legend()"""),
        ("md", "## Feature importance (LightGBM: gain and mean |SHAP|; MLP: ROC-AUC drop when "
               "a feature is shuffled)"),
        ("code", """imp = {name: m["importance"] for name, m in metrics.items() if m.get("importance")}
for name, i in imp.items():
    df = pd.DataFrame(i)
    df.sort_values(df.columns[0]).plot.barh(subplots=True, layout=(1, len(df.columns)),
                                            figsize=(5 * len(df.columns), 4), legend=False,
                                            title=name)"""),
        ("md", "## Headroom: the oracle and the share of its gain captured (test prompts)\n\n"
               "`oracle` is the stop plan with the highest replayed tokens/s given every step's "
               "accepted length (a dynamic program, a true bound for free decisions); "
               "`oracle-accepted` stops at exactly the accepted length."),
        ("code", """pd.DataFrame({name: {k: m["headline"].get(k) for k in
    ("best_static", "best_static_value", "oracle_value", "learned_value",
     "speedup_vs_best_static", "oracle_gain_captured", "threshold", "min_depth",
     "replay_decision_us")} for name, m in metrics.items()}).T"""),
        ("md", "## Replay against end-to-end decoding\n\nThe same test prompts decoded with "
               "every static depth and the trained stopper (`mcsd train --check-prompts`)."),
        ("code", """for name, m in metrics.items():
    check = m.get("replay_check")
    if check:
        print(name, "common factor", round(check["common_factor"], 3),
              "same static order:", check["same_static_order"])
        display(pd.DataFrame(check["per_stopper"]).T[["replayed", "measured", "error",
                                                      "relative_error"]])"""),
        ("md", "## Replayed throughput against threshold\n\nStatic depths and the oracle "
               "as lines."),
        ("code", """for p in artifacts:
    rc = json.loads((p / "replay_curve.json").read_text())
    curve = pd.DataFrame(rc["curve"])
    if "min_depth" in curve:  # the chosen min_depth's curve
        curve = curve[curve["min_depth"] == rc["chosen"].get("min_depth", 1)]
    fig, ax = plt.subplots()
    for agg, part in curve.groupby("aggregation"):
        ax.plot(part["threshold"], part[rc["metric"]], marker=".", label=f"learned ({agg})")
    for name, r in rc["baselines_val"].items():
        if name.startswith("static:") or name == "oracle":
            ax.axhline(r[rc["metric"]], ls="--", lw=1, label=name)
    ax.set_title(p.name); ax.set_xlabel("threshold"); ax.set_ylabel(rc["metric"])
    ax.legend(fontsize=7)"""),
    ],
    "03_end_to_end.ipynb": [
        ("md", "# End-to-end results across domains\n\nThe stoppers were trained on standard-"
               "library code; `mcsd eval` ran every method on each domain's prompts in one "
               "process, interleaved prompt by prompt (`eval-t0`: greedy; `eval-t0.7`: "
               "sampling, every method decoding the same number of tokens)."),
        ("code", SETUP),
        ("code", """EVAL = DEMO / "eval-t0"
report = json.loads((EVAL / "domains.json").read_text())
print(report["settings"])
table = pd.DataFrame(report["rows"]).set_index(["domain", "method"])
table[["vs_ar", "vs_deploy", "vs_best_static", "vs_heuristic", "best_static", "tau"]]"""),
        ("md", "Each method's worst domain against the static schedule a user would deploy, the "
               "domain's hindsight best static schedule and the tuned heuristic:"),
        ("code", """pd.DataFrame([{"method": w["method"]} | {k: w[k] and f"{w[k]['geomean']:.3f} "
              f"({w[k]['domain']})" for k in ("deploy", "best_static", "heuristic")}
              for w in report["worst"]]).set_index("method")"""),
        ("code", """records = pd.concat([pd.read_json(f, lines=True).assign(domain=f.parent.name)
                     for f in sorted(EVAL.glob("*/per_prompt.jsonl"))])
ar = records[records.method == "ar"].set_index(["domain", "prompt_id"])["tokens_per_s"]
speed = records.assign(speedup=records.tokens_per_s
                       / ar.reindex(pd.MultiIndex.from_frame(records[["domain", "prompt_id"]]))
                       .to_numpy())
ax = speed.pivot_table(index="method", columns="domain", values="speedup",
                       aggfunc="median").plot.barh(figsize=(8, 6))
ax.set_xlabel("median speedup vs AR per prompt")"""),
        ("md", "Output equality with AR (greedy): every lossless method must say yes on every "
               "domain."),
        ("code", """table["ar_equal"].unstack("domain")"""),
    ],
}


def main() -> None:
    here = Path(__file__).parent
    for name, cells in NOTEBOOKS.items():
        nb = nbf.v4.new_notebook()
        nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src)
                    for kind, src in cells]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        nbf.write(nb, here / name)


if __name__ == "__main__":
    main()
