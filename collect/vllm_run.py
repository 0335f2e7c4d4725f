"""`mcsd collect --engine vllm`: decode a prompt set with vLLM under one speculative method and
record what it drafted and accepted per request and verify step, as an engine trace
(`collect.traces`; no per-node features: vLLM does not expose them).

The requests go in waves of `--batch-size` submitted together (`mcsd_runtime.serving.vllm_eval`,
the same runner as `mcsd eval --engine vllm`). vLLM does not report the batch size of each step,
so `batch_size` is left empty; the wave's size is in the manifest. The steps that drafted nothing
(no n-gram match) are rows with drafted = 0 after the logged ones (`rows_from_metrics`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mcsd_runtime.errors import MCSDError

DEFAULT_VLLM_METHOD = "ngram:4"


def add_vllm_args(g: argparse._ArgumentGroup) -> None:
    """`--engine` and `--vllm-method` of `mcsd collect`."""
    from mcsd_runtime.cli.args import add_engine_arg

    add_engine_arg(g, "mcsd: this toolkit's decoder, one row per drafted node (default); vllm: "
                      "vLLM's offline engine (the [vllm] extra) under --vllm-method, one row per "
                      "request and verify step (an engine trace, `collect.traces.load_traces`), "
                      "--batch-size requests in flight")
    g.add_argument("--vllm-method", default=DEFAULT_VLLM_METHOD, metavar="METHOD",
                   help="--engine vllm: the speculative method traced: ngram:K[:MIN:MAX], "
                        "table:PATH or proposer:PATH (default %(default)s)")


def run_from_args(args: argparse.Namespace) -> int:
    """Decode --prompts with vLLM and write the trace folder (see the module doc)."""
    from collect.traces import rows_from_metrics, write_traces
    from mcsd_runtime.cli.eval_vllm import vllm_dtype
    from mcsd_runtime.models.pair import target_folder
    from mcsd_runtime.paths import runs_dir
    from mcsd_runtime.prompts.chat import encode_prompt
    from mcsd_runtime.prompts.sets import load_prompts
    from mcsd_runtime.serving.vllm_engine import require_vllm
    from mcsd_runtime.serving.vllm_eval import VllmRun, evaluate
    from mcsd_runtime.serving.vllm_methods import parse_method

    vllm = require_vllm()
    method = parse_method(args.vllm_method)
    if method.speculative is None:
        raise MCSDError("--vllm-method ar drafts nothing, so it has no trace: give a "
                        "speculative method, e.g. ngram:4")
    wave = int(str(args.batch_size).split(",")[0])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else runs_dir() / f"trace-vllm-{stamp}"
    model = target_folder(args.target, build=True)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = load_prompts(args.prompts, limit=args.limit, seed=args.seed)
    if not prompts:
        raise MCSDError(f"the prompt set {args.prompts!r} is empty")
    encoded = [(p.id, encode_prompt(p, tokenizer, args.chat)) for p in prompts]
    run = VllmRun(model=model, methods=(method,), concurrency=(wave,),
                  dtype=vllm_dtype(args.dtype), temperature=args.temperature,
                  max_new_tokens=args.max_new_tokens, ignore_eos=args.eos == "ignore",
                  seed=args.seed)
    records = evaluate(run, encoded)[wave]
    k = int(method.speculative["num_speculative_tokens"])
    kind, ids = method.speculative["method"], dict(encoded)
    category = {p.id: p.category for p in prompts}
    run_id = args.run_id or out.name
    rows = [row for r in records for row in rows_from_metrics(
        r.prompt_id, r.prompt_id, {"num_spec_tokens": k,
                                   "per_step_drafted": [d for d, _ in r.steps],
                                   "per_step_accepted": [a for _, a in r.steps]},
        run_id=run_id, method=kind, category=category[r.prompt_id],
        prompt_tokens=ids[r.prompt_id], new_tokens=r.new_tokens)]
    source = {"live": True, "target": model, "prompts": args.prompts, "limit": args.limit,
              "vllm_method": args.vllm_method, "speculative": method.speculative,
              "concurrency": wave, "dtype": run.dtype,
              "temperature": args.temperature, "max_new_tokens": args.max_new_tokens}
    write_traces(out, rows, {"engine": "vllm", "engine_version": vllm.__version__,
                             "method": kind, "run_id": run_id, "source": source,
                             "requests": len(records)}, force=getattr(args, "force", False))
    drafted = sum(row["drafted"] > 0 for row in rows)
    print(f"{len(records)} requests, {len(rows)} steps ({drafted} drafted) -> {out}")
    return 0
