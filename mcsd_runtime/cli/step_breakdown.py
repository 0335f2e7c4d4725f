"""`mcsd step-breakdown`: where a decode step's time goes, eager against captured
(`benchmarks.step_breakdown`, whose documentation is the command's description)."""

from __future__ import annotations

import argparse
import json

from mcsd_runtime.cli.args import (
    add_k_config_arg,
    add_max_new_tokens_arg,
    add_out_arg,
    add_pair_args,
    add_threads_arg,
    apply_threads,
    pair_from_args,
)
from mcsd_runtime.errors import MCSDError


def register(sub: argparse._SubParsersAction) -> None:
    from mcsd_runtime.benchmarks import step_breakdown as sb

    p = sub.add_parser("step-breakdown", help="where a decode step's time goes: forwards "
                                              "against host work, eager against captured",
                       description=sb.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_threads_arg(p)
    g = p.add_argument_group("what is timed")
    g.add_argument("--shape", choices=sorted(sb.SHAPES), default=None,
                   help="time a random-weight pair of this shape instead of --target/--draft")
    g.add_argument("--draft-layers", type=int, default=4,
                   help="layers of the --shape draft, for shapes without a draft shape of "
                        "their own (default %(default)s)")
    g.add_argument("--methods", default=",".join(sb.DEFAULT_METHODS),
                   help="ar, hf (the target's generate()) and stopper specs, e.g. static:D, "
                        "heuristic:4, stopper:DIR (default %(default)s)")
    g.add_argument("--graphs", default=",".join(sb.DEFAULT_GRAPHS),
                   help="the --graphs settings each method runs under, comma-separated (auto, "
                        "on, off; default %(default)s)")
    add_k_config_arg(g, "1,1,1,1,1,1", "tree of the static methods (default %(default)s)")
    add_max_new_tokens_arg(g, 48)
    g.add_argument("--prompt-tokens", type=int, default=200, help="default %(default)s")
    g.add_argument("--prompt-count", type=int, default=2,
                   help="random prompts decoded (default %(default)s)")
    g.add_argument("--rounds", type=int, default=3,
                   help="timed runs over the prompts; the median is reported (default "
                        "%(default)s)")
    g.add_argument("--copy-mib", type=int, default=1024,
                   help="size of the copy that measures the bandwidth (default %(default)s)")
    g.add_argument("--no-probe", action="store_true", help="skip the target forward probe")
    g.add_argument("--decisions", action="store_true",
                   help="also time each stopper's decisions inside the decoder (median µs)")
    add_out_arg(p, "JSON file to write")
    p.set_defaults(func=run)


def graphs_list(text: str) -> tuple[str, ...]:
    from mcsd_runtime.constants import GRAPHS

    out = tuple(dict.fromkeys(g.strip() for g in text.split(",") if g.strip()))
    bad = [g for g in out if g not in GRAPHS]
    if bad or not out:
        raise MCSDError(f"--graphs takes {', '.join(GRAPHS)} (comma-separated), got {text!r}")
    return out


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.backend.device import pick_device
    from mcsd_runtime.benchmarks import step_breakdown as sb
    from mcsd_runtime.models.pair import pick_dtype
    from mcsd_runtime.tree import parse_k_config

    apply_threads(args)
    if min(args.max_new_tokens, args.prompt_tokens, args.prompt_count, args.draft_layers,
           args.rounds, args.copy_mib) < 1:
        raise MCSDError("--max-new-tokens, --prompt-tokens, --prompt-count, --draft-layers, "
                        "--rounds and --copy-mib must be positive")
    graphs = graphs_list(args.graphs)
    k_config = parse_k_config(args.k_config)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.shape:
        device = pick_device(args.device)
        pair = sb.shaped_pair(args.shape, args.draft_layers, str(device),
                              pick_dtype(args.dtype, device))
    else:
        pair = pair_from_args(args)
    result = sb.run(pair, methods, k_config, args.prompt_tokens, args.prompt_count,
                    args.max_new_tokens, decisions=args.decisions, graphs=graphs,
                    repeats=args.rounds, copy_mib=args.copy_mib, probe=not args.no_probe,
                    sink=lambda partial: _write(args.out, {**partial, "shape": args.shape}))
    result["shape"] = args.shape
    print(sb.summary(result))
    _write(args.out, {**result, "complete": True})
    return 0


def _write(path, result: dict) -> None:
    """The result so far into `path` (atomically: a reader never sees half a file)."""
    if path is None:
        return
    from mcsd_runtime.paths import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result, indent=1) + "\n")
