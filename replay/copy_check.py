"""Check the copy-length replay against reality: decode held-out prompts end to end with `ar`,
static `lookup:K:N` methods and the learned policy (beside a draft: `static:1`, the statics
composed with it and the policy composed with it; every method in a fresh random order per
prompt, after a warm-up), and compare the decode-phase tokens/s replay predicts with what was
measured (the prefill, which no copy length changes, is left out on both sides).

Under greedy decoding the decoder's output is the trace's, so replay and decoder take the same
steps: their step counts must agree exactly, and the time error is the cost model's alone. When
sampling, the decoder draws other outputs than the traces and only totals compare: a few
outputs' luck (one draw repeats itself more than another) moves those totals by several per
cent. With the profile, the check therefore also prices the steps each decoder took
(`CostProfile.decode_seconds`): the cost model's own error, at any temperature.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

from mcsd_runtime import metrics
from mcsd_runtime.costmodel.profile import CostProfile
from mcsd_runtime.decode.state import DecodeConfig
from mcsd_runtime.progress import progress as progress_bar
from mcsd_runtime.stop.copy_length import CopyLength
from train.copy.fit import BESIDE, Replay, Trace, copy_all, never

LEARNED = "learned"


def _replayed(name: str, trace: Trace, policy: CopyLength, costs: list[float]
              ) -> tuple[float, int]:
    """Replayed decode seconds and steps of one method on one output."""
    if name == "ar":  # the first token comes from the prefill's logits
        return (len(trace.tokens) - 1) * costs[0], len(trace.tokens)
    beside = {"draft_costs": policy.draft_costs, "prior": policy.draft_prior}
    if name == LEARNED:
        r = Replay(trace, policy.max_copy, policy.min_ngram, policy.max_ngram)
        return r.walk(policy.choose, costs, None, **beside), r.steps
    if name == BESIDE:
        r = Replay(trace, 1, 4, 4)
        return r.walk(never, costs, None, **beside), r.steps
    k, n = (int(v) for v in name.partition("+")[0].split(":")[1:])
    r = Replay(trace, k, n, 4)
    if "+" not in name:
        beside["draft_costs"] = None
    return r.walk(copy_all(k), costs[: k + 1], None, **beside), r.steps


def end_to_end_check(pair, policy: CopyLength, traces: dict[str, list[Trace]],
                     statics: Sequence[str], limit: int = 4, seed: int = 0,
                     progress: bool = False, tree: tuple[int, ...] | None = None,
                     profile: CostProfile | None = None) -> dict:
    """Replayed against measured decode tokens/s of `ar`, each static (`lookup:K:N`, or
    `lookup:K:N+static:1`) and the policy on the first `limit` outputs of every category in
    `traces` (decoded to the outputs' length, at the policy's temperature, EOS ignored); with
    `tree` (a policy trained beside a draft), `static:1` and the composed policy on it. With
    `profile` (the one the policy's costs come from), also the decoders' own steps priced by it
    against their measured time (`priced`, `cost_error`)."""
    from mcsd_runtime.evaluate.runners import build_method, learned_lookup_decoder
    from mcsd_runtime.tree import Tree

    chosen = [(cat, t) for cat, outs in traces.items() for t in outs[:limit]]
    n_tokens = len(chosen[0][1].tokens)
    base = DecodeConfig(max_new_tokens=n_tokens, temperature=policy.temperature, eos_token_ids=(),
                        seed=seed, **({} if tree is None else {"k_config": tree}))
    names = ("ar", *statics, *((BESIDE,) if tree is not None else ()))
    decoders = {name: build_method(name, pair, base).decoder for name in names}
    decoders[LEARNED] = learned_lookup_decoder(pair, base, policy,
                                               BESIDE if tree is not None else None)
    for dec in decoders.values():  # warm-up
        dec.generate(chosen[0][1].prompt)
    order = random.Random(seed)
    measured = {name: {"tokens": 0, "seconds": 0.0, "steps": 0, "priced": 0.0}
                for name in decoders}
    shape = Tree(base.k_config)
    per_cat: dict[str, dict[str, list[float]]] = {}
    for cat, trace in progress_bar(chosen, desc="end-to-end check", unit="prompt",
                                   disable=not progress):
        names = list(decoders)
        order.shuffle(names)
        for name in names:
            out = decoders[name].generate(trace.prompt)
            m = measured[name]
            m["tokens"] += out.stats.new_tokens
            m["seconds"] += out.stats.decode_time
            m["steps"] += len(out.steps)
            if profile is not None:
                m["priced"] += profile.decode_seconds(shape, out.steps, from_prefill=name == "ar")
            tps = metrics.throughput(out.stats.new_tokens, out.stats.decode_time)
            per_cat.setdefault(cat, {}).setdefault(name, []).append(tps)
    rows = {}
    for name, m in measured.items():
        seconds = steps = 0
        for _, trace in chosen:
            s, k = _replayed(name, trace, policy, policy.costs)
            seconds, steps = seconds + s, steps + k
        tokens = sum(len(t.tokens) for _, t in chosen)
        replayed, real = metrics.throughput(tokens, seconds), metrics.throughput(
            m["tokens"], m["seconds"])
        rows[name] = {"replayed": replayed, "measured": real, "error": replayed / real - 1,
                      "steps_replayed": steps, "steps_measured": m["steps"]}
        if profile is not None:
            rows[name]["priced"] = metrics.throughput(m["tokens"], m["priced"])
            rows[name]["cost_error"] = rows[name]["priced"] / real - 1
    # a common factor (the machine busier or quieter than when profiled) moves every method
    # alike and leaves decisions unchanged: the error once it is divided out
    common = _divide_common(rows, "error", "relative_error")
    cost_common = _divide_common(rows, "cost_error", "cost_relative_error") if profile else None
    deploy = statics[0]
    categories = {cat: metrics.paired_speedup(by[LEARNED], by[deploy])
                  for cat, by in per_cat.items()}
    return {"prompts": len(chosen), "temperature": policy.temperature, "deploy": deploy,
            "per_method": rows, "common_factor": common, "cost_common_factor": cost_common,
            "max_abs_error": max(abs(r["error"]) for r in rows.values()),
            "max_abs_relative_error": max(abs(r["relative_error"]) for r in rows.values()),
            "learned_vs_deploy_measured": categories, "per_prompt_tokens_per_s": per_cat}


def _divide_common(rows: dict, key: str, out: str) -> float:
    """The geometric mean of `1 + rows[*][key]`, and each row's `out`: its error with that
    common factor divided out."""
    common = math.exp(statistics.mean(math.log(1 + r[key]) for r in rows.values()))
    for r in rows.values():
        r[out] = (1 + r[key]) / common - 1
    return common


def format_check(check: dict) -> str:
    lines = [f"replay vs end to end on {check['prompts']} held-out prompts at temperature "
             f"{check['temperature']:g} (decode tokens/s; steps):"]
    wide = max(12, *map(len, check["per_method"]))
    for name, r in check["per_method"].items():
        lines.append(f"  {name:<{wide}} replayed {r['replayed']:7.2f}  measured "
                     f"{r['measured']:7.2f}"
                     f"  error {r['error']:+6.1%} ({r['relative_error']:+6.1%} without the "
                     f"common factor)  steps {r['steps_replayed']} / {r['steps_measured']}")
    lines.append(f"  common factor replayed/measured {check['common_factor']:.3f}")
    if check.get("cost_common_factor"):
        lines.append("  the cost model alone, on the steps each decoder took (decode tokens/s):")
        for name, r in check["per_method"].items():
            lines.append(f"  {name:<{wide}} priced   {r['priced']:7.2f}  measured "
                         f"{r['measured']:7.2f}  error {r['cost_error']:+6.1%} "
                         f"({r['cost_relative_error']:+6.1%} without the common factor)")
        lines.append(f"  common factor priced/measured {check['cost_common_factor']:.3f}")
    lines.append(f"  measured learned vs {check['deploy']} by category (paired, 95% CI):")
    for cat, v in check["learned_vs_deploy_measured"].items():
        lines.append(f"    {cat:<20} {v['geomean']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]")
    return "\n".join(lines)


def capped(statics: Sequence[str], max_copy: int, beside: str | None = None) -> list[str]:
    """Static `lookup:K:N` names with K capped at the policy's `max_copy` (composed with
    `beside`, when given), duplicates dropped."""
    out: list[str] = []
    for name in statics:
        k, n = (int(v) for v in name.split(":")[1:])
        name = f"lookup:{min(k, max_copy)}:{n}" + (f"+{beside}" if beside else "")
        if name not in out:
            out.append(name)
    return out

