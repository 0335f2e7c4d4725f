"""`mcsd collect` (also `python -m collect`): run the decoder over a prompt set at full depth and
log one row per drafted node (features and what the target accepted) into a run folder of
Parquet shards plus manifest.json.

Rerunning the same command resumes an interrupted run: only the missing prompts are decoded.
A different configuration pointed at an existing run folder is refused, and so is a second job
while another one writes to it.
"""

from __future__ import annotations

import argparse
import re

from collect.defaults import DEFAULT_PROMPTS, DEFAULT_SHARD_PROMPTS
from mcsd_runtime.extras import require_toolkit
from mcsd_runtime.toy import is_toy_spec

EPILOG = """examples:
  mcsd collect --target toy --prompts toy-code-collect --limit 64
  mcsd collect --target toy --prompts toy-code-collect --dense --out data/runs/dense
  mcsd collect --target CHAT_MODEL --draft DRAFT --prompts inst-mix --limit 400
      (instruction prompts in the tokenizer's chat template: --chat auto, the default)
  mcsd collect --target meta-llama/Llama-2-7b-chat-hf --draft JackFram/llama-68m \\
      --prompts alpaca=alpaca.json --limit 250 --temperature 0.7 --devices 4 --save-hidden
  mcsd collect --from-vllm-log responses.jsonl --out data/runs/trace-vllm
      (what a vLLM server drafted and accepted per verify step: collect.traces.load_traces)

Load the rows with collect.load_rows(DIR) (pandas), datasets.load_dataset("parquet",
data_dir=DIR) or any Parquet reader; collect.load_manifest(DIR) gives the manifest."""


def add_collect_args(p: argparse.ArgumentParser) -> None:
    from mcsd_runtime.cli.args import (
        add_batch_size_arg,
        add_decode_args,
        add_limit_arg,
        add_out_arg,
        add_pair_args,
        add_prompts_arg,
        add_threads_arg,
    )
    from mcsd_runtime.prompts.chat import add_chat_arg

    add_pair_args(p)
    add_decode_args(p)
    g = p.add_argument_group("collection")
    add_prompts_arg(g, "prompt set (`mcsd prompts --list`: toy-code-collect, toy-doc-collect, "
                       "mt-bench, ...), SET=FILE or a .json/.jsonl/.parquet file (default "
                       "%(default)s); train on your own traffic, evaluate on other sets",
                    default=DEFAULT_PROMPTS)
    add_limit_arg(g, "a seeded random sample of this many prompts (default: all)")
    add_chat_arg(g)
    add_out_arg(g, "run folder (default: $MCSD_DATA/runs/<name from the options>, MCSD_DATA "
                   "defaulting to ./data); an existing run folder with the same options is "
                   "resumed")
    g.add_argument("--run-id", default=None, help="run id stored in every row (default: the "
                                                   "folder name)")
    add_record_args(g)
    g.add_argument("--devices", type=int, default=1,
                   help="processes per node (Lightning Fabric DDP; CPU processes or one GPU each)")
    g.add_argument("--processes-per-device", type=int, default=1, metavar="N",
                   help="N processes share the one device --device names, e.g. a GPU that a "
                        "small model's forwards leave mostly idle (they wait on Python's kernel "
                        "launches); not with --devices (default %(default)s)")
    g.add_argument("--num-nodes", type=int, default=1,
                   help="nodes (set MASTER_ADDR, MASTER_PORT, NODE_RANK on each, or use torchrun)")
    g.add_argument("--shard-prompts", type=int, default=DEFAULT_SHARD_PROMPTS,
                   help="prompts per Parquet shard (default %(default)s); an interruption loses "
                        "at most one unfinished shard per process")
    add_batch_size_arg(g, "the rows are those of batch size 1 (the same prompts, ids and "
                          "labels; floating-point features may differ in the last bits)")
    add_threads_arg(g)
    g.add_argument("--no-progress", action="store_true",
                   help="no progress bar (nor, when not on a terminal, progress lines)")


