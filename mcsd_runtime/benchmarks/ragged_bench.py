"""What a ragged forward costs against the padded one, interleaved call by call.

`mcsd ragged-bench` builds a random-weight model of a known shape (`step_breakdown.SHAPES`:
SmolLM2-135M's, Llama-2-7B's; no download), fills a batch cache of `rows` rows with `context`
tokens each, and times the target's forward over a batch whose rows hold `counts` new tokens
(e.g. half the rows verifying 1 token and half 5): padded (every row at the widest, the grid
[rows, max(counts)]) and ragged (each row's own tokens packed into one sequence,
`mcsd_runtime.decode.ragged`), through the engine's own `call_model` and `RowCache`, alternating
the two (A B, then B A, ...) so that a slow spell of a shared machine falls on both. Each cell
reports both medians, the geometric mean of the paired ratios (ragged / padded) with a 95%
bootstrap interval (`metrics.paired_speedup`), and the largest difference between the two
layouts' logits on the real slots.

The same forward (`FilledCache`, `timed_forward`) times the cost profile's ragged points
(`benchmarks.measure`, `mcsd profile`): T tokens in all over B rows laid out by `ragged_counts`,
at the totals `ragged_totals` gives.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from mcsd_runtime.metrics import paired_speedup


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def ragged_counts(total: int, rows: int, width: int) -> list[int]:
    """The rows' new tokens of a ragged forward carrying `total` over `rows` rows, each at most
    `width`: up to one token a row, `total` rows of one and the rest none (a draft depth of
    the rows still drafting); above it, every row one token (its bonus) and the rest piled onto
    rows in order up to `width` (rows that verify deep beside rows that verify nothing)."""
    if not 1 <= total <= rows * width:
        raise ValueError(f"{total} tokens do not fit {rows} rows of at most {width}")
    if total <= rows:
        return [1] * total + [0] * (rows - total)
    extra = total - rows
    return [1 + min(width - 1, max(0, extra - r * (width - 1))) for r in range(rows)]


def ragged_totals(rows: int, width: int, least: int = 1) -> list[int]:
    """A handful of totals from `least` to the padded grid's `rows * width`: 1 and rows / 2
    (a draft's forwards over the few rows still drafting), then rows times 1, 2, 3, 5, 8, 16,
    32 tokens a row below `width`, and the full grid."""
    picks = {1, -(-rows // 2), *(rows * m for m in (1, 2, 3, 5, 8, 16, 32) if m < width),
             rows * width}
    return sorted(t for t in picks if least <= t)


@dataclass
class FilledCache:
    """A batch cache (`RowCache`) of `rows` rows holding `context` random tokens each, and the
    random new tokens [rows, width] (with their positions) that forwards over it take."""

    model: torch.nn.Module
    cache: object  # decode.cache.RowCache
    new: torch.Tensor
    pos: torch.Tensor


@torch.inference_mode()
def fill_cache(model, rows: int, context: int, width: int, gen: torch.Generator) -> FilledCache:
    """`model`'s prefill of `rows` rows of `context` random tokens into a `RowCache`, through
    the engine's `call_model`."""
    from mcsd_runtime.decode.cache import RowCache
    from mcsd_runtime.decode.graphs import attention, call_model
    from mcsd_runtime.decode.records import causal_bias

    dev, dtype = model.device, model.dtype
    ids = torch.randint(0, model.config.vocab_size, (rows, context + width), generator=gen)
    ids = ids.to(dev)
    cache = RowCache(rows, dev)
    with attention(dev):
        call_model(model, cache, ids[:, :context],
                   torch.arange(context, device=dev)[None].expand(rows, -1),
                   cache.mask(causal_bias(context, dtype, dev)[None], dtype), 1, False)
    cache.appended(context)
    cache.settle([context] * rows)
    pos = torch.arange(context, context + width, device=dev)[None].expand(rows, -1)
    return FilledCache(model, cache, ids[:, context:], pos)


@torch.inference_mode()
def timed_forward(f: FilledCache, width: int, layout=None) -> tuple[float, torch.Tensor]:
    """Seconds and logits [rows, width, V] of one forward over the first `width` new tokens of
    every row of `f` (with a `decode.ragged.Ragged` layout: only its real tokens, packed), as
    the engine runs it (`call_model` over a `RowCache`); the cache is cut back to its context
    after."""
    from mcsd_runtime.decode.graphs import attention, call_model
    from mcsd_runtime.decode.records import causal_bias

    model, cache, dev = f.model, f.cache, f.model.device
    mask = cache.mask(causal_bias(width, model.dtype, dev)[None], model.dtype)
    _sync(dev)
    t0 = time.perf_counter()
    with attention(dev):
        out = call_model(model, cache, f.new[:, :width], f.pos[:, :width], mask, 0, False,
                         ragged=layout)
    _sync(dev)
    dt = time.perf_counter() - t0
    cache.appended(width)
    cache.compact([[] for _ in range(f.new.shape[0])])  # back to the context
    return dt, out.logits


def ragged_job(f: FilledCache, total: int, width: int):
    """A callable timing one ragged forward of `f` carrying `total` tokens (`ragged_counts`
    under `width`) and returning its seconds; each call lays out a fresh `Ragged`, whose index
    is uploaded inside the timed forward, as the engine's is."""
    from mcsd_runtime.decode.ragged import Ragged

    counts = ragged_counts(total, f.new.shape[0], width)
    grid = max(counts)
    return lambda: timed_forward(f, grid, Ragged(counts, grid, f.model.device))[0]


@torch.inference_mode()
def compare_layouts(model, counts: list[int], context: int, rounds: int,
                    seed: int = 0) -> dict:
    """Paired timings of one forward over rows of `counts` new tokens after `context` cached
    tokens a row, padded and ragged (see the module docstring)."""
    from mcsd_runtime.decode.ragged import Ragged

    rows, width = len(counts), max(counts)
    f = fill_cache(model, rows, context, width, torch.Generator().manual_seed(seed))
    layouts = {"padded": None, "ragged": Ragged(counts, width, model.device)}
    times: dict[str, list[float]] = {k: [] for k in layouts}
    logits: dict[str, torch.Tensor] = {}
    for r in range(rounds + 1):  # the first round warms up
        for name in (list(layouts) if r % 2 else list(layouts)[::-1]):
            dt, out = timed_forward(f, width, layouts[name])
            if r:
                times[name].append(dt)
            logits[name] = out.float()
    ratio = paired_speedup(times["ragged"], times["padded"])  # ragged time / padded time
    diff = max(float((logits["ragged"][i, :n] - logits["padded"][i, :n]).abs().max())
               for i, n in enumerate(counts) if n)
    return {"rows": rows, "counts": list(counts), "context": context,
            "tokens": {"padded": rows * width, "ragged": sum(counts)},
            "padded_ms": statistics.median(times["padded"]) * 1e3,
            "ragged_ms": statistics.median(times["ragged"]) * 1e3,
            "ratio": ratio["geomean"], "ci": [ratio["ci_low"], ratio["ci_high"]],
            "max_logit_diff": diff}
