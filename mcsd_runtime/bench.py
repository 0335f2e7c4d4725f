"""`mcsd bench`: autoregressive vs MCSD tokens/s side by side in one process, prompt by prompt,
after a warm-up; plus τ and the share of decode wall time spent inside model forwards."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from mcsd_runtime.cli_args import (
    add_decode_args,
    add_pair_args,
    add_threads_arg,
    apply_threads,
    decode_config_from_args,
    pair_from_args,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark AR against MCSD on one pair",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_decode_args(p)
    p.add_argument("--prompts", default="toy-code", help="prompt set or file (default %(default)s)")
    p.add_argument("--limit", type=int, default=12, help="number of prompts (default %(default)s)")
    p.add_argument("--stopper", default="static", help="stopper spec (default %(default)s)")
    add_threads_arg(p)
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from mcsd_runtime.decoder import ARDecoder, MCSDDecoder
    from mcsd_runtime.prompts import load_prompts

    apply_threads(args)
    pair = pair_from_args(args)
    config = decode_config_from_args(args)
    prompts = load_prompts(args.prompts, limit=args.limit)
    methods = {"ar": ARDecoder(pair, config),
               f"mcsd:{','.join(map(str, config.k_config))}": MCSDDecoder(pair, config,
                                                                          stopper=args.stopper)}
    for dec in methods.values():  # warm-up
        dec.generate(prompts[0].text)
    rows: dict[str, list] = {name: [] for name in methods}
    for i, prompt in enumerate(tqdm(prompts, desc="bench", unit="prompt")):
        order = list(methods) if i % 2 == 0 else list(reversed(methods))
        for name in order:
            rows[name].append(methods[name].generate(prompt.text))
    ar_name, sd_name = list(methods)
    equal = sum(a.token_ids == b.token_ids for a, b in zip(rows[ar_name], rows[sd_name],
                                                              strict=True))
    report = {"pair": pair.fingerprint, "config": str(config), "stopper": args.stopper,
              "prompts": args.prompts, "n_prompts": len(prompts), "methods": {}}
    for name, results in rows.items():
        tps = [r.stats.tokens_per_s for r in results]
        tokens = sum(r.stats.new_tokens for r in results)
        report["methods"][name] = {
            "tokens_per_s_median": statistics.median(tps),
            "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
            "tau": tokens / sum(r.stats.target_calls for r in results),
            "forward_fraction": sum(r.stats.target_time + r.stats.draft_time for r in results)
            / sum(r.stats.wall_time for r in results),
            "new_tokens": tokens,
        }
    speedups = [b.stats.tokens_per_s / a.stats.tokens_per_s
                for a, b in zip(rows[ar_name], rows[sd_name], strict=True)]
    report["speedup_median"] = statistics.median(speedups)
    report["ar_equal_outputs"] = f"{equal}/{len(prompts)}"
    print(f"pair: {pair.target_name} / {pair.draft_name}   prompts: {args.prompts} "
          f"x{len(prompts)}   {config}")
    print(f"{'method':<16}{'tok/s (median)':>16}{'tau':>8}{'in forwards':>14}")
    for name, m in report["methods"].items():
        print(f"{name:<16}{m['tokens_per_s_median']:>16.1f}{m['tau']:>8.2f}"
              f"{m['forward_fraction']:>13.1%}")
    print(f"speedup (median per prompt): {report['speedup_median']:.2f}x   "
          f"AR-equal outputs: {report['ar_equal_outputs']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0
