"""Evaluation across batch sizes (`mcsd eval --batch-size 1,4,8,16`): the same methods on the
same prompts, one interleaved run per batch size, side by side.

At every batch size each method is compared, by the geometric mean of speedups paired per batch
of prompts with a 95% bootstrap CI, with `ar` at that batch size, with that batch size's best
static schedule (it shrinks as B grows: verifying more tokens per row costs more in a bigger
batch) and with the tuned heuristic. Throughput is committed tokens of all rows per decode
second (prefills excluded) at every batch size, batch size 1 included, so `vs B=1` (a method's
throughput over its own at batch size 1, unpaired: the units differ) shows what batching buys.
"""

from __future__ import annotations

import json
from pathlib import Path

from mcsd_runtime.evaluate.record import Record
from mcsd_runtime.evaluate.stats import best_static, group_by_method, paired_geomean, tps_by_unit


def throughput(records: list[Record]) -> float:
    """Committed tokens of all records over the decode seconds of their batches."""
    seconds: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for r in records:
        tokens[r.unit] = tokens.get(r.unit, 0) + r.new_tokens
    for unit, tps in tps_by_unit(records).items():
        seconds[unit] = tokens[unit] / tps if tps else 0.0
    total = sum(seconds.values())
    return sum(tokens.values()) / total if total else 0.0


def batch_rows(by_batch: dict[int, list[Record]], heuristic: str | None,
               greedy: bool = True) -> list[dict]:
    """One row per (method, batch size): throughput, and paired speedups over ar, the batch
    size's best static and the heuristic."""
    first = min(by_batch)
    base = {m: throughput(rs) for m, rs in group_by_method(by_batch[first]).items()}
    rows = []
    for b, records in sorted(by_batch.items()):
        by_method = group_by_method(records)
        best = best_static(records)
        for method, recs in by_method.items():
            row = {"method": method, "batch_size": b, "best_static": best,
                   "tokens_per_s": throughput(recs), "prompts": len(recs),
                   "ar_equal_share": _equal(recs, by_method.get("ar", [])) if greedy else None}
            row["vs_b1"] = row["tokens_per_s"] / base[method] if base.get(method) else None
            for key, ref in (("ar", "ar"), ("best_static", best), ("heuristic", heuristic)):
                geo = paired_geomean(recs, by_method.get(ref, [])) if ref else {"geomean": None}
                row[f"vs_{key}"] = geo.get("geomean")
                row[f"ci_vs_{key}"] = [geo.get("ci_low"), geo.get("ci_high")]
            rows.append(row)
    return rows


def _equal(recs: list[Record], ref: list[Record]) -> float | None:
    by_prompt = {r.prompt_id: r.token_ids for r in ref}
    pairs = [(r.token_ids, by_prompt[r.prompt_id]) for r in recs if r.prompt_id in by_prompt]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else None


def _cell(v: float | None, ci: list | None = None) -> str:
    if v is None:
        return "–"
    if ci and None not in ci:
        return f"{v:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}]"
    return f"{v:.3f}x"


def markdown(rows: list[dict], heuristic: str | None) -> str:
    sizes = sorted({r["batch_size"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    at = {(r["method"], r["batch_size"]): r for r in rows}
    best = {b: next(r["best_static"] for r in rows if r["batch_size"] == b) for b in sizes}
    head = "| method | " + " | ".join(f"B={b}" for b in sizes) + " |"
    sep = "| --- " * (len(sizes) + 1) + "|"
    out = ["## Throughput (tok/s of the whole batch, decode phase) and vs its own B=1", "",
           head, sep]
    for m in methods:
        cells = [f"{at[m, b]['tokens_per_s']:.1f} ({_cell(at[m, b]['vs_b1'])})"
                 if (m, b) in at else "–" for b in sizes]
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    for key, title in (("best_static", "the batch size's best static"),
                       ("heuristic", f"the heuristic ({heuristic})"), ("ar", "AR")):
        if key == "heuristic" and heuristic is None:
            continue
        out += ["", f"## vs {title}: geometric mean of per-batch speedups [95% CI]", "",
                head, sep]
        for m in methods:
            cells = [_cell(at[m, b][f"vs_{key}"], at[m, b][f"ci_vs_{key}"])
                     if (m, b) in at else "–" for b in sizes]
            out.append(f"| {m} | " + " | ".join(cells) + " |")
    out += ["", "Best static at each batch size: "
            + ", ".join(f"B={b}: {best[b]}" for b in sizes)]
    lossy = {r["method"] for r in rows if r["ar_equal_share"] not in (None, 1.0)}
    out.append("Every greedy output equals AR's." if not lossy else
               f"Outputs differing from AR's: {', '.join(sorted(lossy))}.")
    return "\n".join(out) + "\n"


def write(rows: list[dict], out: Path, settings: dict, heuristic: str | None) -> str:
    """batches.md and batches.json in `out`; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, heuristic)
    (out / "batches.md").write_text(f"# Evaluation across batch sizes\n\n{text}")
    (out / "batches.json").write_text(json.dumps({"settings": settings, "rows": rows},
                                                 indent=2))
    return text
