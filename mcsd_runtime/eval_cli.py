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

--k-config defaults to the tree the trained stoppers among the methods were trained on (else
4,2,2,1). Each method is reported under a label with its defaults spelt out (confidence ->
confidence:0.4, mcsd -> mcsd:4,2,2,1).

Greedy runs report output equality with ar and with hf; where a lossless output differs from
hf's, the report gives the first differing position and the target's top-2 logit margin there.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mcsd_runtime.cli_args import (
    FROM_STOPPER,
    add_decode_args,
    add_pair_args,
    add_threads_arg,
    apply_threads,
    decode_config_from_args,
    pair_from_args,
)
from mcsd_runtime.constants import DEFAULT_K_CONFIG
from mcsd_runtime.errors import MCSDError

DEFAULT_METHODS = "ar,hf,mcsd,mcsd-target-init,confidence,heuristic,hf-assisted"
# A first try in about a minute on the tiny toy pair (a few on the default one); `make demo`
# and the README's results pass their own sizes.
DEFAULT_LIMIT = 16
DEFAULT_MAX_NEW_TOKENS = 64


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate methods and stoppers end to end",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_decode_args(p, k_config=FROM_STOPPER)
    p.set_defaults(max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--prompts", default="toy-code", help="prompt set or file (default %(default)s)")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                   help="number of prompts, a seeded sample (default %(default)s; 0: all)")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma-separated, see above; each runs under a label with its defaults "
                        "spelt out, e.g. confidence -> confidence:0.4 (default: %(default)s)")
    p.add_argument("--reference", default=None,
                   help="method every other is compared with (paired per-prompt geometric mean "
                        "and 95%% CI); default: the run's best static schedule (mcsd[:K] or "
                        "static:D) by its geometric-mean speedup over ar")
    p.add_argument("--chat", action="store_true",
                   help="wrap prompts in the tokenizer's chat template (chat models)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: $MCSD_DATA/runs/eval-<time>, MCSD_DATA "
                        "defaulting to ./data); an existing one has its reports replaced")
    add_threads_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from mcsd_runtime.evaluate import (
        check_method,
        check_writable,
        explicit_methods,
        markdown_notes,
        run_eval,
        short_table,
        split_methods,
        stopper_results,
        summarize,
        tree_for,
        write_outputs,
    )
    from mcsd_runtime.paths import runs_dir
    from mcsd_runtime.prompts import load_prompts

    apply_threads(args)
    given = split_methods(args.methods)
    for m in given:
        check_method(m)
    k_config, why = tree_for(given, args.k_config, DEFAULT_K_CONFIG)
    methods = explicit_methods(given, k_config)
    reference = args.reference
    if reference is not None:
        if reference not in given and reference not in methods:
            raise MCSDError(f"--reference {reference!r} is not among --methods; add it there")
        reference = methods[given.index(reference)] if reference in given else reference
    base = decode_config_from_args(args, k_config=k_config)
    prompts = load_prompts(args.prompts, limit=args.limit or None, seed=args.seed)
    if not prompts:
        raise MCSDError(f"the prompt set {args.prompts!r} is empty")
    out = args.out or runs_dir() / time.strftime("eval-%Y%m%d-%H%M%S")
    check_writable(out)
    pair = pair_from_args(args)
    print(f"{len(methods)} methods x {len(prompts)} prompts x {base.max_new_tokens} tokens, "
          f"k-config {','.join(map(str, k_config))} ({why})", flush=True)
    records = run_eval(pair, prompts, methods, base, chat=args.chat)
    rows = summarize(records, greedy=base.temperature == 0, reference=reference)
    settings = {"target": pair.target_name, "draft": pair.draft_name, "prompts": args.prompts,
                "n_prompts": len(prompts), "temperature": base.temperature,
                "k_config": ",".join(map(str, base.k_config)), "verify": base.verify,
                "max_new_tokens": base.max_new_tokens, "seed": base.seed,
                "device": str(pair.device), "dtype": str(pair.dtype).removeprefix("torch."),
                "threads": torch.get_num_threads()}
    replaced = write_outputs(records, rows, out, settings, tokenizer=pair.tokenizer,
                             stoppers=stopper_results(methods))
    print(short_table(rows))
    notes = markdown_notes(rows, records)
    if notes:
        print(f"\n{notes}")
    if replaced:
        print(f"\nreplaced the earlier {', '.join(replaced)} in {out}")
    print(f"\nwrote {out}/report.md (every column, a legend, plots)")
    return 0