def add_record_args(g: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--save-hidden` and `--dense`: what the recorder keeps (collect, `python -m
    collect.overhead`)."""
    g.add_argument("--save-hidden", action="store_true",
                   help="also store the draft's last hidden state per node (float16 list column)")
    g.add_argument("--dense", action="store_true",
                   help="greedy only: draft and verify a full tree at every position, committing "
                        "one token per step, so replay can follow any stopper exactly")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("collect", help="collect per-node draft features and acceptance "
                                              "labels into Parquet shards",
                              description=__doc__, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_collect_args(p)
    g = p.add_argument_group("a serving engine's trace (collect.vllm_log, collect.vllm_run)")
    g.add_argument("--from-vllm-log", metavar="FILE", default=None,
                   help="instead of decoding, import a JSONL file of vLLM responses carrying "
                        "metrics.speculative_decoding (server started with "
                        "--per-request-spec-decode-metrics detailed) as an engine trace: one "
                        "row per (request, verify step) in --out (default: "
                        "$MCSD_DATA/runs/trace-vllm-<file name>)")
    g.add_argument("--force", action="store_true",
                   help="with --from-vllm-log or --engine vllm: replace what --out holds")
    from collect.vllm_run import add_vllm_args

    add_vllm_args(g)
    p.set_defaults(func=run)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[-40:] or "x"


def default_run_name(args: argparse.Namespace) -> str:
    target = args.target if is_toy_spec(args.target) else args.target.rstrip("/")
    target = target.split("/")[-1]
    prompts = args.prompts.split("=")[0] if "=" in args.prompts else args.prompts
    prompts = prompts.rstrip("/").split("/")[-1].rsplit(".", 1)[0] if "/" in prompts or \
        prompts.endswith((".json", ".jsonl", ".parquet")) else prompts
    k = args.k_config.replace(",", ".").replace("/", "c").replace(" ", "").strip("()")
    parts = ["collect", _slug(target), _slug(prompts)]
    if args.limit:
        parts.append(f"n{args.limit}")
    parts += [f"k{k}", args.init, f"T{args.temperature:g}", f"m{args.max_new_tokens}"]
    if args.seed:
        parts.append(f"s{args.seed}")
    if args.dense:
        parts.append("dense")
    if args.save_hidden:
        parts.append("hidden")
    if getattr(args, "chat", "auto") != "auto":
        parts.append(f"chat-{args.chat}")
    return "-".join(parts)


def job_from_args(args: argparse.Namespace):
    from pathlib import Path

    from collect.run import CollectJob
    from mcsd_runtime.backend.device import pick_device
    from mcsd_runtime.cli.args import (
        check_batch_size,
        check_threads,
        decode_config_from_args,
        pair_paths,
    )
    from mcsd_runtime.paths import runs_dir
    from mcsd_runtime.prompts.sets import load_prompts

    check_threads(args.threads)
    check_batch_size(args.batch_size)
    pick_device(args.device)  # fails before prompts load or a toy pair is built
    config = decode_config_from_args(args)
    prompts = load_prompts(args.prompts, limit=args.limit, seed=args.seed)
    out = Path(args.out) if args.out else runs_dir() / default_run_name(args)
    target, draft = pair_paths(args)
    return CollectJob(prompts=prompts, out=str(out), config=config, prompt_set=args.prompts,
                      limit=args.limit, dense=args.dense, save_hidden=args.save_hidden,
                      run_id=args.run_id, shard_prompts=args.shard_prompts,
                      progress=not args.no_progress, threads=args.threads,
                      batch_size=args.batch_size, chat=args.chat,
                      pair_args={"target": target, "draft": draft, "device": args.device,
                                 "dtype": args.dtype, "attn_implementation": args.attention})


def run(args: argparse.Namespace) -> int:
    if getattr(args, "from_vllm_log", None):
        from collect.vllm_log import run_from_args

        return run_from_args(args)
    if args.engine == "vllm":
        from collect.vllm_run import run_from_args as run_vllm

        return run_vllm(args)
    require_toolkit("mcsd collect")
    from collect.run import format_summary, run_job

    job = job_from_args(args)
    manifest = run_job(job, devices=args.devices, num_nodes=args.num_nodes,
                       per_device=args.processes_per_device)
    if manifest.get("format"):  # rank 0 (other ranks of an external launch stay quiet)
        print(format_summary(manifest))
        print(f"rows in {job.out}")
    return 0
