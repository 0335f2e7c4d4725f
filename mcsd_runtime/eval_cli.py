"""`mcsd eval`: every method on the same prompts in one process, interleaved prompt by prompt
(the order rotates) after a warm-up, so machine drift cancels out. Writes per-prompt records,
a summary (CSV, JSON, Markdown), plots and a report.

Methods (comma-separated; a k-config's commas are kept with its method):
  ar                     the target alone, autoregressive, through our decoder's loop
  hf                     the target's own generate(): an AR reference sharing no code with ours
  mcsd[:K]               static MCSD with k-config K (default --k-config)
  mcsd-target-init[:K]   the paper's target-initialized candidates (NOT lossless)
  static:S confidence:T entropy[:L[:G]] cumprod:T heuristic
                         MCSD with --k-config and that stopper
  stopper:PATH           MCSD with --k-config and a trained stopper artifact
  hf-assisted            transformers' generate(assistant_model=draft), its default schedule
  hf-generate:STOPPER    our decoder inside generate(custom_generate=mcsd_runtime.hf.generate)
                         with --k-config and that stopper (e.g. hf-generate:heuristic), paired
                         with the same stopper run directly when both are listed

Greedy runs report output equality with ar and with hf; where a lossless output differs from
hf's, the report gives the first differing position and the target's top-2 logit margin there.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mcsd_runtime.cli_args import (
    add_decode_args,
    add_pair_args,
    add_threads_arg,
    apply_threads,
    decode_config_from_args,
    pair_from_args,
)
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.extras import require_toolkit

DEFAULT_METHODS = "ar,hf,mcsd,mcsd-target-init,confidence:0.4,heuristic,hf-assisted"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate methods and stoppers end to end",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_decode_args(p)
    p.add_argument("--prompts", default="toy-code", help="prompt set or file (default %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="number of prompts (default: all)")
    p.add_argument("--methods", default=DEFAULT_METHODS, help="default: %(default)s")
    p.add_argument("--reference", default=None,
                   help="method every other is compared with (paired per-prompt geometric mean "
                        "and 95%% CI); default: the run's best static schedule (mcsd[:K] or "
                        "static:D) by its speedup over ar")
    p.add_argument("--chat", action="store_true",
                   help="wrap prompts in the tokenizer's chat template (chat models)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: data/runs/eval-<time>)")
    add_threads_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_toolkit("mcsd eval", "matplotlib", "pandas")  # its tables and plots
    import torch

    from mcsd_runtime.evaluate import (
        check_method,
        check_writable,
        markdown_notes,
        markdown_table,
        run_eval,
        split_methods,
        summarize,
        write_outputs,
    )
    from mcsd_runtime.paths import runs_dir
    from mcsd_runtime.prompts import load_prompts

    apply_threads(args)
    methods = split_methods(args.methods)
    for m in methods:
        check_method(m)
    if args.reference is not None and args.reference not in methods:
        raise MCSDError(f"--reference {args.reference!r} is not among --methods; add it there")
    base = decode_config_from_args(args)
    prompts = load_prompts(args.prompts, limit=args.limit, seed=args.seed)
    if not prompts:
        raise MCSDError(f"the prompt set {args.prompts!r} is empty")
    out = args.out or runs_dir() / time.strftime("eval-%Y%m%d-%H%M%S")
    check_writable(out)
    pair = pair_from_args(args)
    records = run_eval(pair, prompts, methods, base, chat=args.chat)
    rows = summarize(records, greedy=base.temperature == 0, reference=args.reference)
    settings = {"target": pair.target_name, "draft": pair.draft_name, "prompts": args.prompts,
                "n_prompts": len(prompts), "temperature": base.temperature,
                "k_config": ",".join(map(str, base.k_config)), "verify": base.verify,
                "max_new_tokens": base.max_new_tokens, "seed": base.seed,
                "device": str(pair.device), "dtype": str(pair.dtype).removeprefix("torch."),
                "threads": torch.get_num_threads()}
    write_outputs(records, rows, out, settings)
    print(markdown_table(rows))
    notes = markdown_notes(rows, records)
    if notes:
        print(f"\n{notes}")
    print(f"\nwrote {out}/report.md")
    return 0
