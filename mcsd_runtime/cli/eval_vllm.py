"""`mcsd eval --engine vllm`: the options of `mcsd eval` that apply to vLLM, checked, and the run
(`mcsd_runtime.serving.vllm_eval`)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.serving.vllm_methods import METHODS_HELP

DEFAULT_VLLM_METHODS = "ar,ngram:2,ngram:4"
DTYPES = {"auto": None, "fp32": "float32", "float32": "float32", "bf16": "bfloat16",
          "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


def add_vllm_args(p: argparse.ArgumentParser) -> None:
    """`--engine` and `--concurrency` of `mcsd eval`."""
    from mcsd_runtime.cli.args import add_engine_arg

    g = p.add_argument_group("another runtime: vLLM (mcsd_runtime.serving)")
    add_engine_arg(g, "mcsd: this toolkit's decoder (default); vllm: vLLM's offline engine (the "
                      "[vllm] extra), one engine per method, all started before any timing, "
                      "with the methods ar (vLLM plain), ngram:K[:MIN:MAX] (its prompt lookup), "
                      "table:PATH (K by batch size from `mcsd train --decision schedule`), "
                      "proposer:COPY[+STOPPER][+table:PATH] (the toolkit's decisions as vLLM's "
                      "custom proposer class: prompt lookup under a learned copy length, the "
                      "pair's draft under a stopper, or both, capped by a schedule at the live "
                      "batch size) and draft:K (vLLM's draft-model speculation, K "
                      "tokens a step from the target pair's own draft, exported once for vLLM "
                      "into the cache); default methods "
                      f"{DEFAULT_VLLM_METHODS}; speed is paired with vLLM's ar")
    g.add_argument("--concurrency", default="1", metavar="C[,C...]",
                   help="--engine vllm: requests in flight, e.g. 1,4,8,16: the prompts go in "
                        "waves of C submitted together; throughput is a wave's generated "
                        "tokens per wall second, paired per prompt at 1 and per wave above; "
                        "an item such as 1+16+4+8 is one run whose waves take these sizes in "
                        "turn, paired per wave (default %(default)s)")


def parse_concurrency(text: str) -> tuple[int | str, ...]:
    """`--concurrency`: requests in flight, one count or several (1,4,8,16); an item A+B+...
    is one run whose waves take these sizes in turn."""
    items: list[int | str] = []
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        try:
            sizes = [int(x) for x in item.split("+")]
        except ValueError:
            raise MCSDError(f"--concurrency {text!r}: give counts such as 1 or 1,4,8,16, or "
                            f"waves of varying size such as 1+16+4+8") from None
        if min(sizes) < 1:
            raise MCSDError(f"--concurrency {text!r}: give counts of at least 1, e.g. 1,4,8,16")
        items.append(sizes[0] if len(sizes) == 1 else "+".join(map(str, sizes)))
    if not items:
        raise MCSDError(f"--concurrency {text!r}: give counts such as 1 or 1,4,8,16")
    ints = sorted({c for c in items if isinstance(c, int)})
    return tuple(ints) + tuple(dict.fromkeys(c for c in items if isinstance(c, str)))


def refuse_decoder_options(args: argparse.Namespace, default_methods: str) -> None:
    """Options of our decoder that vLLM has no use for: refused rather than ignored."""
    given = {"--drafts": args.drafts is not None, "--runs": bool(args.runs),
             "--batch-size (use --concurrency)": str(args.batch_size) != "1",
             "--samples": args.samples != 1, "--k-config": args.k_config is not None,
             "--draft": args.draft is not None}
    bad = [name for name, on in given.items() if on]
    if bad:
        raise MCSDError(f"--engine vllm does not take {', '.join(bad)}: vLLM drafts with the "
                        f"methods of --methods ({METHODS_HELP})")
    if args.methods == default_methods:
        args.methods = DEFAULT_VLLM_METHODS


def vllm_dtype(dtype: str) -> str:
    """`--dtype` as vLLM names it (auto: what our decoder would pick on this CPU)."""
    if dtype not in DTYPES:
        raise MCSDError(f"--dtype {dtype!r} with --engine vllm: use fp32, bf16 or fp16")
    if DTYPES[dtype] is None:
        from mcsd_runtime.backend.device import command_dtype

        return str(command_dtype("auto", "cpu")).removeprefix("torch.")
    return DTYPES[dtype]


def run(args: argparse.Namespace, default_methods: str,
        place: Callable[[], tuple[Path, dict]]) -> int:
    """The whole `--engine vllm` evaluation (see `mcsd eval --help`); `place()` gives the
    output folder, checked writable, and the prompt domains, as `mcsd eval` reads them."""
    from mcsd_runtime.serving.draft_export import vllm_draft
    from mcsd_runtime.serving.vllm_engine import require_vllm
    from mcsd_runtime.serving.vllm_eval import VllmRun
    from mcsd_runtime.serving.vllm_methods import parse_methods

    refuse_decoder_options(args, default_methods)
    require_vllm()
    methods = tuple(parse_methods(args.methods, draft=lambda: vllm_draft(args.target)))
    concurrency = parse_concurrency(args.concurrency)
    out, domains = place()
    from mcsd_runtime.models.pair import target_folder

    model = target_folder(args.target, build=True)
    tokenizer = _tokenizer(model)
    eos = () if args.eos == "ignore" else tuple(_eos_ids(tokenizer))
    run_ = VllmRun(model=model, methods=methods, concurrency=concurrency,
                   dtype=vllm_dtype(args.dtype), temperature=args.temperature,
                   max_new_tokens=args.max_new_tokens, ignore_eos=args.eos == "ignore",
                   stop_token_ids=eos, seed=args.seed)
    return _decode_domains(args, run_, domains, tokenizer, out)


def _tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def _eos_ids(tokenizer) -> list[int]:
    eos = tokenizer.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _decode_domains(args: argparse.Namespace, run, domains: dict, tokenizer, out: Path) -> int:
    """Start the engines once, decode every domain at every concurrency, write the reports."""
    from mcsd_runtime.prompts.chat import encode_prompt
    from mcsd_runtime.serving.vllm_eval import run_waves, running

    print(f"vLLM: {len(run.methods)} methods x concurrency {','.join(map(str, run.concurrency))}"
          f" on {run.model} ({run.dtype})", flush=True)
    with running(run, log=lambda line: print(line, flush=True)) as (engines, params):
        for name, (spec, prompts) in domains.items():
            encoded = [(p.id, encode_prompt(p, tokenizer, args.chat)) for p in prompts]
            by_c = {c: run_waves(engines, encoded, c, params) for c in run.concurrency}
            folder = out / name if len(domains) > 1 else out
            _write(args, run, by_c, folder, tokenizer, spec, len(prompts))
    print(f"\nwrote {out}")
    return 0


def _draft_model(run) -> str:
    """The draft model the run's methods draft with: vLLM's for `draft:K`, the proposer
    class's for a proposer with a stopper ("-": none)."""
    import json

    from mcsd_runtime.serving.vllm_proposer import PROPOSER_ENV

    for m in run.methods:
        if m.speculative and m.speculative.get("method") == "draft_model":
            return m.speculative["model"]
        draft = next((json.loads(v).get("draft") for k, v in m.env if k == PROPOSER_ENV), None)
        if draft:
            return draft
    return "-"


def _write(args, run, by_c: dict, folder: Path, tokenizer, spec: str, n_prompts: int) -> None:
    from mcsd_runtime.evaluate.eval_report import write_outputs
    from mcsd_runtime.evaluate.stats import summarize
    from mcsd_runtime.serving.vllm_engine import require_vllm
    from mcsd_runtime.serving.vllm_eval import concurrency_rows, write_concurrency

    greedy = run.temperature == 0
    settings = {"engine": "vllm", "engine_version": require_vllm().__version__,
                "target": run.model, "draft": _draft_model(run), "prompts": spec,
                "n_prompts": n_prompts,
                "chat": args.chat, "temperature": run.temperature, "k_config": "-",
                "max_new_tokens": run.max_new_tokens, "seed": run.seed,
                "ignore_eos": run.ignore_eos, "dtype": run.dtype,
                "concurrency": list(run.concurrency),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for c, records in by_c.items():
        rows = summarize(records, greedy=greedy, reference="ar")
        write_outputs(records, rows, folder / f"c{c}", settings | {"batch_size": c},
                      tokenizer=tokenizer)
    print(write_concurrency(concurrency_rows(by_c, greedy), folder, settings))
