"""Measuring a cost profile (`pricing.profile.CostProfile`) on this machine, the way the
decoder runs.

`measure` times each model's forward over B rows of n new tokens, for every token count and
batch size: (model, B, n) jobs are timed in a random order, round after round (so slow spells of a
shared machine spread over all counts instead of bending the curve) and each count's median is
kept as it is: a forward over more tokens can cost less (a matrix kernel's blocking: SmolLM2-135M
in fp32 on one AMD EPYC core takes 148 ms for 3 new tokens and 130 ms for 4), and a curve forced
to rise would mis-price exactly the depths where that happens.
At every B > 1, when both models run ragged forwards (`decode.ragged.supports_ragged`), it also
times packed forwards carrying T tokens in all over the B rows (`ragged_bench.ragged_counts`,
no row wider than W: the largest token count, or less where asked, e.g. the widest target
forward of the tree replays price) at a few totals (`ragged_bench.ragged_totals`: the draft's
from 1, the target's from B, one token a row, up to the padded grid's B x W), as the engine
runs them (`ragged_bench.timed_forward`: `call_model` over a `RowCache`,
eager, timed with the packing), shuffled into the same rounds as the padded jobs; their medians
are the profile's `ragged` points.
`static_runs` then decodes AR and every static depth of a k-config end to end, interleaved per
prompt (at B > 1: per batch of prompts, `MCSDDecoder.generate_batch`), greedy or sampled at the
temperature replays will price (sampling costs a step more than an argmax, and a drafted step
more than AR's; on an accelerator after decoding every prompt once untimed, so that no timed
forward is a shape's first use), and `calibrate` replaces the
isolated forwards' latencies by the ones timed there and fits the decoder's per-step and
per-depth overheads to those runs by least squares (`fit_overheads`); the runs' tokens/s are
kept under the profile's `static`.
Every forward is timed by one helper, `ForwardTimer` (module hooks on both models, and the
fixed-shape path's graph replays, which run no hook).
"""

from __future__ import annotations

import functools
import random
import statistics
import time
from dataclasses import replace

from mcsd_runtime import metrics
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import BatchCosts, CostProfile, RaggedCosts

DEFAULT_TOKENS = (*range(1, 17), 20, 24, 28, 32, 40, 48, 56, 64)
DEFAULT_BATCH_SIZES = (1,)

Forwards = dict[tuple[str, int], list[float]]  # (model or "draft_first", new tokens) -> seconds


class ForwardTimer:
    """Times every forward of a pair's two models through module hooks, as (model, rows, new
    tokens per row, seconds), synchronizing a GPU around each; leaves out prefills (a forward
    into an empty cache: the prompt's, for the rows a batch admits). Use:
    `with ForwardTimer(pair) as log: ...`; the hooks are removed on leaving."""

    def __init__(self, pair) -> None:
        self.pair, self.log, self._handles = pair, [], []
        self._t0, self._prefill = 0.0, False

    def __enter__(self) -> list[tuple[str, int, int, float]]:
        from mcsd_runtime.decode.graphs import REPLAY_OBSERVERS

        REPLAY_OBSERVERS.append(self)  # a captured forward's replay runs no module hook
        for name, model in (("target", self.pair.target), ("draft", self.pair.draft)):
            self._handles.append(model.register_forward_pre_hook(self._start, with_kwargs=True))
            self._handles.append(model.register_forward_hook(
                lambda m, args, kwargs, out, name=name: self._stop(name, kwargs),
                with_kwargs=True))
        return self.log

    def __exit__(self, *exc) -> None:
        from mcsd_runtime.decode.graphs import REPLAY_OBSERVERS

        REPLAY_OBSERVERS.remove(self)
        for h in self._handles:
            h.remove()
        self._handles = []

    def replay_started(self, model, ids, cache) -> None:
        self._start(model, (), {"cache": cache.cache})

    def replay_done(self, model, ids) -> None:
        name = "target" if model is self.pair.target else "draft"
        self._stop(name, {"input_ids": ids})

    def _sync(self) -> None:
        if self.pair.device.type == "cuda":
            import torch

            torch.cuda.synchronize()

    def _start(self, module, args, kwargs) -> None:
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        self._prefill = cache is None or not cache.get_seq_length()
        self._sync()
        self._t0 = time.perf_counter()

    def _stop(self, name: str, kwargs: dict) -> None:
        self._sync()
        dt = time.perf_counter() - self._t0
        if not self._prefill:
            rows, n = kwargs["input_ids"].shape
            self.log.append((name, rows, n, dt))


