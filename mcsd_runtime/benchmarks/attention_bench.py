"""How much a verification forward costs under two attention implementations, interleaved.

`mcsd attention-bench --target smollm2 --draft DRAFT` (`mcsd_runtime.cli.attention_bench`) times
the target's forward over n new tokens under a 4D mask (the shape of a tree verification) after
a cache of L tokens, for every L of `--context` and n of `--tokens`, alternating the
implementations call by call (A B, then B A, ...) on the same model and cache, so a slow spell
of a shared machine falls on both. It prints each implementation's median milliseconds and the
geometric mean of the paired ratios (first implementation / second) with a 95% bootstrap
interval (`metrics.paired_speedup`), and
the largest difference between their logits. The default pair of implementations is the
decoder's `mcsd_sdpa` against transformers' `sdpa`.
"""

from __future__ import annotations

import statistics
import time

import torch

from mcsd_runtime.metrics import paired_speedup


def chain_mask(context: int, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[1, 1, n, context + n]: every new token sees the cache and the new tokens up to itself."""
    from mcsd_runtime.decode.records import causal_bias

    mask = torch.zeros(1, 1, n, context + n, dtype=dtype, device=device)
    mask[0, 0, :, context:] = causal_bias(n, dtype, device)
    return mask


@torch.inference_mode()
def compare(model, implementations: tuple[str, str], context: int, n: int, reps: int,
            seed: int = 0) -> dict:
    """Paired timings of `model`'s forward over `n` new tokens after `context` cached ones."""
    from transformers import DynamicCache

    from mcsd_runtime.backend.compat import cache_kwargs

    gen = torch.Generator().manual_seed(seed)
    vocab, dev = model.config.vocab_size, model.device
    cache = DynamicCache(config=model.config)
    prompt = torch.randint(0, vocab, (1, context), generator=gen).to(dev)
    model(input_ids=prompt, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)
    new = torch.randint(0, vocab, (1, n), generator=gen).to(dev)
    pos = torch.arange(context, context + n, device=dev)[None]
    mask = chain_mask(context, n, model.dtype, dev)
    before = model.config._attn_implementation
    times: dict[str, list[float]] = {i: [] for i in implementations}
    logits: dict[str, torch.Tensor] = {}
    try:
        for r in range(reps + 1):  # the first round warms up
            for impl in implementations if r % 2 else implementations[::-1]:
                model.config._attn_implementation = impl
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model(input_ids=new, position_ids=pos, attention_mask=mask,
                            **cache_kwargs(model, cache), use_cache=True, logits_to_keep=n)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                if r:
                    times[impl].append(time.perf_counter() - t0)
                logits[impl] = out.logits.float()
                cache.crop(-n)
    finally:
        model.config._attn_implementation = before
    a, b = implementations
    ratio = paired_speedup(times[a], times[b])  # time a / time b, call by call
    return {"context": context, "tokens": n, a: statistics.median(times[a]) * 1e3,
            b: statistics.median(times[b]) * 1e3, "ratio": ratio["geomean"],
            "ci": [ratio["ci_low"], ratio["ci_high"]],
            "max_logit_diff": float((logits[a] - logits[b]).abs().max())}
