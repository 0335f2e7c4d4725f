"""The statistics every report number comes from, derived from the per-prompt records: speedups
paired per prompt (or per batch) with a reference method (median ratio; geometric mean with a
95% bootstrap CI, `mcsd_runtime.metrics.paired_speedup`), the run's best static schedule, and
`summarize`, one row per method."""

from __future__ import annotations

import statistics

import torch

from mcsd_runtime import metrics
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate import quality
from mcsd_runtime.evaluate.divergence import agreement
from mcsd_runtime.evaluate.methods import decoder_twin, is_static
from mcsd_runtime.evaluate.record import Record


def _quantile(xs: list[float], q: float) -> float:
    return float(torch.tensor(xs, dtype=torch.float64).quantile(q)) if xs else float("nan")


def group_by_method(records: list[Record]) -> dict[str, list[Record]]:
    """The records of each method, methods in the order they first appear."""
    out: dict[str, list[Record]] = {}
    for r in records:
        out.setdefault(r.method, []).append(r)
    return out


def tps_by_unit(records: list[Record]) -> dict[str, float]:
    """Throughput per pairing unit: per batch (its records share one), or per prompt, over all
    its samples (their tokens over their seconds)."""
    out, tokens, seconds = {}, {}, {}
    for r in records:
        if r.batch_tokens_per_s is not None:
            out[r.unit] = r.batch_tokens_per_s
        else:
            tokens[r.unit] = tokens.get(r.unit, 0) + r.new_tokens
            seconds[r.unit] = seconds.get(r.unit, 0.0) + r.wall_time
    return out | {u: metrics.throughput(tokens[u], seconds[u]) for u in tokens}


def paired(recs: list[Record], ref: list[Record], greedy: bool) -> dict:
    """Against a reference method's records on the same prompts: the median per-unit speedup,
    and for greedy runs the share of equal outputs and the mean token agreement."""
    by_prompt = {r.prompt_id: r for r in ref}
    pairs = [(r, by_prompt[r.prompt_id]) for r in recs if r.prompt_id in by_prompt]
    if not pairs:
        return {"speedup": None, "equal_share": None, "agreement": None}
    mine, theirs = tps_by_unit(recs), tps_by_unit(ref)
    return {"speedup": statistics.median(mine[u] / theirs[u] for u in mine if u in theirs),
            "equal_share": (sum(r.token_ids == a.token_ids for r, a in pairs) / len(pairs)
                            if greedy else None),
            "agreement": (statistics.mean(agreement(r.token_ids, a.token_ids) for r, a in pairs)
                          if greedy else None)}


def paired_geomean(recs: list[Record], ref: list[Record]) -> dict:
    """Geometric mean of paired per-prompt speedups over `ref` with its 95% bootstrap CI."""
    mine, theirs = tps_by_unit(recs), tps_by_unit(ref)
    common = [p for p in mine if p in theirs]
    if not common:
        return {"geomean": None, "ci_low": None, "ci_high": None, "n": 0}
    return metrics.paired_speedup([mine[p] for p in common], [theirs[p] for p in common])


def best_static(records: list[Record]) -> str | None:
    """The static schedule of the run with the highest geometric-mean speedup over `ar` (over
    the slowest static one when `ar` did not run)."""
    by_method = group_by_method(records)
    statics = [m for m in by_method if is_static(m)]
    if not statics:
        return None
    base = by_method.get("ar") or min((by_method[m] for m in statics),
                                      key=lambda rs: statistics.median(
                                          tps_by_unit(rs).values()))
    return max(statics, key=lambda m: paired_geomean(by_method[m], base)["geomean"] or 0.0)


def summarize(records: list[Record], greedy: bool, reference: str | None = None) -> list[dict]:
    """One row per method: the report's numbers, all derived from the per-prompt records.
    Speedups and output equality are paired per prompt against `ar` (our decoder's AR) and
    `hf` (the target's own generate()) when they ran; `hf-generate:S` is also paired with S.
    Every method also gets the geometric mean of its paired per-prompt speedups, with a 95%
    bootstrap CI, over `ar` and over `reference` (default: the run's best static schedule)."""
    by_method = group_by_method(records)
    reference = reference or best_static(records)
    if reference is not None and reference not in by_method:
        raise MCSDError(f"reference method {reference!r} did not run: add it to --methods")
    rows = []
    for method, recs in by_method.items():
        tps = list(tps_by_unit(recs).values())
        geo_ar = paired_geomean(recs, by_method.get("ar", []))
        geo_ref = paired_geomean(recs, by_method.get(reference, []))
        tokens = sum(r.new_tokens for r in recs)
        calls = sum(r.target_calls for r in recs)
        rates = [r.acceptance_rate for r in recs if r.acceptance_rate is not None]
        drafted = [r.drafted_tokens for r in recs]
        vs = {ref: paired(recs, by_method.get(ref, []), greedy) for ref in ("ar", "hf")}
        diffs = [r.hf_divergence for r in recs if r.hf_divergence]
        twin = decoder_twin(method, list(by_method))
        rows.append({
            "method": method,
            "prompts": len({r.prompt_id for r in recs}),
            "tokens_per_s_median": statistics.median(tps),
            "tokens_per_s_p25": _quantile(tps, 0.25),
            "tokens_per_s_p75": _quantile(tps, 0.75),
            "speedup_vs_ar": vs["ar"]["speedup"],
            "geomean_vs_ar": geo_ar["geomean"],
            "ci_vs_ar": [geo_ar["ci_low"], geo_ar["ci_high"]],
            "reference": reference,
            "geomean_vs_reference": geo_ref["geomean"],
            "ci_vs_reference": [geo_ref["ci_low"], geo_ref["ci_high"]],
            "speedup_vs_hf": vs["hf"]["speedup"],
            "tau": metrics.tau(tokens, calls) if calls else None,
            "acceptance_rate": statistics.mean(rates) if rates else None,
            "drafted_per_token": (sum(drafted) / tokens if tokens and None not in drafted
                                  else None),
            "target_calls": calls,
            "new_tokens": tokens,
            "lossless": all(r.lossless for r in recs),
            "ar_equal_share": vs["ar"]["equal_share"],
            "ar_agreement": vs["ar"]["agreement"],
            "hf_equal_share": vs["hf"]["equal_share"],
            "hf_agreement": vs["hf"]["agreement"],
            "hf_differences": len(diffs) if greedy and "hf" in by_method else None,
            "hf_min_margin": min((d["top2_margin"] for d in diffs), default=None),
            "decoder_twin": twin,
            "speedup_vs_twin": (paired(recs, by_method[twin], greedy)["speedup"] if twin
                                else None),
        } | quality.summary(recs, by_method.get("ar")))
    return rows
