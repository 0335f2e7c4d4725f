"""A `Schedule` (K by batch size) written in a serving engine's own format (`mcsd export`).

- **vLLM** (0.32.0; `vllm/config/speculative.py` `SpeculativeConfig`, checked by
  `vllm/v1/spec_decode/dynamic/utils.py` `validate_and_normalize_dynamic_sd_schedule`):
  `{"num_speculative_tokens_per_batch_size": [[lo, hi, K], ...], "num_speculative_tokens": N}`,
  keys to merge into `--speculative-config` beside `method`. Ranges are inclusive, sorted, the
  first starting at 1; the scheduler uses `min(K, num_speculative_tokens)` and carries the last
  range's K past its end (`build_dynamic_sd_schedule_lookup`), so N is the largest K (at least
  1: the config refuses 0). K=0 is safe: no tokens are drafted, and the drafter's prefill still
  runs, keeping its KV cache current (`vllm/v1/spec_decode/llm_base_proposer.py`).
- **TensorRT-LLM** (`tensorrt_llm/_torch/speculative/utils.py` `get_draft_len_for_batch_size`,
  `tensorrt_llm/llmapi/llm_args.py` `DecodingBaseConfig`): `{"max_draft_len": K1,
  "draft_len_schedule": {hi: K, ...}}` for its speculative config. A key is the largest batch
  size of its band (the first key >= the batch size gives K); above the largest key the length
  is 0; the smallest key's K must equal `max_draft_len` and none may exceed it, so a later band
  above the first band's K is written as K1 (said on stderr). K=0 is written as 1: at 0 the
  one-engine drafters skip their forward and resume from stale state, silently losing
  acceptance (NVIDIA/TensorRT-LLM pull request 16888, which floors it at
  `min_runtime_draft_len` in the releases that have it).
- **SGLang** (`python/sglang/srt/speculative/adaptive_spec_params.py`,
  `adaptive_step_router.py`): the file `--speculative-adaptive-config` reads, `{"lo":
  {"candidate_steps": [K]}, ...}`: one slot per band keyed by its first batch size (a batch
  size, padded up to its CUDA-graph size, takes the slot of the largest key <= it), each with a
  single candidate so its EMA controller has nothing to move. It drives EAGLE/EAGLE3 with
  `--speculative-eagle-topk 1` only. K=0 is safe: drafting stops and the draft extend still
  runs, keeping the draft KV warm (`eagle_worker_v2.py`).

An engine reads one table for all requests, so a schedule's per-category bands are exported one
category at a time (`category`); without one, the pooled bands are written and a note names the
categories. What the JSON cannot carry (vLLM and TensorRT-LLM refuse unknown keys) is returned
as notes for stderr.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import atomic_write_text
from mcsd_runtime.serving.schedule import Band, Schedule, json_text

ENGINES = ("vllm", "trtllm", "sglang")
DEFAULT_MAX_BATCH = 4096  # the end written for an open last band
EAGLE = ("eagle", "eagle3")  # the methods SGLang's adaptive steps drive


@dataclass(frozen=True)
class Exported:
    """An engine's config (`config`, written as JSON) and what to tell the user (`notes`)."""

    engine: str
    config: dict[str, Any]
    notes: tuple[str, ...] = ()


def export_schedule(schedule: Schedule, engine: str, category: str | None = None,
                    max_batch_size: int = DEFAULT_MAX_BATCH) -> Exported:
    """`schedule`'s bands (pooled, or `category`'s) in `engine`'s format (module docstring);
    `max_batch_size` ends an open last band. MCSDError for an unknown engine or category."""
    if engine not in EXPORTERS:
        raise MCSDError(f"unknown engine {engine!r}: export to one of {', '.join(ENGINES)}")
    bands, notes = _pick_bands(schedule, category)
    last = bands[-1]
    if max_batch_size < 1 or (last.hi is None and max_batch_size < last.lo):
        raise MCSDError(f"--max-batch-size {max_batch_size} ends the open last band "
                        f"{last.label} before it starts: pass at least {last.lo} (the engine's "
                        f"largest batch size)")
    exported = EXPORTERS[engine](bands, max_batch_size, schedule.meta)
    return Exported(engine, exported.config, (*notes, *exported.notes))


def _pick_bands(schedule: Schedule, category: str | None) -> tuple[tuple[Band, ...], list[str]]:
    """The bands to export, and the note on the categories left out."""
    known = sorted(schedule.categories)
    if category is not None:
        if category not in schedule.categories:
            have = (f"it has bands for {', '.join(known)}" if known else "it was trained on "
                    "traces without categories")
            raise MCSDError(f"the schedule has no bands for category {category!r} ({have}): "
                            f"pass one of those to --category, or leave it out for the pooled "
                            f"bands")
        return schedule.categories[category], []
    if not known:
        return schedule.bands, []
    return schedule.bands, [f"the schedule also has bands for categories {', '.join(known)}; "
                            f"an engine reads one table, so the pooled bands were written: "
                            f"export a category's with --category C"]


