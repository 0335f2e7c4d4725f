"""`mcsd eval --drafts D1,D2,...`: the same methods with several drafts of one target, in one
interleaved run per prompt set, so every method with every draft is paired with the same `ar`.

Methods that use no draft (`ar`, `hf`, `hf-static`) run once; every other runs once per draft,
labelled `METHOD@DRAFT` (`mcsd:4,2,2,1@toy-draft:l2`). Beside each prompt set's usual report
this writes `drafts.md` / `drafts.json`: per domain, draft and method, τ, the paired speedup over
`ar` and, for `mcsd-target-init`, over lossless `mcsd` with the same draft, and the quality
columns (target NLL per token against `ar`'s, agreement with `ar`, repeated 4-grams), with each
draft's card (held-out loss, agreement with the target, cost ratio) where it has one. This is the
paper's comparison of target-initialized and lossless MCSD across draft models.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate import quality
from mcsd_runtime.models.pair import Pair

DRAFT_FREE = ("ar", "hf", "hf-static")  # by kind: `hf-static:eager` too


@dataclass(frozen=True)
class DraftsRun:
    """What `run_drafts` decodes, as `mcsd eval --drafts` gives it: the target and its drafts
    (`split_drafts`), the prompt sets (`prompts.sets.load_domains`: a `limit` sample of each by
    `seed`, `by_category`), the output folder (None: a new one under `runs_dir()`), how the
    pairs load (`device`, `dtype`, `attention`, as `models.pair.load_pair`), how prompts are
    formatted (`chat`, `allow_format_mismatch`) and the method every other is compared with
    (`reference`, named without a draft: the first draft's)."""

    target: str
    drafts: tuple[str, ...]
    prompts: str
    out: Path | None = None
    limit: int | None = None
    seed: int = 0
    by_category: bool | None = None
    device: str = "auto"
    dtype: str = "auto"
    attention: str = "mcsd_sdpa"
    chat: str = "auto"
    allow_format_mismatch: bool = False
    reference: str | None = None


def draft_free(method: str) -> bool:
    return method.partition(":")[0] in DRAFT_FREE


def split_drafts(spec: str) -> list[str]:
    """`toy,toy-draft:l2` -> ["toy", "toy-draft:l2"], refusing an empty list or a repeat."""
    drafts = [d.strip() for d in spec.split(",") if d.strip()]
    if not drafts:
        raise MCSDError("--drafts names no draft: e.g. --drafts toy,toy-draft:l2,toy-draft:l4")
    if len(set(drafts)) != len(drafts):
        raise MCSDError(f"--drafts names a draft twice: {spec!r}")
    return drafts


def labelled(methods: list[str], drafts: list[str]) -> list[tuple[str, str, str]]:
    """(label, method, draft) of every run: draft-free methods once (with the first draft's
    pair, whose target they use), every other once per draft."""
    out = []
    for m in methods:
        if draft_free(m):
            out.append((m, m, drafts[0]))
        else:
            out += [(f"{m}@{d}", m, d) for d in drafts]
    return out


def load_pairs(target: str, drafts: list[str], device: str = "auto", dtype: str = "auto",
               attention: str = "mcsd_sdpa") -> dict[str, Pair]:
    """One pair per draft, all sharing the first one's target model (loaded once in effect)."""
    from mcsd_runtime.backend.device import command_dtype, pick_device
    from mcsd_runtime.models.pair import load_pair, pair_names

    pick_device(device)
    # every name checked first; built on first use, as every command does (cli.args.pair_paths)
    names = {d: pair_names(target, d, build=True) for d in drafts}
    pairs: dict[str, Pair] = {}
    for d, (target_dir, draft_dir) in names.items():
        pair = load_pair(target_dir, draft_dir, device=device,
                         dtype=command_dtype(dtype, device), attn_implementation=attention)
        if pairs:
            first = next(iter(pairs.values()))
            pair = Pair(first.target, pair.draft, first.tokenizer, target_name=target_dir,
                        draft_name=draft_dir)
        pairs[d] = pair
    return pairs


def run_once(pairs: dict[str, Pair], prompts, methods: list[str], base, chat: str = "auto"
             ) -> list:
    """Every (method, draft) on every prompt, interleaved after a warm-up; then quality."""
    from mcsd_runtime.evaluate.loop import run_runners
    from mcsd_runtime.evaluate.runners import build_method, encode_prompt

    if not prompts:
        raise MCSDError("the prompt set is empty: pass a set or file with at least one prompt")
    first = next(iter(pairs.values()))
    runners = {label: build_method(m, pairs[d], base)
               for label, m, d in labelled(methods, list(pairs))}
    encoded = [(p.id, encode_prompt(first, p, chat)) for p in prompts]
    records = run_runners(first, runners, encoded, greedy=base.temperature == 0)
    quality.annotate(first.target, records, dict(encoded))  # after the timed runs
    return records


def draft_card(draft_dir: str | Path) -> dict | None:
    """Facts about a toy draft from its card (the pair's card for a pair's own draft, the
    draft's card for `toy-draft:NAME`): layers, parameters, held-out NLL (its target's beside
    it), greedy agreement with the target and the target/draft cost ratio (1-thread decode
    step, measured when it was built). None for other models."""
    path = Path(draft_dir).parent / "card.json"
    try:
        card = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(card, dict):
        return None
    if card.get("format") == "mcsd-toy-pair":
        layers = card["recipe"]["draft"]["layers"]
        target_nll = card["target"]["heldout_nll"]
    elif card.get("format") == "mcsd-toy-draft":
        layers = card["recipe"]["shape"]["layers"]
        target_nll = card["target"]["heldout_nll"]
    else:
        return None
    return {"layers": layers, "params": card["draft"]["params"],
            "heldout_nll": card["draft"]["heldout_nll"], "target_heldout_nll": target_nll,
            "agreement": card["agreement"], "cost_ratio": card["latency_ratio_1thread"]}


def draft_rows(by_domain: dict[str, list], runs: list[tuple[str, str, str]],
               greedy: bool) -> list[dict]:
    """One row per (domain, label): method, draft, τ, speedup over ar (and over lossless mcsd
    with the same draft, for mcsd-target-init), agreement and equality with ar (greedy), and
    the quality columns."""
    from mcsd_runtime.evaluate.stats import group_by_method, paired, paired_geomean
    from mcsd_runtime.metrics import tau

    rows = []
    for domain, records in by_domain.items():
        by = group_by_method(records)
        for label, method, draft in runs:
            recs = by.get(label, [])
            if not recs:
                continue
            vs_ar = paired_geomean(recs, by.get("ar", []))
            twin = (f"mcsd:{method.split(':', 1)[1]}@{draft}"
                    if method.startswith("mcsd-target-init:") else None)
            vs_twin = paired_geomean(recs, by[twin]) if twin in by else {}
            with_ar = paired(recs, by.get("ar", []), greedy)
            calls = sum(r.target_calls for r in recs)
            rows.append({
                "domain": domain, "label": label, "method": method,
                "draft": None if draft_free(method) else draft, "prompts": len(recs),
                "tau": tau(sum(r.new_tokens for r in recs), calls) if calls else None,
                "vs_ar": vs_ar["geomean"], "ci_vs_ar": [vs_ar["ci_low"], vs_ar["ci_high"]],
                "lossless_twin": twin if twin in by else None,
                "vs_lossless": vs_twin.get("geomean"),
                "ci_vs_lossless": [vs_twin.get("ci_low"), vs_twin.get("ci_high")],
                "ar_equal_share": with_ar["equal_share"], "ar_agreement": with_ar["agreement"],
            } | quality.summary(recs, by.get("ar")))
    return rows


def markdown(rows: list[dict], cards: dict[str, dict | None]) -> str:
    """The drafts' cards, then the table of every (domain, method, draft)."""
    from mcsd_runtime.evaluate.cells import fmt, fmt_ci, fmt_delta, fmt_nll

    lines = ["| draft | layers | params | held-out NLL (target's) | agreement with target | "
             "cost ratio (target/draft) |", "|---|---|---|---|---|---|"]
    for d, c in cards.items():
        if c is None:
            lines.append(f"| {d} | – | – | – | – | – |")
            continue
        lines.append(f"| {d} | {c['layers']} | {c['params'] / 1e6:.2f} M | "
                     f"{c['heldout_nll']:.3f} ({c['target_heldout_nll']:.3f}) | "
                     f"{c['agreement']:.1%} | {c['cost_ratio']:.1f}x |")
    lines += ["", "| domain | method | draft | τ | vs AR [95% CI] | vs lossless, same draft | "
              "NLL/token | NLL vs AR [95% CI] | target top-1 | AR agreement | = AR | "
              "repeated 4-grams |", "|---" * 12 + "|"]
    for r in rows:
        lines.append(
            f"| {r['domain']} | {r['method']} | {r['draft'] or '–'} | {fmt(r['tau'])} | "
            f"{fmt_ci(r['vs_ar'], r['ci_vs_ar'])} | "
            f"{fmt_ci(r['vs_lossless'], r['ci_vs_lossless'])} | "
            f"{fmt_nll(r['target_nll'])} | "
            f"{fmt_delta(r['target_nll_vs_ar'], r['ci_target_nll_vs_ar'])} | "
            f"{fmt(r['target_top1_share'], pct=True)} | {fmt(r['ar_agreement'], pct=True)} | "
            f"{fmt(r['ar_equal_share'], pct=True)} | "
            f"{fmt(r['repeat4_share'], pct=True)} |")
    lines += ["", "τ: committed tokens per target call. Speedups: geometric means of paired "
              "per-prompt tokens/s ratios (one interleaved run per domain), 95% bootstrap CI. "
              "NLL/token: the target's NLL (nats) of the outputs per new token; NLL vs AR: mean "
              "per-prompt difference from ar's (positive: text the target finds less likely). "
              "Target top-1: share of new tokens that are the target's most likely token after "
              "the text before them (100% for greedy lossless decoding). "
              "AR agreement: mean share of positions with ar's token; = AR: share of outputs "
              "equal to ar's (greedy). Repeated 4-grams: mean share of an output's 4-grams seen "
              "earlier in it. Cards: held-out NLL and greedy agreement on the toy corpus's "
              "held-out files; cost ratio of one-token decode steps on one thread, measured at "
              "build time."]
    return "\n".join(lines) + "\n"


def run_drafts(run: DraftsRun, methods: list[str], base,
               settings_of: Callable[..., dict], why: str = "--k-config") -> int:
    """`mcsd eval --drafts`: one interleaved run per prompt set with every draft, each set's
    report in its own subfolder (or in `run.out` for one set), then drafts.md / drafts.json.
    `settings_of(pair, prompts=, n_prompts=[, prompt_format=])` gives a run's settings (eval's).
    A categorized prompt set gives one domain per category, as in eval."""
    from mcsd_runtime.evaluate.eval_report import check_writable, short_table, write_outputs
    from mcsd_runtime.evaluate.methods import check_prompt_formats
    from mcsd_runtime.evaluate.stats import summarize
    from mcsd_runtime.paths import runs_dir
    from mcsd_runtime.prompts.sets import load_domains

    drafts = list(run.drafts)
    print(f"k-config {base.k_config} ({why})", flush=True)
    sets = load_domains(run.prompts, limit=run.limit or None, seed=run.seed,
                        by_category=run.by_category)
    out = run.out or runs_dir() / time.strftime("eval-drafts-%Y%m%d-%H%M%S")
    check_writable(out)
    pairs = load_pairs(run.target, drafts, run.device, run.dtype, run.attention)
    first = next(iter(pairs.values()))
    formats = check_prompt_formats(methods, {n: p for n, (_, p) in sets.items()},
                                   first.tokenizer, run.chat, run.allow_format_mismatch)
    runs = labelled(methods, drafts)
    greedy = base.temperature == 0
    by_domain = {}
    for name, (spec, prompts) in sets.items():
        folder = out / name if len(sets) > 1 else out
        print(f"{name}: {len(prompts)} prompts x {len(runs)} methods "
              f"({len(drafts)} drafts)", flush=True)
        records = run_once(pairs, prompts, methods, base, chat=run.chat)
        rows = summarize(records, greedy=greedy, reference=run.reference and
                         _reference_label(run.reference, drafts))
        settings = settings_of(first, prompts=spec, n_prompts=len(prompts),
                               prompt_format=formats[name])
        write_outputs(records, rows, folder, settings | {"drafts": drafts},
                      tokenizer=first.tokenizer)
        print(short_table(rows), flush=True)
        by_domain[name] = records
    cards = {d: draft_card(p.draft_name) for d, p in pairs.items()}
    rows = draft_rows(by_domain, runs, greedy)
    text = markdown(rows, cards)
    settings = settings_of(first, prompts=run.prompts,
                           n_prompts=sum(len(p) for _, p in sets.values())) | {"drafts": drafts}
    (out / "drafts.json").write_text(json.dumps({"settings": settings, "cards": cards,
                                                 "rows": rows}, indent=1) + "\n")
    (out / "drafts.md").write_text(
        "# Methods across drafts\n\nSettings: "
        + ", ".join(f"{k}={v}" for k, v in settings.items()) + "\n\n" + text)
    print(f"\n{text}\nwrote {out}/drafts.md")
    return 0


def _reference_label(reference: str, drafts: list[str]) -> str:
    """`--reference` with --drafts: a draft-free method as is, another with the first draft."""
    return reference if draft_free(reference) else f"{reference}@{drafts[0]}"
