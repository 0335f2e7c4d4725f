"""Where a decode step's time goes: forwards against everything else, and what the host does.

`python -m mcsd_runtime.costmodel.step_breakdown --device cuda` decodes AR and static depths
with a pair and reports, per step, the wall time, the target's and draft's forward times
(each forward synchronized and timed, `DecodeConfig(profile=True)`) and the rest: the
decoder's own host work. `--shape smollm2` builds a pair of SmolLM2-135M's shape with random
weights on the device (30-layer target, a draft of `--draft-layers` of its layers), so a
GPU machine needs no weights; acceptance is then near zero, which does not matter here: each
step's forwards are timed against that step's wall time. `launch_counts` reads the torch
profiler over one static run: kernel launches, stream synchronizations, device-to-host copies
and `.item()` calls per step, the things that keep a GPU waiting on Python. `--decisions` adds
each stopper's cost per decision inside the decoder on the same pair (`decision_cost`; on a GPU
it includes waiting for the draft forward the decision reads).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from mcsd_runtime.errors import MCSDError

# Llama-family shapes whose random-weight twins `shaped_pair` builds.
SHAPES = {
    "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    max_position_embeddings=8192, tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                 tie_word_embeddings=True),
}
# what launch_counts reports, per step
PROFILED = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaStreamSynchronize", "cudaMemcpyAsync",
            "aten::_local_scalar_dense")
DEFAULT_METHODS = ("ar", "static:1", "static:2", "static:4", "static:6")


@dataclass
class StepRow:
    method: str
    steps: int
    step_ms: float  # wall time per step, unsynchronized run
    step_ms_synced: float  # the same with every forward synchronized and timed
    target_ms_per_call: float
    draft_ms_per_call: float
    forwards_ms_per_step: float  # target + draft forward time per step (synchronized run)
    other_ms_per_step: float  # step_ms_synced - forwards_ms_per_step: the decoder's host work
    decision_us: float | None = None  # median µs per stop decision (--decisions), None for ar


def shaped_pair(shape: str, draft_layers: int, device: str, dtype: torch.dtype, seed: int = 0):
    """A random-weight target of `shape` and a draft of the same shape with `draft_layers`
    layers, on `device` in `dtype` (eos unset, so every run decodes its full length)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mcsd_runtime.models.attention import register
    from mcsd_runtime.models.pair import Pair

    if shape not in SHAPES:
        raise MCSDError(f"unknown shape {shape!r}; use one of {', '.join(SHAPES)}")

    def build(layers: int, s: int):
        torch.manual_seed(s)
        config = LlamaConfig(**{**SHAPES[shape], "num_hidden_layers": layers})
        config._attn_implementation = register()  # the decoder's default attention
        model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
        model.generation_config.eos_token_id = None
        return model

    return Pair(build(SHAPES[shape]["num_hidden_layers"], seed), build(draft_layers, seed + 1),
                target_name=f"{shape}-shaped", draft_name=f"{shape}-shaped-{draft_layers}")


def _decoder(pair, method: str, k_config: tuple[int, ...], max_new_tokens: int,
             profile: bool):
    from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
    from mcsd_runtime.stop.builtin import make_stopper

    if method == "ar":
        return ARDecoder(pair, DecodeConfig(k_config=(), max_new_tokens=max_new_tokens,
                                            profile=profile))
    cfg = DecodeConfig(k_config=k_config, max_new_tokens=max_new_tokens, profile=profile)
    return MCSDDecoder(pair, cfg, stopper=make_stopper(method, k_config))


def breakdown(pair, method: str, k_config: tuple[int, ...], prompts: list[list[int]],
              max_new_tokens: int) -> StepRow:
    """One method decoded over `prompts` twice (plain, then with forwards synchronized and
    timed), after a warm-up; times per step exclude the prompt's prefill."""
    runs = {}
    for profile in (False, True):
        dec = _decoder(pair, method, k_config, max_new_tokens, profile)
        dec.generate(prompts[0])
        tot = dict(wall=0.0, fwd=0.0, steps=0, t=0.0, d=0.0, tc=0, dc=0)
        for ids in prompts:
            st = dec.generate(ids).stats
            tot["wall"] += st.wall_time - st.prefill_time
            tot["fwd"] += st.target_time + st.draft_time - st.prefill_time
            tot["steps"] += st.target_calls - 1
            tot["t"] += st.target_time
            tot["d"] += st.draft_time
            tot["tc"] += st.target_calls
            tot["dc"] += st.draft_calls
        runs[profile] = tot
    plain, synced = runs[False], runs[True]
    steps = max(synced["steps"], 1)
    fwd = synced["fwd"] / steps * 1e3
    return StepRow(
        method=method, steps=synced["steps"],
        step_ms=round(plain["wall"] / max(plain["steps"], 1) * 1e3, 3),
        step_ms_synced=round(synced["wall"] / steps * 1e3, 3),
        target_ms_per_call=round(synced["t"] / max(synced["tc"], 1) * 1e3, 3),
        draft_ms_per_call=round(synced["d"] / max(synced["dc"], 1) * 1e3, 3),
        forwards_ms_per_step=round(fwd, 3),
        other_ms_per_step=round(synced["wall"] / steps * 1e3 - fwd, 3))


