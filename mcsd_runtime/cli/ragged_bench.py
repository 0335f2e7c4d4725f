"""`mcsd ragged-bench`: a batch's forward, padded against ragged, interleaved call by call
(`benchmarks.ragged_bench`, whose documentation is the command's description)."""

from __future__ import annotations

import argparse
import json

from mcsd_runtime.cli.args import (
    add_device_arg,
    add_json_arg,
    add_threads_arg,
    add_timing_args,
    apply_threads,
    parse_counts,
)
from mcsd_runtime.errors import MCSDError


def register(sub: argparse._SubParsersAction) -> None:
    from mcsd_runtime.benchmarks import ragged_bench

    p = sub.add_parser("ragged-bench",
                       help="time a batch's forward padded against ragged (random weights of a "
                            "known shape)",
                       description=ragged_bench.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_threads_arg(p)
    g = p.add_argument_group("the timed forwards")
    g.add_argument("--shape", default="smollm2",
                   help="model shape, random weights (smollm2, llama2-7b, tiny; default "
                        "%(default)s)")
    g.add_argument("--counts", action="append", metavar="N,N,...",
                   help="new tokens of each row of one batch, comma-separated; repeat for more "
                        "cells (default: 1,1,1,1,5,5,5,5 and 1,1,1,1,1,1,1,5)")
    add_timing_args(g, rounds=20, context="300",
                    rounds_help="timed forwards of each layout per cell (default %(default)s)",
                    context_help="cached tokens per row before the new ones (default "
                                 "%(default)s)")
    add_device_arg(g, " (default here: cpu)")
    g.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="model dtype (default %(default)s)")
    add_json_arg(g)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from mcsd_runtime.benchmarks.ragged_bench import compare_layouts
    from mcsd_runtime.benchmarks.step_breakdown import shaped_pair

    cells = [parse_counts(c, "--counts", minimum=0) for c in (args.counts or [
        "1,1,1,1,5,5,5,5", "1,1,1,1,1,1,1,5"])]
    if any(len(c) < 2 or max(c) < 1 for c in cells):
        raise MCSDError("--counts needs two rows or more and at least one token")
    if args.rounds < 2:
        raise MCSDError(f"--rounds must be 2 or more, got {args.rounds}")
    contexts = parse_counts(args.context, "--context")
    apply_threads(args)
    dtype = getattr(torch, args.dtype)
    device = "cpu" if args.device == "auto" else args.device
    model = shaped_pair(args.shape, 1, device, dtype).target
    print(f"{args.shape}-shaped target, random weights, {dtype}, {device}, "
          f"{torch.get_num_threads()} thread(s); ratio = ragged / padded, paired call by call")
    print("| rows | counts | context | tokens padded / ragged | padded ms | ragged ms | "
          "ratio [95% CI] | max logit diff |")
    print("|---|---|---|---|---|---|---|---|")
    results = []
    for context in contexts:
        for counts in cells:
            r = compare_layouts(model, counts, context, args.rounds)
            results.append(r)
            print(f"| {r['rows']} | {','.join(map(str, counts))} | {context} | "
                  f"{r['tokens']['padded']} / {r['tokens']['ragged']} | {r['padded_ms']:.1f} | "
                  f"{r['ragged_ms']:.1f} | {r['ratio']:.3f} [{r['ci'][0]:.3f}, "
                  f"{r['ci'][1]:.3f}] | {r['max_logit_diff']:.2g} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": args.shape, "dtype": args.dtype, "device": device,
                       "cells": results}, f, indent=1)
    return 0
