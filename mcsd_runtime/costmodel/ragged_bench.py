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
"""

from __future__ import annotations

import statistics
import time

import torch

from mcsd_runtime.metrics import paired_speedup


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def compare_layouts(model, counts: list[int], context: int, rounds: int,
                    seed: int = 0) -> dict:
    """Paired timings of one forward over rows of `counts` new tokens after `context` cached
    tokens a row, padded and ragged (see the module docstring)."""
    from mcsd_runtime.decode.cache import RowCache
    from mcsd_runtime.decode.graphs import attention, call_model
    from mcsd_runtime.decode.ragged import Ragged
    from mcsd_runtime.decode.state import causal_bias

    dev, dtype, rows, width = model.device, model.dtype, len(counts), max(counts)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (rows, context + width), generator=gen)
    ids = ids.to(dev)
    cache = RowCache(rows, dev)
    with attention(dev):
        call_model(model, cache, ids[:, :context],
                   torch.arange(context, device=dev)[None].expand(rows, -1),
                   cache.mask(causal_bias(context, dtype, dev)[None], dtype), 1, False)
    cache.appended(context)
    cache.settle([context] * rows)
    new, pos = ids[:, context:], torch.arange(context, context + width, device=dev)[None]
    pos = pos.expand(rows, -1)
    block = causal_bias(width, dtype, dev)[None]
    layouts = {"padded": None, "ragged": Ragged(counts, width, dev)}
    times: dict[str, list[float]] = {k: [] for k in layouts}
    logits: dict[str, torch.Tensor] = {}
    for r in range(rounds + 1):  # the first round warms up
        for name in (list(layouts) if r % 2 else list(layouts)[::-1]):
            mask = cache.mask(block, dtype)
            _sync(dev)
            t0 = time.perf_counter()
            with attention(dev):
                out = call_model(model, cache, new, pos, mask, 0, False, ragged=layouts[name])
            _sync(dev)
            if r:
                times[name].append(time.perf_counter() - t0)
            logits[name] = out.logits.float()
            cache.appended(width)
            cache.compact([[] for _ in range(rows)])  # back to the context
    ratio = paired_speedup(times["ragged"], times["padded"])  # ragged time / padded time
    diff = max(float((logits["ragged"][i, :n] - logits["padded"][i, :n]).abs().max())
               for i, n in enumerate(counts) if n)
    return {"rows": rows, "counts": list(counts), "context": context,
            "tokens": {"padded": rows * width, "ragged": sum(counts)},
            "padded_ms": statistics.median(times["padded"]) * 1e3,
            "ragged_ms": statistics.median(times["ragged"]) * 1e3,
            "ratio": ratio["geomean"], "ci": [ratio["ci_low"], ratio["ci_high"]],
            "max_logit_diff": diff}