def launch_counts(pair, method: str, k_config: tuple[int, ...], prompt: list[int],
                  max_new_tokens: int) -> dict[str, float]:
    """Per step of one run of `method`: the torch profiler's counts of `PROFILED` events, and
    the share of the run's CPU time during which the device computed (`device_busy`, 0 on a
    CPU run)."""
    from torch.profiler import ProfilerActivity, profile

    dec = _decoder(pair, method, k_config, max_new_tokens, profile=False)
    dec.generate(prompt)
    cuda = pair.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        steps = max(dec.generate(prompt).stats.target_calls - 1, 1)
    events = prof.key_averages()
    counts = {e.key: e.count for e in events if e.key in PROFILED}
    out = {k: round(counts.get(k, 0) / steps, 2) for k in PROFILED}
    cpu = sum(e.self_cpu_time_total for e in events)
    dev = sum(getattr(e, "self_device_time_total", 0) for e in events) if cuda else 0
    out["device_busy"] = round(dev / cpu, 3) if cpu else 0.0
    out["steps"] = steps
    return out


def run(pair, methods: list[str], k_config: tuple[int, ...], prompt_tokens: int, prompts: int,
        max_new_tokens: int, seed: int = 0, progress=print, decisions: bool = False) -> dict:
    """The breakdown of every method and the launch counts of the last non-AR one, on
    `prompts` random prompts of `prompt_tokens` tokens; with `decisions`, each stopper's
    median cost per decision too."""
    from mcsd_runtime.costmodel.decision_cost import decision_cost

    gen = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, pair.vocab_size, (prompt_tokens,), generator=gen).tolist()
           for _ in range(max(prompts, 1))]
    rows = []
    for method in methods:
        rows.append(breakdown(pair, method, k_config, ids, max_new_tokens))
        if decisions and method != "ar":
            cost = decision_cost(method, pair.vocab_size, k_config, prompts=len(ids),
                                 max_new_tokens=max_new_tokens, seed=seed, pair=pair)
            rows[-1].decision_us = round(cost.get("median_us", 0.0), 2)
        progress(json.dumps(rows[-1].__dict__))
    deepest = [m for m in methods if m != "ar"][-1:] or ["static:1"]
    counts = launch_counts(pair, deepest[0], k_config, ids[0], max_new_tokens)
    progress(f"per step of {deepest[0]}: {json.dumps(counts)}")
    return {"device": str(pair.device), "dtype": str(pair.dtype).removeprefix("torch."),
            "k_config": k_config.json(), "max_new_tokens": max_new_tokens,
            "prompt_tokens": prompt_tokens, "prompts": len(ids),
            "rows": [r.__dict__ for r in rows], "launches": {deepest[0]: counts}}


def main(argv: list[str] | None = None) -> int:
    from mcsd_runtime.cli.args import (
        add_pair_args,
        add_threads_arg,
        apply_threads,
        pair_from_args,
    )
    from mcsd_runtime.decode.tree import parse_k_config
    from mcsd_runtime.models.device import pick_device
    from mcsd_runtime.models.pair import pick_dtype

    p = argparse.ArgumentParser(prog="python -m mcsd_runtime.costmodel.step_breakdown",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    p.add_argument("--shape", choices=sorted(SHAPES), default=None,
                   help="time a random-weight pair of this shape instead of --target/--draft")
    p.add_argument("--draft-layers", type=int, default=4,
                   help="layers of the --shape draft (default %(default)s)")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="ar and stopper specs, e.g. static:D, heuristic:4, stopper:DIR "
                        "(default %(default)s)")
    p.add_argument("--k-config", default="1,1,1,1,1,1",
                   help="tree of the static methods (default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="default %(default)s")
    p.add_argument("--prompt-tokens", type=int, default=200, help="default %(default)s")
    p.add_argument("--prompts", type=int, default=2, help="default %(default)s")
    p.add_argument("--decisions", action="store_true",
                   help="also time each stopper's decisions inside the decoder (median µs)")
    p.add_argument("--out", type=Path, default=None, help="JSON file to write")
    add_threads_arg(p)
    args = p.parse_args(argv)
    try:
        apply_threads(args)
        if min(args.max_new_tokens, args.prompt_tokens, args.prompts, args.draft_layers) < 1:
            raise MCSDError("--max-new-tokens, --prompt-tokens, --prompts and --draft-layers "
                            "must be positive")
        k_config = parse_k_config(args.k_config)
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        if args.shape:
            device = pick_device(args.device)
            pair = shaped_pair(args.shape, args.draft_layers, str(device),
                               pick_dtype(args.dtype, device))
        else:
            pair = pair_from_args(args)
        result = run(pair, methods, k_config, args.prompt_tokens, args.prompts,
                     args.max_new_tokens, decisions=args.decisions)
    except MCSDError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