def measure(pair, tokens=DEFAULT_TOKENS, context: int = 256, rounds: int = 7,
            seed: int = 0, progress: bool = False,
            batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
            ragged_width: int | None = None) -> CostProfile:
    """Median forward latency of each model over B rows of `n` new tokens each, on a cache of
    `context` tokens per row, with the decoder's 4D additive mask (one per row) and position ids
    per row, for every B of `batch_sizes` (1 is always measured), and of ragged forwards at
    every B > 1 where the pair runs them, no row wider than `ragged_width` (None: the largest
    of `tokens`; see the module docstring); jobs in a fresh random order every round
    (`progress`: report rounds on stderr, see mcsd_runtime.progress)."""
    import torch

    sizes = sorted({1, *(int(b) for b in batch_sizes)})
    if sizes[0] < 1:
        raise MCSDError(f"batch sizes must be positive, got {batch_sizes}")
    context = max(1, min(context, pair.max_positions - max(tokens)))
    gen = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        caches = _context_caches(pair, sizes, context, gen)
        width = max(1, min(ragged_width or max(tokens), max(tokens)))
        ragged = _ragged_jobs(pair, sizes[1:], width, context, gen)
        samples = _time_forwards(pair, caches, sizes, tokens, context, rounds, gen,
                                 random.Random(seed), progress, ragged)
    curve = {(name, b): [statistics.median(samples[(name, b, n)]) for n in tokens]
             for name in ("target", "draft") for b in sizes}
    batches = {b: BatchCosts(target_s=curve[("target", b)], draft_s=curve[("draft", b)])
               for b in sizes[1:]}
    return CostProfile(tokens=list(tokens), target_s=curve[("target", 1)],
                       draft_s=curve[("draft", 1)], context=context, device=str(pair.device),
                       threads=torch.get_num_threads(), batches=batches,
                       ragged=_ragged_points(samples, width),
                       dtype=str(pair.dtype).replace("torch.", ""), pair=dict(pair.fingerprint))


def runs_ragged(pair) -> bool:
    """Whether both models of `pair` run ragged forwards (`decode.ragged.supports_ragged`)."""
    from mcsd_runtime.decode.ragged import supports_ragged

    return supports_ragged(pair.target) and supports_ragged(pair.draft)


def _ragged_jobs(pair, sizes: list[int], width: int, context: int, gen) -> dict:
    """("ragged", model, B, T) -> a callable timing one packed forward carrying T tokens over
    B rows of a cache of `context` tokens a row (`ragged_bench.ragged_job`), for every B of
    `sizes` (all above 1) and T of `ragged_bench.ragged_totals` (the target's from B, one
    token a row); none where the pair does not run ragged forwards."""
    if not sizes or not runs_ragged(pair):
        return {}
    from mcsd_runtime.benchmarks.ragged_bench import fill_cache, ragged_job, ragged_totals

    jobs = {}
    for b in sizes:
        for name, model in (("target", pair.target), ("draft", pair.draft)):
            f = fill_cache(model, b, context, width, gen)
            for t in ragged_totals(b, width, least=b if name == "target" else 1):
                jobs[("ragged", name, b, t)] = ragged_job(f, t, width)
    return jobs


def _ragged_points(samples: dict, width: int) -> dict[int, RaggedCosts]:
    """B -> the medians of the ragged jobs' samples as [T, seconds] points, rows at most
    `width` wide."""
    points: dict[int, dict[str, list]] = {}
    for key, secs in samples.items():
        if key[0] == "ragged":
            _, name, b, t = key
            points.setdefault(b, {"target": [], "draft": []})[name].append(
                [t, statistics.median(secs)])
    return {b: RaggedCosts(target=sorted(p["target"]), draft=sorted(p["draft"]), width=width)
            for b, p in sorted(points.items())}


def _context_caches(pair, sizes: list[int], context: int, gen) -> dict:
    """(model, B) -> a KV cache of `context` random tokens in each of B rows."""
    import torch
    from transformers import DynamicCache

    from mcsd_runtime.backend.compat import cache_kwargs

    caches = {}
    for b in sizes:
        ctx_ids = torch.randint(0, pair.vocab_size, (b, context), generator=gen).to(pair.device)
        for name, model in (("target", pair.target), ("draft", pair.draft)):
            caches[(name, b)] = DynamicCache()
            model(input_ids=ctx_ids, **cache_kwargs(model, caches[(name, b)]), use_cache=True,
                  logits_to_keep=1)
    return caches


