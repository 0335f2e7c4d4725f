"""`mcsd bench`: tokens/s side by side in one process, prompt by prompt after a warm-up, of
  ar    the target alone through our decoder's loop,
  hf    the target's own generate() (an AR reference sharing no mask or cache code with ours),
  mcsd  MCSD with --k-config and --stopper;
plus τ, the share of wall time inside model forwards, and greedy output equality with ar and hf
(where an output differs from hf's: the position and the target's top-2 logit margin there)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from mcsd_runtime.cli.args import (
    FROM_STOPPER,
    add_batch_size_arg,
    add_decode_args,
    add_pair_args,
    add_threads_arg,
    apply_threads,
    check_batch_size,
    decode_config_from_args,
    pair_from_args,
)
from mcsd_runtime.constants import DEFAULT_K_CONFIG


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark AR (ours and generate()) against MCSD",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_decode_args(p, k_config=FROM_STOPPER)
    p.add_argument("--prompts", default="toy-code", help="prompt set or file (default %(default)s)")
    p.add_argument("--limit", type=int, default=12, help="number of prompts (default %(default)s)")
    p.add_argument("--stopper", default="static", help="stopper spec (default %(default)s)")
    add_batch_size_arg(p, "ar and MCSD decode the same batches of prompts (hf, which decodes "
                          "one at a time, then sits out); tok/s is the batch's, per decode "
                          "second")
    add_threads_arg(p)
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.decode.decoder import MCSDDecoder
    from mcsd_runtime.evaluate.run import (
        DecoderRunner,
        build_method,
        check_method,
        encode_prompt,
        explicit_label,
        markdown_notes,
        run_runners,
        short_name,
        summarize,
        tree_for,
    )
    from mcsd_runtime.prompts.sets import load_prompts
    from mcsd_runtime.stop.builtin import make_stopper
    from mcsd_runtime.stop.learned import check_pair

    apply_threads(args)
    check_batch_size(args.batch_size)
    check_method(args.stopper)  # a bad stopper fails before the pair loads
    k_config, why = tree_for([args.stopper], args.k_config, DEFAULT_K_CONFIG)
    stopper = explicit_label(args.stopper, k_config)
    config = decode_config_from_args(args, k_config=k_config)
    pair = pair_from_args(args)
    built = make_stopper(stopper)
    check_pair(built, pair)  # a learned stopper must come from this pair's collections
    prompts = load_prompts(args.prompts, limit=args.limit)
    greedy = config.temperature == 0
    sd_name = f"mcsd:{','.join(map(str, config.k_config))}"
    if stopper != f"static:{len(k_config)}":
        sd_name += f"+{short_name(stopper)}"
    runners = {"ar": build_method("ar", pair, config), "hf": build_method("hf", pair, config),
               sd_name: DecoderRunner(MCSDDecoder(pair, config, stopper=built))}
    if args.batch_size > 1:
        del runners["hf"]
    encoded = [(p.id, encode_prompt(pair, p.text, chat=False)) for p in prompts]
    records = run_runners(pair, runners, encoded, greedy, desc="bench",
                          batch_size=args.batch_size)
    rows = {r["method"]: r for r in summarize(records, greedy)}
    report = {"pair": pair.fingerprint, "config": asdict(config), "stopper": stopper,
              "prompts": args.prompts, "n_prompts": len(prompts), "batch_size": args.batch_size,
              "methods": {}}
    for name in runners:
        mine = [r for r in records if r.method == name]
        tps = [r.tokens_per_s for r in mine]
        row = rows[name]
        report["methods"][name] = {
            "tokens_per_s_median": row["tokens_per_s_median"],
            "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
            "tau": row["tau"],
            "forward_fraction": sum(r.forward_time for r in mine) / sum(r.wall_time for r in mine),
            "new_tokens": row["new_tokens"],
            "speedup_vs_ar": row["speedup_vs_ar"], "speedup_vs_hf": row["speedup_vs_hf"],
            "ar_equal_share": row["ar_equal_share"], "hf_equal_share": row["hf_equal_share"],
        }
    report["hf_divergences"] = [{"method": r.method, "prompt_id": r.prompt_id} | r.hf_divergence
                                for r in records if r.hf_divergence]
    print(f"pair: {pair.target_name} / {pair.draft_name}")
    print(f"prompts: {args.prompts} x{len(prompts)}; {describe_config(config)} (k-config: "
          f"{why}); stopper {stopper}; batch size {args.batch_size}")
    w = max(24, *(len(name) + 2 for name in runners))
    print(f"{'method':<{w}}{'tok/s (median)':>16}{'vs ar':>8}{'vs hf':>8}{'tau':>7}"
          f"{'in forwards':>13}{'ar-equal':>10}{'hf-equal':>10}")
    for name, m in report["methods"].items():
        print(f"{name:<{w}}{m['tokens_per_s_median']:>16.1f}{m['speedup_vs_ar']:>7.2f}x"
              f"{_times(m['speedup_vs_hf']):>8}{m['tau']:>7.2f}{m['forward_fraction']:>12.1%}"
              f"{_share(m['ar_equal_share']):>10}{_share(m['hf_equal_share']):>10}")
    notes = markdown_notes(list(rows.values()), records)
    if notes:
        print(notes)
    print("speedups: median per-prompt ratio of tokens/s (per batch at --batch-size > 1)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def describe_config(config) -> str:
    """A DecodeConfig as a reader wants it: `k-config 4,2,2,1, greedy, 128 new tokens, ...`."""
    k = ",".join(map(str, config.k_config)) or "() (autoregressive)"
    sampling = "greedy" if config.temperature == 0 else (
        f"temperature {config.temperature:g} (verifier {config.verify})")
    init = "draft-initialized" if config.init == "draft" else "target-initialized (NOT lossless)"
    return (f"k-config {k}, {init}, {sampling}, {config.max_new_tokens} new tokens, "
            f"seed {config.seed}")


def _times(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _share(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"
