"""`mcsd profile --engine vllm`: what one vLLM step costs with C requests in flight, each drafting
K tokens, measured in the engine (`EngineProfile`, which `mcsd train --decision schedule`
prices its replay with).

A step's cost hangs on how many tokens it verifies (C x (1 + K)), not on how many are accepted.
So one engine runs vLLM's custom proposer class `FixedDraftProposer`, which drafts exactly K
tokens for every request at every step (a token next to the request's last one, repeated: the
target seldom accepts it, so runs stay many steps long). K is read from a file the profiler
rewrites between runs, so one engine serves every K, and K = 0 is the speculative engine
drafting nothing, as a schedule's K = 0 band runs. For each (C, K) the same C prompts are decoded
twice, to a third of `long` and to `long` new tokens, and a step costs the difference of the
wall times over the difference of the steps (every request's steps counted from vLLM's own
per-request metrics): the prompts' prefills cancel out. Points out of line with their
neighbours (a step cheaper at more requests or more drafted tokens) are timed twice more and
keep the median of the three: load on the machine can push a difference of wall times either
way. A second engine, started without speculation, gives the `plain` step time at each
concurrency: what serving with speculation turned off costs, which a K = 0 band does not reach
(the speculative path still runs every step).

The proposer's own cost (the n-gram matcher's, a draft model's) is not in these figures: on a
CPU vLLM's n-gram matcher costs microseconds a request; a draft model would need its own
profile.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.serving.engine_profile import EngineProfile, ProfilePoint
from mcsd_runtime.serving.vllm_engine import (
    EngineConfig,
    decode_wave,
    in_process_default,
    require_vllm,
    sampling_params,
    start_engine,
    stop_engine,
)

FIXED_CLASS = "mcsd_runtime.serving.vllm_profile.FixedDraftProposer"
K_FILE_ENV = "MCSD_VLLM_FIXED_K_FILE"  # the file holding the K the proposer drafts


class FixedDraftProposer:
    """vLLM's custom proposer class drafting exactly K tokens per request and step (see the
    module doc); K is read from the file named by `MCSD_VLLM_FIXED_K_FILE` at every step."""

    def __init__(self, vllm_config: Any) -> None:
        path = os.environ.get(K_FILE_ENV)
        if not path:
            raise MCSDError(f"set {K_FILE_ENV} to a file holding K (mcsd profile --engine vllm "
                            f"does)")
        self.path = Path(path)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        k = int(self.path.read_text() or 0)
        return [[_other(ids[-1])] * k if ids else [] for ids in sampled_token_ids]

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load."""


def _other(token: int) -> int:
    """A token id other than `token`, inside any vocabulary: drafts the target seldom accepts,
    so that a run's steps, and the figure's precision, stay many."""
    return token - 1 if token > 0 else 1


def _steps(outputs: list) -> int:
    """The wave's engine steps: its longest request's (requests run in lockstep)."""
    return max(c.steps for c in outputs)


def time_point(llm: Any, prompts: list[list[int]], short: int, long: int,
               repeats: int = 2) -> tuple[float, int]:
    """(seconds per step, steps measured) of decoding `prompts` together: the best of
    `repeats` wall-time differences between `long` and `short` new tokens."""
    best, steps = float("inf"), 0
    for _ in range(repeats):
        runs = []
        for n in (short, long):
            outputs, wall = decode_wave(llm, prompts, sampling_params(0, n, True, 0))
            runs.append((wall, _steps(outputs)))
        (w1, s1), (w2, s2) = runs
        if s2 <= s1:
            raise MCSDError(f"profiling: {long} new tokens took no more steps than {short}; "
                            f"raise --max-new-tokens")
        if (w2 - w1) / (s2 - s1) < best:
            best, steps = (w2 - w1) / (s2 - s1), s2 - s1
    return max(best, 1e-6), steps


