"""`mcsd attention-bench`: the target's verification forward under two attention
implementations, interleaved call by call (`benchmarks.attention_bench`, whose documentation is
the command's description)."""

from __future__ import annotations

import argparse

from mcsd_runtime.cli.args import (
    add_pair_args,
    add_threads_arg,
    add_timing_args,
    apply_threads,
    pair_from_args,
    parse_counts,
)
from mcsd_runtime.errors import MCSDError


def register(sub: argparse._SubParsersAction) -> None:
    from mcsd_runtime.benchmarks import attention_bench

    p = sub.add_parser("attention-bench",
                       help="time a tree verification's forward under two attention "
                            "implementations",
                       description=attention_bench.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_threads_arg(p)
    g = p.add_argument_group("the timed forwards")
    g.add_argument("--compare", default="mcsd_sdpa,sdpa", metavar="A,B",
                   help="two attention implementations (ratios are A / B; default %(default)s)")
    add_timing_args(g, rounds=20, context="200,800",
                    rounds_help="timed forwards of each implementation per cell; the median is "
                                "kept (default %(default)s)",
                    context_help="cached tokens before the new ones, comma-separated (default "
                                 "%(default)s)")
    g.add_argument("--tokens", default="1,5,9", metavar="N[,N...]",
                   help="new tokens per forward, comma-separated (default %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.benchmarks.attention_bench import compare
    from mcsd_runtime.models.attention import check_attention

    impls = tuple(x.strip() for x in args.compare.split(","))
    if len(impls) != 2 or impls[0] == impls[1]:
        raise MCSDError(f"--compare takes two different implementations, A,B: {args.compare!r}")
    for impl in impls:
        check_attention(impl)
    contexts = parse_counts(args.context, "--context")
    tokens = parse_counts(args.tokens, "--tokens")
    if args.rounds < 2:
        raise MCSDError(f"--rounds must be 2 or more, got {args.rounds}")
    apply_threads(args)
    pair = pair_from_args(args)
    a, b = impls
    print(f"target forward over n new tokens under a tree mask, {pair.target.dtype}, "
          f"{pair.device}; ratio = {a} / {b}, paired call by call")
    print(f"| context | n | {a} ms | {b} ms | ratio [95% CI] | max logit diff |")
    print("|---|---|---|---|---|---|")
    for context in contexts:
        for n in tokens:
            r = compare(pair.target, impls, context, n, args.rounds)
            print(f"| {context} | {n} | {r[a]:.1f} | {r[b]:.1f} | {r['ratio']:.3f} "
                  f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] | {r['max_logit_diff']:.2g} |",
                  flush=True)
    return 0
