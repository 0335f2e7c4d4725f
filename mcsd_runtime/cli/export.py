"""`mcsd export`: write a trained K-by-batch-size schedule, or an engine profile as a step-cost
table, in a serving engine's own format."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mcsd_runtime.cli.args import add_out_arg
from mcsd_runtime.serving.export import DEFAULT_MAX_BATCH, ENGINES

DESCRIPTION = """Write the draft length K by batch size that `mcsd train --decision schedule`
chose (ARTIFACT: its folder, or the schedule.json in it) as a serving engine reads it:

  vllm    {"num_speculative_tokens_per_batch_size": [[lo, hi, K], ...],
           "num_speculative_tokens": largest K}: merge into --speculative-config beside
           "method". K=0 (no speculation at those batch sizes) is kept: vLLM supports it.
  trtllm  {"max_draft_len": K, "draft_len_schedule": {"hi": K, ...}} for the speculative
           config (each key the largest batch size of its band). K=0 is written as 1 (at 0
           TensorRT-LLM's one-engine drafters go stale), and a band above the first band's K is
           capped at it (TensorRT-LLM requires so); stderr says which.
  sglang  the --speculative-adaptive-config file: {"lo": {"candidate_steps": [K]}, ...}, one
          slot per band; for EAGLE/EAGLE3 with --speculative-eagle-topk 1. K=0 is kept.

ARTIFACT may instead be an engine profile (`mcsd profile --engine vllm`): it is written as the
step-cost table of DSpark's verification planner, step time against the tokens a step scores
(requests + drafted tokens verified):

  sglang  {"sample_batch_tokens": [...], "sample_steps_per_sec": [...], "max_batch_tokens": M}
          for --speculative-dspark-sps-table-path.
  trtllm  {"token_counts": [...], "step_time_ms": [...], "fixed_overhead_ms": 0,
           "minimum_predicted_gain": 0.01} for confidence_sps_table_path.

The open last band is ended at --max-batch-size. An engine reads one table for all requests:
a schedule with per-category bands exports its pooled bands, or one category's with --category
(one file per category, for deployments that serve one each). The file is written atomically;
what it cannot carry goes to stderr as notes. docs/serving.md has each format's source.
"""


def register(subparsers: Any) -> None:
    """Add `mcsd export`."""
    parser = subparsers.add_parser(
        "export", help="write a trained K-by-batch-size schedule (vLLM, TensorRT-LLM, SGLang) "
                       "or an engine profile's step-cost table (SGLang, TensorRT-LLM)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, metavar="ARTIFACT",
                        help="folder written by `mcsd train --decision schedule`, or its "
                             "schedule.json; or an engine profile (`mcsd profile --engine "
                             "vllm`) for a step-cost table")
    parser.add_argument("--engine", required=True, choices=ENGINES,
                        help="the engine whose format to write (above)")
    add_out_arg(parser, "the JSON file to write (replaced atomically)", required=True)
    parser.add_argument("--category", default=None,
                        help="export this category's bands instead of the pooled ones (the "
                             "categories are those of the traces it was trained on)")
    parser.add_argument("--max-batch-size", type=int, default=DEFAULT_MAX_BATCH, metavar="N",
                        help="the end written for the open last band: at least the engine's "
                             "largest batch size (vLLM max_num_seqs, TensorRT-LLM "
                             "max_batch_size: it drafts nothing above it; default %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.serving.export import write_exported

    exported = _exported(args)
    path = write_exported(exported, args.out)
    for note in exported.notes:
        print(f"mcsd export: note: {note}", file=sys.stderr)
    print(f"-> {path} ({args.engine})")
    return 0


def _exported(args: argparse.Namespace):
    """The engine's config: a step-cost table where ARTIFACT is an engine profile, else the
    schedule's table."""
    from mcsd_runtime.errors import MCSDError
    from mcsd_runtime.serving import engine_profile
    from mcsd_runtime.serving.cost_table import export_cost_table
    from mcsd_runtime.serving.export import export_schedule
    from mcsd_runtime.serving.schedule import Schedule

    if _format(args.artifact) == engine_profile.FORMAT:
        if args.category is not None:
            raise MCSDError("--category selects a schedule's bands; an engine profile has none: "
                            "leave it out")
        return export_cost_table(engine_profile.EngineProfile.load(args.artifact), args.engine)
    schedule = Schedule.load(args.artifact)
    return export_schedule(schedule, args.engine, args.category, args.max_batch_size)


def _format(path: Path) -> str | None:
    """The "format" of the JSON object in file `path`, or None (a folder, or not such a file:
    the schedule's loader then says what is wrong)."""
    import json

    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data.get("format") if isinstance(data, dict) else None