def _time_forwards(pair, caches: dict, sizes: list[int], tokens, context: int, rounds: int,
                   gen, order: random.Random, progress: bool, extra: dict | None = None) -> dict:
    """(model, B, n) -> `rounds` seconds of forwards over B rows of `n` random new tokens on
    `caches[(model, B)]` (cut back after each), and each key of `extra` -> `rounds` seconds its
    callable returns, after a warm-up round; jobs shuffled by `order` every round."""
    from mcsd_runtime.decode.decoder import causal_bias
    from mcsd_runtime.progress import progress as progress_bar

    block = causal_bias(max(tokens), pair.dtype, pair.device)
    models = {"target": pair.target, "draft": pair.draft}
    with ForwardTimer(pair) as log:
        run = {(name, b, n): functools.partial(
            _padded_forward, models[name], caches[(name, b)], (b, n), context, pair.vocab_size,
            block, gen, log)
            for name in models for b in sizes for n in tokens}
        run |= extra or {}
        samples = {key: [] for key in run}
        jobs = list(run)
        for r in progress_bar(range(rounds + 1), desc="profile", unit="round",
                              disable=not progress):  # round 0 warms up
            order.shuffle(jobs)
            for key in jobs:
                dt = run[key]()
                if r:
                    samples[key].append(dt)
    return samples


def _padded_forward(model, cache, shape: tuple[int, int], context: int, vocab: int, block,
                    gen, log: list) -> float:
    """Seconds (`ForwardTimer`'s, from `log`) of `model`'s forward over `shape` = (B rows, n)
    random new tokens (of `vocab`) on `cache` of `context` tokens a row, cut back after."""
    import torch

    from mcsd_runtime.backend.compat import cache_kwargs

    (b, n), dev, dtype = shape, block.device, block.dtype
    ids = torch.randint(0, vocab, (b, n), generator=gen).to(dev)
    pos = torch.arange(context, context + n, device=dev)[None].expand(b, n)
    mask = torch.cat([torch.zeros(n, context, dtype=dtype, device=dev),
                      block[:n, :n]], -1)[None, None].expand(b, 1, n, context + n)
    model(input_ids=ids, position_ids=pos, attention_mask=mask,
          **cache_kwargs(model, cache), use_cache=True)
    cache.crop(-n)  # transformers 5: a negative count removes tokens
    return log[-1][3]


def static_runs(pair, prompts: list[list[int]], k_config, max_new_tokens: int = 48,
                seed: int = 0, progress: bool = False, batch_size: int = 1,
                temperature: float = 0.0, widths: bool = False,
                graphs: str = "auto") -> tuple[list[dict], Forwards]:
    """AR (depth 0) and every static depth 1..D of `k_config` end to end at `temperature`, after
    a warm-up (`_warm_up`). At batch size 1 each prompt alone, depths in a fresh random order per
    prompt; above it all `prompts` through `MCSDDecoder.generate_batch` once per depth, in a random
    order. Returns the runs (depth, steps, drafted depths, tokens, decode seconds after the
    prefill, seconds inside forwards then) and every forward's seconds by (model, new tokens per
    row): forwards timed by `ForwardTimer` as the decoder runs them, a step's first draft
    forward (right after a target forward) apart as `draft_first`; above batch size 1 only
    forwards over `batch_size` rows. `widths` (batch size 1): also depth 1 at every narrower
    first depth w < k (run "width" w), so that the forwards a learned width verifies (2..k
    tokens) are timed in the decoder too: an isolated forward's cost differs from the decoder's
    by more than the gap between neighbouring counts. `graphs` is DecodeConfig.graphs."""
    from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
    from mcsd_runtime.progress import progress as progress_bar

    depth = len(k_config)
    config = DecodeConfig(k_config=k_config, max_new_tokens=max_new_tokens,
                          temperature=temperature, seed=seed, graphs=graphs)
    decs = {0: ARDecoder(pair, config)}
    decs |= {d: MCSDDecoder(pair, config, stopper=f"static:{d}") for d in range(1, depth + 1)}
    order = random.Random(seed)
    if batch_size > 1:
        return _static_batch_runs(pair, decs, prompts, batch_size, order, progress)
    if widths:
        decs |= {(1, w): MCSDDecoder(pair, replace(config, k_config=(w,)), stopper="static:1")
                 for w in range(1, config.k_config[0])}
    _warm_up(pair, decs, prompts, depth)
    runs, forwards = [], {}
    for i, ids in enumerate(progress_bar(prompts, desc="static runs", unit="prompt",
                                         disable=not progress)):
        depths = list(decs)
        order.shuffle(depths)
        for d in depths:
            with ForwardTimer(pair) as log:
                r = decs[d].generate(ids)
            _add_forwards(forwards, log, rows=1)
            runs.append({"prompt": i, "depth": d[0] if isinstance(d, tuple) else d,
                         **({"width": d[1]} if isinstance(d, tuple) else {}),
                         "steps": len(r.steps),
                         "drafted": sum(s.drafted for s in r.steps),
                         "tokens": r.stats.new_tokens, "decode_s": r.stats.decode_time,
                         "forward_s": sum(x[3] for x in log)})
    return runs, forwards


