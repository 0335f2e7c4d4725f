"""`mcsd train-width`: train a learned width (`width:PATH`) on the target's greedy outputs of
training prompts, and report its replayed speed by category, on the training prompts and on
held-out ones, against every static width and the hindsight-best width at every step.
Decode it with `mcsd eval --methods width:PATH` (the first depth alone) or after prompt lookup
(`lookup:8:3+width:PATH`, `lookup-learned:COPY+width:PATH`), on a --k-config whose first depth
drafts the k it was trained for.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from mcsd_runtime.errors import MCSDError


def register(sub: argparse._SubParsersAction) -> None:
    from mcsd_runtime.cli.args import add_pair_args, add_threads_arg
    from mcsd_runtime.prompts.chat import add_chat_arg
    from mcsd_runtime.stop import width as W
    from train import width
    from train.copy_cli import add_prompt_args

    p = sub.add_parser(
        "train-width", help="train a learned width of the draft's first depth (width:PATH)",
        description=f"{__doc__}\n{W.__doc__}\n{width.__doc__}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_prompt_args(p)
    p.add_argument("--profile", type=Path, required=True,
                   help="cost profile of this pair on this machine (`mcsd profile`): the step "
                        "costs the widths trade against; it must time forwards of up to k + 1 "
                        "tokens")
    p.add_argument("--k", type=int, default=4,
                   help="candidates the first depth drafts, the widest width (default "
                        "%(default)s: decode on a --k-config starting with it)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="output tokens per prompt (default %(default)s)")
    p.add_argument("--traces", type=Path, default=None,
                   help="JSON cache of the target's greedy outputs (the one `mcsd train-lookup "
                        "--traces` keeps): reused where it holds a prompt, extended where not")
    p.add_argument("--out", type=Path, required=True, help="folder to write the policy to")
    p.add_argument("--force", action="store_true", help="replace an existing --out folder")
    add_chat_arg(p)
    add_threads_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.cli.args import apply_threads, pair_from_args
    from mcsd_runtime.costmodel.profile import CostProfile
    from mcsd_runtime.extras import require_toolkit
    from train import width as W
    from train.copy_cli import TraceCache, load_prompt_domains

    require_toolkit("mcsd train-width", "sklearn")
    if min(args.limit, args.eval_limit, args.max_new_tokens) < 1 or args.k < 2:
        raise MCSDError("--limit, --eval-limit and --max-new-tokens must be positive, and --k "
                        "at least 2 (one candidate leaves nothing to choose)")
    if args.out.exists() and any(args.out.iterdir()) and not args.force:
        raise MCSDError(f"--out {args.out} exists and is not empty; pass --force to replace it")
    profile = CostProfile.load(args.profile)
    if profile.tokens[-1] < args.k + 1:
        raise MCSDError(f"--profile {args.profile} times forwards of up to {profile.tokens[-1]} "
                        f"tokens; verifying {args.k} candidates takes {args.k + 1}: measure with "
                        f"`mcsd profile --max-tokens {args.k + 1}`")
    if note := profile.temperature_note(0.0):
        print(note, flush=True)
    if not any(" width " in name for name in profile.static.get("tokens_per_s", {})):
        print(f"note: --profile {args.profile} timed forwards of 2..{args.k} tokens in isolation, "
              f"not in the decoder, and the widths trade exactly those: measure it with `mcsd "
              f"profile --widths`", flush=True)
    train_domains, eval_domains = load_prompt_domains(args)
    apply_threads(args)
    pair = pair_from_args(args)
    cache = TraceCache(args.traces, args.target, args.max_new_tokens, False)
    ranked = {}
    for name, (_, prompts) in (train_domains | eval_domains).items():
        traces = cache.get(pair, prompts, args.chat, name)
        ranked[name] = W.draft_ranks(pair, traces, args.k, desc=f"draft candidates: {name}")
    train = [o for name in train_domains for o in ranked[name]]
    print(f"training on {len(train)} outputs ({sum(len(o.rank) for o in train)} tokens)",
          flush=True)
    policy, facts = W.fit(train, profile, args.k)
    report = replay_report(policy, W.WidthReplay(profile, args.k), ranked, set(train_domains))
    policy.trained = {"training": facts, "prompts": args.prompts, "target": args.target,
                      "draft": str(pair.draft_name), "profile": str(args.profile),
                      "max_new_tokens": args.max_new_tokens, "report": report}
    if args.out.exists():
        shutil.rmtree(args.out)
    policy.save(args.out)
    print_report(report, policy)
    print(f"-> {args.out} (decode with `mcsd eval --methods width:{args.out} --k-config "
          f"{args.k}`, or after prompt lookup: `lookup:8:3+width:{args.out}`)", flush=True)
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