def measure(model: str, dtype: str, ks: Sequence[int], concurrencies: Sequence[int],
            prompts: list[list[int]], long: int = 48, in_process: bool | None = None,
            method: str = "ngram", plain: bool = True,
            log: Callable[[str], None] = print) -> EngineProfile:
    """The engine profile of `model` at every (concurrency, K), and (`plain`) of the engine
    without speculation at every concurrency; `prompts` are cycled to fill the largest
    concurrency. Points out of line with their neighbours are timed again (`suspects`)."""
    vllm = require_vllm()
    if min(ks) < 0 or not concurrencies or min(concurrencies) < 1:
        raise MCSDError("profiling: K must be >= 0 and concurrency >= 1")
    waves = {c: [prompts[i % len(prompts)] for i in range(c)] for c in sorted(concurrencies)}
    in_process = in_process_default() if in_process is None else in_process
    with tempfile.TemporaryDirectory() as tmp:
        k_file = Path(tmp) / "k"
        k_file.write_text("0")
        spec = {"method": "custom_class", "model": FIXED_CLASS,
                "num_speculative_tokens": max(max(ks), 1)}
        config = EngineConfig(model, dtype, spec, max_num_seqs=max(concurrencies),
                              in_process=in_process, env={K_FILE_ENV: str(k_file)})

        def timed(c: int, k: int, llm: Any, repeats: int = 2) -> ProfilePoint:
            k_file.write_text(str(k))
            step, n = time_point(llm, waves[c], max(long // 3, 2), long, repeats)
            log(f"concurrency {c}, K={k}: {step * 1e3:.2f} ms a step")
            return ProfilePoint(c, k, step, n)

        with _engine(config, log) as llm:
            points = {(c, k): timed(c, k, llm) for c in waves for k in sorted(set(ks))}
            for c, k in suspects(points):
                log(f"concurrency {c}, K={k} is out of line with its neighbours: timing it "
                    f"twice more")
                runs = [points[(c, k)], timed(c, k, llm), timed(c, k, llm)]
                points[(c, k)] = sorted(runs, key=lambda p: p.step_seconds)[1]  # the median
    plain_points: list[ProfilePoint] = []
    if plain:
        with _engine(EngineConfig(model, dtype, None, max_num_seqs=max(concurrencies),
                                  in_process=in_process), log, "vLLM without speculation") as llm:
            for c in waves:
                step, n = time_point(llm, waves[c], max(long // 3, 2), long)
                log(f"concurrency {c}, no speculation: {step * 1e3:.2f} ms a step")
                plain_points.append(ProfilePoint(c, 0, step, n))
    return EngineProfile("vllm", vllm.__version__, model, dtype, method,
                         tuple(points.values()), tuple(plain_points))


@contextmanager
def _engine(config: EngineConfig, log: Callable[[str], None], name: str = "vLLM"
            ) -> Iterator[Any]:
    """A started, warmed-up engine, stopped on the way out."""
    llm, seconds = start_engine(config)
    log(f"started {name} in {seconds:.1f} s")
    try:
        decode_wave(llm, [[1, 2, 3]], sampling_params(0, 4, True, 0))  # warm-up
        yield llm
    finally:
        stop_engine(llm)


def suspects(points: dict[tuple[int, int], ProfilePoint], slack: float = 0.15
             ) -> list[tuple[int, int]]:
    """The (concurrency, K) whose step time breaks the order a step's cost follows, by more
    than `slack`: above the next point's in concurrency or in K (more tokens verified, never
    cheaper), or below the previous point's. Both ends of a broken pair are listed."""
    out: set[tuple[int, int]] = set()
    cs, ks = sorted({c for c, _ in points}), sorted({k for _, k in points})
    for (c, k), p in points.items():
        nexts = [(c2, k) for c2 in cs if c2 > c][:1] + [(c, k2) for k2 in ks if k2 > k][:1]
        for key in nexts:
            if key in points and p.step_seconds > points[key].step_seconds * (1 + slack):
                out |= {(c, k), key}
    return sorted(out)