def _warm_up(pair, decs: dict, prompts: list[list[int]], deepest, batch_size: int = 1) -> None:
    """Decode untimed before the timed runs. On a CPU the deepest decoder decodes one prompt
    (or batch): first-call costs. On an accelerator every decoder decodes every prompt first: a
    forward's first use of a shape costs there far more than its later uses (the cuDNN attention
    backend builds an execution plan for each query and key length, tens of ms; a captured
    path captures a graph per shape bucket), a long decode pays each once, and the timed runs
    would otherwise meet a new shape at nearly every step (`step_breakdown`'s docstring)."""
    if pair.device.type == "cpu":
        todo = [(decs[deepest], prompts[:batch_size])]
    else:
        todo = [(dec, prompts) for dec in decs.values()]
    for dec, ids in todo:
        if batch_size > 1:
            dec.generate_batch(ids, batch_size=batch_size)
        else:
            for one in ids:
                dec.generate(one)


def _static_batch_runs(pair, decs: dict, prompts: list[list[int]], batch_size: int, order,
                       progress: bool) -> tuple[list[dict], Forwards]:
    """`static_runs` above batch size 1: each static depth decodes all prompts once with
    `generate_batch`, depths in a random order after a warm-up (`_warm_up`)."""
    from mcsd_runtime.progress import progress as progress_bar

    _warm_up(pair, decs, prompts, max(decs), batch_size)
    depths = list(decs)
    order.shuffle(depths)
    runs, forwards = [], {}
    for d in progress_bar(depths, desc=f"static runs at batch size {batch_size}", unit="depth",
                          disable=not progress):
        with ForwardTimer(pair) as log:
            st = decs[d].generate_batch(prompts, batch_size=batch_size).stats
        _add_forwards(forwards, log, rows=batch_size)
        # a drafting step of the batch runs one draft forward per depth it drafts
        runs.append({"prompt": 0, "depth": d, "steps": st.target_calls,
                     "drafted": st.draft_calls, "tokens": st.new_tokens,
                     "decode_s": st.decode_time, "forward_s": sum(x[3] for x in log)})
    return runs, forwards


def _add_forwards(forwards: Forwards, log: list[tuple[str, int, int, float]], rows: int) -> None:
    """Add a run's `ForwardTimer` log to `forwards` by (kind, new tokens), kind "draft_first"
    for a draft forward right after a target forward (the first logged forward follows the
    prefill: a first draft too); only forwards over `rows` rows."""
    prev = "target"
    for name, r, n, dt in log:
        kind = "draft_first" if name == "draft" and prev == "target" else name
        if r == rows:
            forwards.setdefault((kind, n), []).append(dt)
        prev = name


def calibrate(profile: CostProfile, runs: list[dict], forwards: Forwards,
              min_samples: int = 5, batch_size: int = 1) -> CostProfile:
    """`profile` with batch size `batch_size`'s forward latencies replaced by the ones the
    decoder itself measured (medians, where a token count was seen `min_samples` times) and its
    per-step and per-depth overheads fitted to those runs."""
    own = profile if batch_size == 1 else profile.batches[batch_size]
    curves = {"target": list(own.target_s), "draft": list(own.draft_s),
              "draft_first": list(own.draft_s)}
    for (name, n), samples in forwards.items():
        if n in profile.tokens and len(samples) >= min_samples:
            curves[name][profile.tokens.index(n)] = statistics.median(samples)
    step, depth = fit_overheads(runs)
    fitted = dict(target_s=curves["target"], draft_s=curves["draft"],
                  draft_first_s=curves["draft_first"], step_overhead_s=step,
                  depth_overhead_s=depth, static={"tokens_per_s": static_throughput(runs)})
    if batch_size == 1:
        return replace(profile, **fitted)
    return replace(profile, batches=profile.batches | {batch_size: BatchCosts(**fitted)})


def fit_overheads(runs: list[dict]) -> tuple[float, float]:
    """Per-step and per-drafted-depth seconds outside forwards in decode time (both >= 0,
    least squares): the decoder's own work."""
    import numpy as np
    from scipy.optimize import nnls

    a = np.array([[r["steps"], r["drafted"]] for r in runs], dtype=float)
    b = np.array([r["decode_s"] - r["forward_s"] for r in runs])
    coef, _ = nnls(a, b)
    return float(coef[0]), float(coef[1])


def static_throughput(runs: list[dict]) -> dict[str, float]:
    """Decode-phase tokens/s of AR, each static depth and each narrower first depth over all
    prompts of `static_runs`."""
    out = {}
    for d, w in sorted({(r["depth"], r.get("width", 0)) for r in runs}):
        sel = [r for r in runs if r["depth"] == d and r.get("width", 0) == w]
        name = (f"static:{d}" if d else "ar") + (f" width {w}" if w else "")
        out[name] = metrics.throughput(sum(r["tokens"] for r in sel),
                                       sum(r["decode_s"] for r in sel))
    return out
