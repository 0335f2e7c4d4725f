"""What only a GPU exercises, checked on a shaped pair (the GPU check's first call,
`engine_check --exact`); on a CPU each runs too, where it can, so the code is tested there.

- `exact`: captured forwards against eager in fp32: the tokens AR and `static:1` decode, and
  one forward's logits (max absolute difference, argmax agreement).
- `replay`: a replayed CUDA graph's outputs stay as they were when the same graph replays again
  (`decode.graphs.Graph.replay` hands out copies).
- `uploads`: `mcsd_runtime.transfer.upload` returns while the device is still busy (a pinned,
  non-blocking copy), where a plain `torch.tensor(..., device=cuda)` waits for it.
"""

from __future__ import annotations

import time

import torch

from mcsd_runtime.benchmarks import capture_spike
from mcsd_runtime.benchmarks import step_breakdown as sb


def _tokens(pair, method: str, k_config, prompts: list[list[int]], tokens: int,
            graphs: str) -> tuple[list[list[int]], str | None]:
    dec = sb._decoder(pair, method, k_config, tokens, False, graphs)
    out = [dec.generate(ids) for ids in prompts]
    return [r.token_ids for r in out], out[0].stats.forwards


def exact_tokens(pair, k_config, prompts: list[list[int]], tokens: int) -> dict:
    """For AR and `static:1`: whether captured (graphs on) decodes the tokens eager does, the
    share of equal tokens, and which path each ran."""
    out = {}
    for method in ("ar", "static:1"):
        got, path_on = _tokens(pair, method, k_config, prompts, tokens, "on")
        ref, path_off = _tokens(pair, method, k_config, prompts, tokens, "off")
        pairs = [(a, b) for x, y in zip(got, ref, strict=True)
                 for a, b in zip(x, y, strict=False)]
        same = sum(a == b for a, b in pairs) / max(len(pairs), 1)
        out[method] = {"equal": got == ref, "token_agreement": round(same, 4),
                       "path": path_on, "reference_path": path_off}
    return out


def exact_logits(model, context: int, news: tuple[int, ...] = (1, 8)) -> dict:
    """One forward's logits, fixed-shape (captured on CUDA) against eager, at each new-token
    count: the largest absolute difference and whether every argmax agrees."""
    out = {}
    with torch.inference_mode():
        for n in news:
            a = capture_spike.fixed_forward(model, 1, context, n)().float()
            b = capture_spike.eager_forward(model, 1, context, n)().float()
            out[str(n)] = {"max_abs_diff": float((a - b).abs().max()),
                           "argmax_equal": bool(torch.equal(a.argmax(-1), b.argmax(-1)))}
    return out


def replay_keeps_outputs(model, context: int = 32, n: int = 4) -> dict:
    """Two forwards of one shape through `FixedForwards` (the second replays the graph the
    first captured, on CUDA): the first's logits must be unchanged afterwards."""
    from mcsd_runtime.decode.cache import RowCache
    from mcsd_runtime.decode.graphs import FixedForwards

    ctx, new, pos, block = capture_spike._inputs(model, 1, context, n)
    fw = FixedForwards(model.device, capture=model.device.type == "cuda")
    with torch.inference_mode():
        slots, _ = fw.caches(1, context + n)
        prefill = RowCache(1, model.device)
        capture_spike._prefill(model, prefill, ctx)
        prefill.settle([context])
        slots.extend(prefill)
        mask = slots.mask(block[None], model.dtype)
        first = fw(model, slots, new, pos, mask, 0, False).logits
        held = first.clone()
        other = torch.roll(new, 1, dims=1) + 1
        second = fw(model, slots, other % model.config.vocab_size, pos, mask, 0, False).logits
        return {"unchanged": bool(torch.equal(first, held)),
                "second_differs": not bool(torch.equal(first, second)),
                "path": fw.kind, "graphs": len(fw.graphs)}


def _wait_then(fn, cycles: int) -> tuple[float, bool, torch.Tensor]:
    """Queue `cycles` of GPU sleep, then time fn(): (ms on the host, whether the device was
    still busy when fn returned, fn's result)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    t0 = time.perf_counter()
    out = fn()
    ms = (time.perf_counter() - t0) * 1e3
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return ms, busy, out


def uploads(device: torch.device, cycles: int = 200_000_000) -> dict:
    """Whether `upload` returns before the device has finished what was queued before it (a
    pinned, non-blocking copy), against a plain pageable `torch.tensor(..., device=...)`; the
    profiler's name of its copy (`Memcpy HtoD (Pinned -> Device)`)."""
    from mcsd_runtime.transfer import upload

    values = [[i, i + 1] for i in range(64)]
    if device.type != "cuda":
        got = upload(values, device)
        return {"skipped": f"not CUDA ({device.type}): a plain copy",
                "values_equal": got.tolist() == values}
    up_ms, up_busy, got = _wait_then(lambda: upload(values, device), cycles)
    plain_ms, plain_busy, _ = _wait_then(lambda: torch.tensor(values, device=device), cycles)
    out = {"non_blocking": up_busy, "upload_ms": round(up_ms, 3),
           "plain_non_blocking": plain_busy, "plain_ms": round(plain_ms, 3),
           "values_equal": got.tolist() == values}
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            upload(values, device)
            torch.cuda.synchronize()
        out["copies"] = sorted({e.key for e in prof.key_averages() if "Memcpy" in e.key})
        out["pinned"] = any("Pinned" in k for k in out["copies"])
    except Exception as err:  # noqa: BLE001 - the profiler is optional
        out["copies_error"] = f"{type(err).__name__}: {err}"[:300]
    return out
