"""`mcsd drift`: is greedy MCSD in bf16 (or fp16) as faithful as greedy AR in bf16?

In a low precision a tree forward and a one-token forward round differently, so greedy MCSD can
part from greedy AR of the same target at a near-tie; bf16 AR itself parts from float32 AR. This
decodes every prompt greedily four ways (AR and MCSD, float32 and the low precision) and
reports, per prompt category, the share of outputs equal to float32 AR, the first position where
they differ and float32 target's top-2 logit margin there (a near-tie is rounding, a wide margin
would be a bug), and the share of low-precision MCSD outputs equal to low-precision AR. Only
float32 MCSD against float32 AR is a losslessness check; the low-precision figures measure drift.
Writes drift.json (every output) and drift.md under --out."""

from __future__ import annotations

import argparse
import json

from mcsd_runtime.cli.args import (
    add_graphs_arg,
    add_k_config_arg,
    add_limit_arg,
    add_max_new_tokens_arg,
    add_out_arg,
    add_pair_args,
    add_prompts_arg,
    add_seed_arg,
    add_threads_arg,
    apply_threads,
)
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts.chat import add_chat_arg

LOW = {"bf16": "bfloat16", "fp16": "float16"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("drift", help="how far bf16 MCSD and bf16 AR drift from fp32 AR",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    p.add_argument("--low", default="bf16", choices=sorted(LOW),
                   help="the low precision compared with float32 (default %(default)s)")
    add_k_config_arg(p, "4,2", "static tree of MCSD (default %(default)s)")
    add_max_new_tokens_arg(p, 64)
    add_graphs_arg(p)
    add_prompts_arg(p, "prompt set or file; categories are reported apart (default "
                       "%(default)s)", default="inst-mix-eval")
    add_limit_arg(p, "prompts, a seeded sample (default %(default)s)", default=24)
    add_seed_arg(p, "sampling seed of --limit (default %(default)s)")
    add_chat_arg(p)
    add_threads_arg(p)
    add_out_arg(p, "folder for drift.json and drift.md", required=True)
    p.set_defaults(func=run, dtype="float32")


def run(args: argparse.Namespace) -> int:
    import torch

    from mcsd_runtime.decode.records import DecodeConfig
    from mcsd_runtime.evaluate.drift import drift_table, measure_drift, summarize
    from mcsd_runtime.models.pair import load_pair
    from mcsd_runtime.paths import atomic_write_text
    from mcsd_runtime.prompts.chat import encode_prompt
    from mcsd_runtime.prompts.sets import load_prompts
    from mcsd_runtime.tree import parse_k_config

    if args.dtype not in ("float32", "fp32"):
        raise MCSDError(f"mcsd drift decodes in float32 and in --low; --dtype {args.dtype} has "
                        f"no meaning here: drop it (use --low bf16 or fp16)")
    apply_threads(args)
    k_config = parse_k_config(args.k_config)
    prompts = load_prompts(args.prompts, limit=args.limit, seed=args.seed)
    pair = load_pair(args.target, args.draft, device=args.device, dtype="float32",
                     attn_implementation=args.attention, build=True)  # as every command does
    config = DecodeConfig(k_config=k_config, max_new_tokens=args.max_new_tokens,
                          graphs=args.graphs)
    encoded = [(p.id, p.category or p.source, encode_prompt(p, pair.tokenizer, args.chat))
               for p in prompts]
    rows = measure_drift(pair, encoded, config, low=getattr(torch, LOW[args.low]),
                         progress=True)
    summary = summarize(rows)
    table = drift_table(summary, low=args.low)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "drift.json", json.dumps(
        {"pair": pair.fingerprint, "k_config": k_config.json(), "low": args.low,
         "max_new_tokens": args.max_new_tokens, "prompts": args.prompts, "chat": args.chat,
         "summary": summary, "rows": [r.to_dict() for r in rows]}, indent=2))
    atomic_write_text(args.out / "drift.md", table + "\n")
    print(table)
    return 0
