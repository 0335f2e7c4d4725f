"""How fast one forward can be: eager, fixed-shape (captured as a CUDA graph on a GPU) and
`torch.compile(mode="reduce-overhead")`, side by side.

This measures a target forward of n new tokens over a context of `context` cached tokens. It is
timed alone, outside the decoder, at 1 row and at 8 rows. The three ways to run it are:

- **eager**: transformers over a `DynamicCache`, cut back after each forward;
- **fixed**: the decoder's own fixed-shape forward (`mcsd_runtime.decode.graphs.FixedForwards`:
  slot cache, bucketed span, one CUDA graph per shape; no capture on a CPU);
- **compiled**: `torch.compile(mode="reduce-overhead")` over transformers' `StaticCache`, on
  CUDA only, since it is what gpt-fast does. Its compile seconds are reported beside its forward.

Each forward gets the same additive 4D mask and explicit positions as a decoder step. Every
figure is the median of `repeats` timed forwards after warm-up: CUDA events on a GPU,
`perf_counter` on a CPU. `run_spike(pair)` returns a list of rows, one per (way, rows, n). The
GPU check (`docs/gpu-check.md`) runs it at the smollm2 and llama2-7b shapes.
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import StaticCache

from mcsd_runtime.decode.cache import RowCache
from mcsd_runtime.decode.graphs import FixedForwards, call_model
from mcsd_runtime.decode.records import causal_bias


def _timed(fn, repeats: int, device: torch.device) -> float:
    """Median milliseconds of `fn()` over `repeats` calls, after two untimed ones."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def _inputs(model, rows: int, context: int, n: int):
    """Context ids [rows, context], new ids [rows, n], their positions and [n, n] causal block."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    dev, dtype = model.device, model.dtype
    ctx = torch.randint(0, vocab, (rows, context), generator=gen).to(dev)
    new = torch.randint(0, vocab, (rows, n), generator=gen).to(dev)
    pos = (context + torch.arange(n, device=dev)).expand(rows, -1)
    return ctx, new, pos, causal_bias(n, dtype, dev)


def _prefill(model, cache, ctx: torch.Tensor) -> None:
    rows, context = ctx.shape
    block = causal_bias(context, model.dtype, model.device)[None, None].expand(rows, -1, -1, -1)
    pos = torch.arange(context, device=model.device).expand(rows, -1)
    call_model(model, cache, ctx, pos, block, 1, False)


def eager_forward(model, rows: int, context: int, n: int):
    """A function running the eager forward again and again (returning its logits)."""
    ctx, new, pos, block = _inputs(model, rows, context, n)
    cache = RowCache(rows, model.device)
    _prefill(model, cache, ctx)
    cache.settle([context] * rows)
    mask = cache.mask(block[None], model.dtype)

    def forward():
        out = call_model(model, cache, new, pos, mask, 0, False)
        for layer in cache.cache.layers:
            layer.crop(-n)
        return out.logits

    return forward


def fixed_forward(model, rows: int, context: int, n: int):
    """The fixed-shape forward, again and again: each call rewrites the same n columns of the
    slot cache (returning its logits)."""
    ctx, new, pos, block = _inputs(model, rows, context, n)
    fw = FixedForwards(model.device, capture=model.device.type == "cuda")
    slots, _ = fw.caches(rows, context + n)
    prefill = RowCache(rows, model.device)
    _prefill(model, prefill, ctx)
    prefill.settle([context] * rows)
    slots.extend(prefill)
    mask = slots.mask(block[None], model.dtype)
    return lambda: fw(model, slots, new, pos, mask, 0, False).logits


@torch.inference_mode()
def compiled_ms(model, rows: int, context: int, n: int, repeats: int) -> tuple[float, float]:
    """(forward ms, compile seconds) of torch.compile(mode="reduce-overhead") over a
    StaticCache; each call writes the same n columns again."""
    ctx, new, pos, block = _inputs(model, rows, context, n)
    length = context + n
    cache = StaticCache(config=model.config, max_cache_len=length)
    full = causal_bias(length, model.dtype, model.device)[None, None].expand(rows, -1, -1, -1)
    model(input_ids=ctx, position_ids=torch.arange(context, device=ctx.device).expand(rows, -1),
          attention_mask=full[:, :, :context].contiguous(), past_key_values=cache,
          use_cache=True, logits_to_keep=1)
    mask = full[:, :, context:].contiguous()
    step = torch.compile(model, mode="reduce-overhead", fullgraph=False)

    def forward():
        for layer in cache.layers:
            layer.cumulative_length.fill_(context)
        step(input_ids=new, position_ids=pos, attention_mask=mask, past_key_values=cache,
             use_cache=True, logits_to_keep=0)

    t0 = time.perf_counter()
    forward()
    torch.cuda.synchronize()
    return _timed(forward, repeats, model.device), time.perf_counter() - t0


def run_spike(pair, rows: tuple[int, ...] = (1, 8), tokens: tuple[int, ...] = (1, 16),
              context: int = 256, repeats: int = 10, compiled: bool | None = None,
              on_row=None) -> list[dict]:
    """One row per (way, rows, new tokens) for the pair's target: every fixed (captured)
    row, then every eager one, then, when `compiled` (default: on CUDA), torch.compile's,
    whose failures are recorded, not raised; so the compiles, tens of seconds each, come after
    every other row. `on_row(rows so far)`, if given, sees the list after each row."""
    model = pair.target
    compiled = model.device.type == "cuda" if compiled is None else compiled
    shapes = [(b, n) for b in rows for n in tokens]
    out: list[dict] = []

    def add(row: dict) -> None:
        out.append(row)
        if on_row is not None:
            on_row(out)

    for way, make in (("fixed", fixed_forward), ("eager", eager_forward)):
        for b, n in shapes:
            with torch.inference_mode():
                ms = _timed(make(model, b, context, n), repeats, model.device)
            add({"rows": b, "new_tokens": n, "context": context, "way": way, "ms": ms})
    for b, n in shapes if compiled else ():
        row = {"rows": b, "new_tokens": n, "context": context, "way": "compiled"}
        try:
            ms, secs = compiled_ms(model, b, context, n, repeats)
            add({**row, "ms": ms, "compile_s": secs})
        except Exception as err:  # a compile failure is a result here, not a crash
            add({**row, "error": f"{type(err).__name__}: {str(err)[:300]}"})
    return out


def spike_table(rows: list[dict]) -> str:
    """The spike's rows as a Markdown table: milliseconds per forward, by way."""
    ways = sorted({r["way"] for r in rows}, key=["eager", "fixed", "compiled"].index)
    keys = sorted({(r["rows"], r["new_tokens"]) for r in rows})
    lines = ["| rows | new tokens | " + " | ".join(f"{w} ms" for w in ways) + " |",
             "|---:|---:|" + "---:|" * len(ways)]
    for b, n in keys:
        cells = []
        for w in ways:
            hit = [r for r in rows if (r["rows"], r["new_tokens"], r["way"]) == (b, n, w)]
            cells.append(f"{hit[0]['ms']:.2f}" if hit and "ms" in hit[0] else "failed")
        lines.append(f"| {b} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)



def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def _parser():
    import argparse
    from pathlib import Path

    from mcsd_runtime.benchmarks.step_breakdown import SHAPES

    p = argparse.ArgumentParser(prog="python -m mcsd_runtime.benchmarks.capture_spike",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny",
                   help="random-weight target of this shape (default %(default)s)")
    p.add_argument("--device", default="auto", help="auto, cuda, cpu (default %(default)s)")
    p.add_argument("--rows", default="1,8", help="rows a forward (default %(default)s)")
    p.add_argument("--tokens", default="1,16", help="new tokens a forward (default %(default)s)")
    p.add_argument("--context", type=int, default=256, help="cached tokens (default %(default)s)")
    p.add_argument("--rounds", type=int, default=10,
                   help="timed forwards of each; the median is reported (default %(default)s)")
    p.add_argument("--compiled", choices=("auto", "on", "off"), default="auto",
                   help="also time torch.compile (auto: on CUDA; default %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="JSON file to write")
    return p


def main(argv: list[str] | None = None) -> int:
    """`python -m mcsd_runtime.benchmarks.capture_spike --shape smollm2 --device cuda --out F`."""
    import sys

    from mcsd_runtime.backend.device import pick_device
    from mcsd_runtime.benchmarks.step_breakdown import shaped_pair
    from mcsd_runtime.errors import MCSDError

    p = _parser()
    args = p.parse_args(argv)
    try:
        device = pick_device(args.device)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        pair = shaped_pair(args.shape, 1, str(device), dtype)
        compiled = None if args.compiled == "auto" else args.compiled == "on"
        head = {"shape": args.shape, "device": str(device),
                "dtype": str(dtype).removeprefix("torch.")}
        rows = run_spike(pair, _ints(args.rows), _ints(args.tokens), args.context, args.rounds,
                         compiled, on_row=lambda so_far: _write(args.out, head, so_far))
    except (MCSDError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(_write(args.out, head, rows, complete=True))
    return 0


def _write(path, head: dict, rows: list[dict], complete: bool = False) -> str:
    """The rows so far and their table into `path` (atomically), if given; the table."""
    import json

    from mcsd_runtime.paths import atomic_write_text

    table = spike_table(rows)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({**head, "rows": rows, "table": table,
                                            "complete": complete}, indent=1) + "\n")
    return table


if __name__ == "__main__":
    raise SystemExit(main())