def _closed(bands: Sequence[Band], cap: int) -> list[Band]:
    """`bands` with an open last band ended at `cap`."""
    return [b._replace(hi=cap) if b.hi is None else b for b in bands]


def to_vllm(bands: Sequence[Band], cap: int, meta: Mapping[str, Any]) -> Exported:
    """vLLM's `num_speculative_tokens_per_batch_size` and `num_speculative_tokens`."""
    max_k = max(b.k for b in bands)
    notes = ["merge these keys into your --speculative-config JSON beside \"method\" (and its "
             "\"model\" or \"prompt_lookup_max\"); vLLM refuses unknown keys, so notes stay "
             "out of the file"]
    if max_k == 0:
        notes.append("every band has K=0: serve without --speculative-config instead "
                     "(num_speculative_tokens is written as 1, the least vLLM takes)")
    table = [list(b) for b in _closed(bands, cap)]
    return Exported("vllm", {"num_speculative_tokens_per_batch_size": table,
                             "num_speculative_tokens": max(max_k, 1)}, tuple(notes))


def to_trtllm(bands: Sequence[Band], cap: int, meta: Mapping[str, Any]) -> Exported:
    """TensorRT-LLM's `max_draft_len` and `draft_len_schedule` (K=0 written as 1, later bands
    capped at the first band's K: module docstring)."""
    closed, notes = _closed(bands, cap), []
    zero = [b.label for b in bands if b.k == 0]
    if zero:
        notes.append(f"K=0 at batch sizes {', '.join(zero)} written as 1: at draft length 0 "
                     f"TensorRT-LLM's one-engine drafters skip their forward and resume from "
                     f"stale state, silently losing acceptance (NVIDIA/TensorRT-LLM pull "
                     f"request 16888)")
    ks = [max(b.k, 1) for b in closed]
    over = [b.label for b, k in zip(bands, ks, strict=True) if k > ks[0]]
    if over:
        notes.append(f"K above the first band's {ks[0]} at batch sizes {', '.join(over)} "
                     f"written as {ks[0]}: TensorRT-LLM requires the smallest key's draft length "
                     f"to equal max_draft_len and none to exceed it")
        ks = [min(k, ks[0]) for k in ks]
    notes.append(f"TensorRT-LLM drafts nothing above the largest key ({closed[-1].hi}): keep it "
                 f">= the engine's max_batch_size (--max-batch-size); put both keys under your "
                 f"speculative_config")
    schedule = {str(b.hi): k for b, k in zip(closed, ks, strict=True)}
    return Exported("trtllm", {"max_draft_len": ks[0], "draft_len_schedule": schedule},
                    tuple(notes))


def to_sglang(bands: Sequence[Band], cap: int, meta: Mapping[str, Any]) -> Exported:
    """SGLang's adaptive config: one single-candidate slot per band, keyed by its start."""
    max_k = max(b.k for b in bands)
    notes = [f"serve with --speculative-adaptive --speculative-adaptive-config FILE "
             f"--speculative-eagle-topk 1 --speculative-num-steps {max_k}; SGLang routes a "
             f"batch size padded up to its CUDA-graph size, so bands that start at CUDA-graph "
             f"batch sizes are read as trained"]
    method = str(meta.get("method") or "")
    if method and method.lower() not in EAGLE:
        notes.append(f"this schedule was trained for method {method!r}, but SGLang's adaptive "
                     f"steps drive EAGLE/EAGLE3 only, whose acceptance and step costs differ: "
                     f"train on EAGLE traces for a schedule that fits")
    if bands[-1].hi is not None:
        notes.append(f"SGLang keys a slot by its first batch size, so batch sizes above the last "
                     f"band {bands[-1].label} keep its K={bands[-1].k}")
    config: dict[str, Any] = {str(b.lo): {"candidate_steps": [b.k]} for b in bands}
    config["mcsd_note"] = ("K by batch size from `mcsd export`: one slot per band, each with a "
                           "single candidate step count (SGLang skips keys that are not batch "
                           "sizes)")
    return Exported("sglang", config, tuple(notes))


EXPORTERS: dict[str, Callable[[Sequence[Band], int, Mapping[str, Any]], Exported]] = {
    "vllm": to_vllm, "trtllm": to_trtllm, "sglang": to_sglang}


def write_exported(exported: Exported, path: str | Path) -> Path:
    """Write the engine's config to `path` atomically (a reader never sees half a file);
    MCSDError naming the fix when it cannot be written."""
    path = Path(path)
    if path.is_dir():
        raise MCSDError(f"--out {path} is a folder: pass a file path, e.g. {path / 'k.json'}")
    try:
        atomic_write_text(path, json_text(exported.config))
    except OSError as err:
        raise MCSDError(f"cannot write {path}: {err.strerror or err}; pass a writable --out"
                        ) from None
    return path
