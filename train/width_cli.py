"""`mcsd train --decision width`: train a learned width (`width:PATH`) on the target's greedy
outputs of training prompts, and report its replayed speed by category, on the training prompts
and on held-out ones, against every static width and the hindsight-best width at every step.
The first depth of --k-config (default 4) is the widest width. Decode it with `mcsd eval
--methods width:PATH` (the first depth alone) or after prompt lookup (`lookup:8:3+width:PATH`,
`lookup-learned:COPY+width:PATH`), on a --k-config whose first depth drafts the k it was trained
for. (`mcsd train-width` before; `train.cli` parses the options.)
"""

from __future__ import annotations

import argparse
import shutil

from mcsd_runtime.errors import MCSDError


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.cli.args import apply_threads, pair_from_args
    from mcsd_runtime.costmodel.profile import CostProfile
    from mcsd_runtime.extras import require_toolkit
    from mcsd_runtime.tree import parse_k_config
    from train import width as W
    from train.copy_cli import TraceCache, load_prompt_domains

    require_toolkit("mcsd train --decision width", "sklearn")
    k = parse_k_config(args.k_config)[0]
    if min(args.limit, args.eval_limit, args.max_new_tokens) < 1 or k < 2:
        raise MCSDError("--limit, --eval-limit and --max-new-tokens must be positive, and the "
                        "first depth of --k-config at least 2 (one candidate leaves nothing to "
                        "choose)")
    if args.out.exists() and any(args.out.iterdir()) and not args.force:
        raise MCSDError(f"--out {args.out} exists and is not empty; pass --force to replace it")
    profile = CostProfile.load(args.cost_profile)
    if profile.tokens[-1] < k + 1:
        raise MCSDError(f"--cost-profile {args.cost_profile} times forwards of up to "
                        f"{profile.tokens[-1]} tokens; verifying {k} candidates takes {k + 1}: "
                        f"measure with `mcsd profile --max-tokens {k + 1}`")
    if note := profile.temperature_note(0.0):
        print(note, flush=True)
    if not any(" width " in name for name in profile.static.get("tokens_per_s", {})):
        print(f"note: --cost-profile {args.cost_profile} timed forwards of 2..{k} tokens in "
              f"isolation, not in the decoder, and the widths trade exactly those: measure it "
              f"with `mcsd profile --widths`", flush=True)
    train_domains, eval_domains = load_prompt_domains(args)
    apply_threads(args)
    pair = pair_from_args(args)
    cache = TraceCache(args.traces, args.target, args.max_new_tokens, args.eos == "stop")
    ranked = {}
    for name, (_, prompts) in (train_domains | eval_domains).items():
        traces = cache.get(pair, prompts, args.chat, name)
        ranked[name] = W.draft_ranks(pair, traces, k, desc=f"draft candidates: {name}")
    train = [o for name in train_domains for o in ranked[name]]
    print(f"training on {len(train)} outputs ({sum(len(o.rank) for o in train)} tokens)",
          flush=True)
    policy, facts = W.fit(train, profile, k)
    report = replay_report(policy, W.WidthReplay(profile, k), ranked, set(train_domains))
    policy.trained = {"training": facts, "prompts": args.prompts, "target": args.target,
                      "draft": str(pair.draft_name), "profile": str(args.cost_profile),
                      "max_new_tokens": args.max_new_tokens, "report": report}
    if args.out.exists():
        shutil.rmtree(args.out)
    policy.save(args.out)
    print_report(report, policy)
    print(f"-> {args.out} (decode with `mcsd eval --methods width:{args.out} --k-config "
          f"{args.k_config}`, or after prompt lookup: `lookup:8:3+width:{args.out}`)", flush=True)
    return 0


def replay_report(policy, replay, ranked: dict[str, list], trained: set[str]) -> list[dict]:
    """Per category: the policy, each static width and the hindsight-best width, replayed and
    paired per output against the widest static width (`metrics.paired_speedup`)."""
    from mcsd_runtime.metrics import paired_speedup
    from train.width import learned, oracle, static

    report = []
    for name, outs in ranked.items():
        base = [replay.speed(o, static(policy.k)) for o in outs]
        rules = {f"width {w}": static(w) for w in range(1, policy.k)} | {
            "learned": learned(policy), "oracle": oracle}
        row = {"domain": name, "trained": name in trained, "outputs": len(outs)}
        for label, rule in rules.items():
            walks = [replay.walk(o, rule) for o in outs]
            row[label] = paired_speedup([tokens / sec for tokens, sec, _ in walks], base)
            if label == "learned":
                widths = [w for _, _, taken in walks for w in taken if w]
                row["mean_width"] = sum(widths) / max(len(widths), 1)
        report.append(row)
    return report


def print_report(report: list[dict], policy) -> None:
    k = policy.k
    print(f"replayed speed against width {k} (tuned rate {policy.rate:.1f} tokens/s), paired "
          f"per output, 95% CI:")
    cols = [f"width {w}" for w in range(1, k)] + ["learned", "oracle"]
    print(f"{'category':30} {'n':>3} " + " ".join(f"{c:>22}" for c in cols) + "  mean width")
    for r in sorted(report, key=lambda r: r["learned"]["geomean"]):
        label = r["domain"] + (" (trained)" if r["trained"] else "")
        cells = [f"{r[c]['geomean']:.3f} [{r[c]['ci_low']:.3f}, {r[c]['ci_high']:.3f}]"
                 for c in cols]
        print(f"{label:30} {r['outputs']:>3} " + " ".join(f"{c:>22}" for c in cells)
              + f"  {r['mean_width']:.2f}")
