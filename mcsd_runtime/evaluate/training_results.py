"""What the trained stoppers among the methods recorded when they were trained (each folder's
metrics.json): one line each for the terminal, a table for report.md."""

from __future__ import annotations

import json

from mcsd_runtime.evaluate.cells import fmt
from mcsd_runtime.evaluate.methods import short_name, stopper_folder


def stopper_results(methods: list[str]) -> list[dict]:
    """Training results of the trained stoppers among `methods`, read from each folder's
    metrics.json (held-out AUCs, replayed speed against the best static depth and the oracle,
    the replay's end-to-end check); stoppers without one are left out."""
    out = []
    for m in methods:
        folder = stopper_folder(m)
        path = folder / "metrics.json" if folder is not None else None
        if path is None or not path.is_file():
            continue
        try:
            metrics_ = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        head, test = metrics_.get("headline", {}), metrics_.get("metrics", {}).get("test", {})
        check = metrics_.get("replay_check") or {}
        out.append({"method": m, "model": metrics_.get("model"),
                    "roc_auc": test.get("roc_auc"), "pr_auc": test.get("pr_auc"),
                    "replay_vs_best_static": head.get("speedup_vs_best_static"),
                    "best_static": head.get("best_static"),
                    "oracle_gain_captured": head.get("oracle_gain_captured"),
                    "replay_units": head.get("units"),
                    "check_prompts": check.get("prompts"),
                    "check_max_error": check.get("max_abs_relative_error")})
    return out


def stopper_lines(stoppers: list[dict]) -> list[str]:
    """One line per trained stopper for the terminal (the table is in report.md)."""
    lines = []
    for s in stoppers:
        vs = s["replay_vs_best_static"]
        lines.append(f"{short_name(s['method'])} offline, on its collection's test prompts: "
                     f"ROC-AUC {fmt(s['roc_auc'])}, replayed "
                     + (f"{vs:.3f}x {s['best_static']}" if vs is not None else "–")
                     + f", {fmt(s['oracle_gain_captured'], pct=True)} of the oracle's gain")
    return lines


def stopper_table(stoppers: list[dict]) -> str:
    lines = ["| stopper | model | ROC-AUC | PR-AUC | replayed vs best static | oracle's gain "
             "captured | replay vs end to end, worst error |", "|---|---|---|---|---|---|---|"]
    for s in stoppers:
        vs = s["replay_vs_best_static"]
        vs = f"{vs:.3f}x ({s['best_static']}, {s['replay_units']})" if vs is not None else "–"
        check = (f"{s['check_max_error']:.1%} on {s['check_prompts']} prompts"
                 if s["check_max_error"] is not None else "not checked")
        lines.append(f"| {short_name(s['method'])} | {s['model']} | {fmt(s['roc_auc'])} | "
                     f"{fmt(s['pr_auc'])} | {vs} | {fmt(s['oracle_gain_captured'], pct=True)} "
                     f"| {check} |")
    return "\n".join(lines + ["", "AUCs on the collection's test prompts; replayed figures "
                               "there too; the check decodes some of those prompts end to end "
                               "(after dividing out a common factor)."])
