"""`python -m collect.overhead`: the cost of collecting. The same decoder (static full-depth
stopper) with and without the row recorder, prompt by prompt in alternating order after a
warm-up; recording includes building the Arrow table and writing it to a Parquet file.

Reports tokens/s both ways, their ratio (collection throughput as a share of plain decoding)
and rows/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from collect.defaults import DEFAULT_PROMPTS
from mcsd_runtime import metrics


def build_parser() -> argparse.ArgumentParser:
    from collect.cli import add_record_args
    from mcsd_runtime.cli.args import (
        add_decode_args,
        add_json_arg,
        add_limit_arg,
        add_pair_args,
        add_prompts_arg,
        add_threads_arg,
    )
    from mcsd_runtime.prompts.chat import add_chat_arg

    p = argparse.ArgumentParser(prog="python -m collect.overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    add_decode_args(p)
    add_prompts_arg(p, "prompt set or file (default %(default)s)", default=DEFAULT_PROMPTS)
    add_limit_arg(p, "prompts (default %(default)s)", default=8)
    add_record_args(p)
    add_chat_arg(p)
    add_threads_arg(p)
    add_json_arg(p)
    return p


def bench(pair, config, prompts, save_hidden: bool = False, chat: str = "auto") -> dict:
    import pyarrow.parquet as pq

    from collect.recorder import RowRecorder
    from mcsd_runtime.decode.decoder import MCSDDecoder
    from mcsd_runtime.prompts.chat import encode_prompt

    rec = RowRecorder(config.k_config, "bench", config.init, save_hidden)
    plain = MCSDDecoder(pair, config, stopper="static")
    recording = MCSDDecoder(pair, config, stopper="static", recorder=rec)
    ids = [plain.encode(encode_prompt(p, pair.tokenizer, chat)) for p in prompts]
    tmp = Path(tempfile.mkdtemp(prefix="collect-bench-"))

    def run_plain(x):
        t0 = time.perf_counter()
        r = plain.generate(x, seed=0)
        return r.stats.new_tokens, 0, time.perf_counter() - t0

    def run_rec(x):
        t0 = time.perf_counter()
        rec.begin("p", x)
        r = recording.generate(x, seed=0)
        table = rec.finish()
        pq.write_table(table, tmp / "bench.parquet", compression="zstd")
        return r.stats.new_tokens, table.num_rows, time.perf_counter() - t0

    run_plain(ids[0])  # warm-up
    run_rec(ids[0])
    res = {"plain": [], "record": []}
    for i, x in enumerate(ids):
        order = [("plain", run_plain), ("record", run_rec)]
        for name, fn in order if i % 2 == 0 else order[::-1]:
            res[name].append(fn(x))
    out = {}
    for name, rs in res.items():
        tok, rows, sec = (sum(r[k] for r in rs) for k in range(3))
        out[name] = {"tokens": tok, "rows": rows, "seconds": round(sec, 3),
                     "tokens_per_s": metrics.throughput(tok, sec),
                     "rows_per_s": metrics.throughput(rows, sec)}
    ratios = [metrics.throughput(r[0], r[2]) / metrics.throughput(p[0], p[2])
              for p, r in zip(res["plain"], res["record"], strict=True)]
    out["throughput_ratio"] = out["record"]["tokens_per_s"] / out["plain"]["tokens_per_s"]
    out["throughput_ratio_median_per_prompt"] = statistics.median(ratios)
    return out


def main(argv=None) -> int:
    from mcsd_runtime.cli.args import apply_threads, decode_config_from_args, pair_from_args
    from mcsd_runtime.errors import MCSDError
    from mcsd_runtime.prompts.sets import load_prompts

    args = build_parser().parse_args(argv)
    try:
        apply_threads(args)
        config = decode_config_from_args(args)
        if args.dense:
            from collect.run import dense_config

            config = dense_config(config)
        pair = pair_from_args(args)
        prompts = load_prompts(args.prompts, limit=args.limit, seed=args.seed)
        out = bench(pair, config, prompts, args.save_hidden, chat=args.chat)
    except MCSDError as err:
        print(f"python -m collect.overhead: error: {err}", file=sys.stderr)
        return 2
    out |= {"pair": pair.fingerprint, "config": str(config), "prompts": args.prompts,
            "n_prompts": len(prompts)}
    p, r = out["plain"], out["record"]
    print(f"{'':<10}{'tok/s':>10}{'rows/s':>10}{'seconds':>10}")
    print(f"{'plain':<10}{p['tokens_per_s']:>10.1f}{'':>10}{p['seconds']:>10.1f}")
    print(f"{'record':<10}{r['tokens_per_s']:>10.1f}{r['rows_per_s']:>10.0f}{r['seconds']:>10.1f}")
    print(f"collection throughput: {out['throughput_ratio']:.1%} of plain decoding "
          f"(median per prompt {out['throughput_ratio_median_per_prompt']:.1%})")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
