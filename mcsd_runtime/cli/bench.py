"""`mcsd bench`: tokens/s side by side in one process, prompt by prompt after a warm-up, of
  ar    the target alone through our decoder's loop,
  hf    the target's own generate() (an AR reference sharing no mask or cache code with ours),
  mcsd  MCSD with --k-config and --stopper;
plus τ, the share of wall time inside model forwards, and greedy output equality with ar and hf
(where an output differs from hf's: the position and the target's top-2 logit margin there)."""

from __future__ import annotations

import argparse
import json

from mcsd_runtime.cli.args import (
    FROM_STOPPER,
    add_batch_size_arg,
    add_decode_args,
    add_format_mismatch_arg,
    add_json_arg,
    add_limit_arg,
    add_pair_args,
    add_prompts_arg,
    add_threads_arg,
    apply_threads,
    check_batch_size,
    decode_config_from_args,
    pair_from_args,
)
from mcsd_runtime.constants import DEFAULT_K_CONFIG
from mcsd_runtime.evaluate.cells import fmt_times
from mcsd_runtime.prompts.chat import add_chat_arg
from mcsd_runtime.tree import k_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark AR (ours and generate()) against MCSD",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_decode_args(p, k_config=FROM_STOPPER)
    add_prompts_arg(p, "prompt set or file (default %(default)s)", default="toy-code")
    add_limit_arg(p, "number of prompts (default %(default)s)", default=12)
    p.add_argument("--stopper", default="static", help="stopper spec (default %(default)s)")
    add_chat_arg(p)
    add_format_mismatch_arg(p)
    add_batch_size_arg(p, "ar and MCSD decode the same batches of prompts (hf, which decodes "
                          "one at a time, then sits out); tok/s is the batch's, per decode "
                          "second")
    add_threads_arg(p)
    add_json_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.decisions.builtin import make_decision
    from mcsd_runtime.decisions.learned import check_pair
    from mcsd_runtime.evaluate.bench import run_bench
    from mcsd_runtime.evaluate.eval_report import markdown_notes
    from mcsd_runtime.evaluate.methods import (
        check_method,
        check_prompt_formats,
        explicit_label,
        tree_for,
    )
    from mcsd_runtime.prompts.sets import load_prompts

    apply_threads(args)
    check_batch_size(args.batch_size)
    check_method(args.stopper)  # a bad stopper fails before the pair loads
    k_config, why = tree_for([args.stopper], args.k_config, DEFAULT_K_CONFIG)
    stopper = explicit_label(args.stopper, k_config)
    config = decode_config_from_args(args, k_config=k_config)
    pair = pair_from_args(args)
    built = make_decision(stopper)
    check_pair(built, pair)  # a learned stopper must come from this pair's collections
    prompts = load_prompts(args.prompts, limit=args.limit)
    fmt = check_prompt_formats([stopper], {args.prompts: prompts}, pair.tokenizer, args.chat,
                               args.allow_format_mismatch)[args.prompts]
    report, records, rows = run_bench(pair, config, stopper, built, prompts, args.prompts,
                                      batch_size=args.batch_size, chat=args.chat)
    report |= {"chat": args.chat, "prompt_format": fmt}
    print(f"pair: {pair.target_name} / {pair.draft_name}")
    print(f"prompts: {args.prompts} x{len(prompts)}, formatted as {fmt['format']} (--chat "
          f"{args.chat}); {describe_config(config)} (k-config: {why}); stopper {stopper}; "
          f"batch size {args.batch_size}")
    w = max(24, *(len(name) + 2 for name in report["methods"]))
    print(f"{'method':<{w}}{'tok/s (median)':>16}{'vs ar':>8}{'vs hf':>8}{'tau':>7}"
          f"{'in forwards':>13}{'ar-equal':>10}{'hf-equal':>10}")
    for name, m in report["methods"].items():
        print(f"{name:<{w}}{m['tokens_per_s_median']:>16.1f}{m['speedup_vs_ar']:>7.2f}x"
              f"{fmt_times(m['speedup_vs_hf'], 'n/a'):>8}{m['tau']:>7.2f}"
              f"{m['forward_fraction']:>12.1%}"
              f"{_share(m['ar_equal_share']):>10}{_share(m['hf_equal_share']):>10}")
    notes = markdown_notes(rows, records)
    if notes:
        print(notes)
    print("speedups: median per-prompt ratio of tokens/s (per batch at --batch-size > 1)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def describe_config(config) -> str:
    """A DecodeConfig as a reader wants it: `k-config 4,2,2,1, greedy, 128 new tokens, ...`."""
    k = k_text(config.k_config)
    sampling = "greedy" if config.temperature == 0 else (
        f"temperature {config.temperature:g} (verifier {config.verify})")
    init = "draft-initialized" if config.init == "draft" else "target-initialized (NOT lossless)"
    return (f"k-config {k}, {init}, {sampling}, {config.max_new_tokens} new tokens, "
            f"seed {config.seed}")


def _share(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"
