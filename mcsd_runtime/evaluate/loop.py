"""The interleaved run: every method on every prompt (or batch of prompts) in one process,
after a warm-up each, in an order that rotates from prompt to prompt so that machine drift
cancels out; then greedy outputs are compared with `hf`'s and every output's quality scored."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from mcsd_runtime.decode.decoder import DecodeConfig
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate import quality
from mcsd_runtime.evaluate.divergence import mark_divergences
from mcsd_runtime.evaluate.methods import check_batch_methods
from mcsd_runtime.evaluate.record import Record
from mcsd_runtime.evaluate.runners import build_method, encode_prompt
from mcsd_runtime.models.pair import Pair

# told about every record as soon as it is decoded (before quality is scored), e.g. the GPU
# check's `eval_stage`, which appends each to a file so that a stopped evaluation keeps it
RECORD_OBSERVERS: list[Callable[[Record], None]] = []


def run_eval(pair: Pair, prompts, methods: list[str], base: DecodeConfig, chat: str = "auto",
             progress: bool = True, batch_size: int = 1, batched: bool = False,
             samples: int = 1) -> list[Record]:
    """Run every method on every prompt (or batch of `batch_size` prompts), interleaved, after
    one warm-up generation each (`batched`: through `generate_batch` even at batch size 1,
    so that speed is over the decode phase as at larger batch sizes); then score every
    output's quality (`mcsd_runtime.evaluate.quality`). `chat`: how prompts reach the model
    (`mcsd_runtime.prompts.chat`: auto, on, off). `samples` > 1 (sampling, one sequence at a
    time): every prompt decoded that many times by every method, seeds `base.seed` onwards."""
    if not prompts:
        raise MCSDError("the prompt set is empty: pass a set or file with at least one prompt")
    check_samples(samples, base.temperature, batch_size, batched)
    check_batch_methods(methods, batch_size)
    runners = [{m: build_method(m, pair, replace(base, seed=base.seed + s)) for m in methods}
               for s in range(samples)]
    encoded = [(p.id, encode_prompt(pair, p, chat)) for p in prompts]
    records = run_runners(pair, runners[0], encoded, greedy=base.temperature == 0,
                          progress=progress, batch_size=batch_size, batched=batched,
                          resampled=runners[1:])
    quality.annotate(pair.target, records, dict(encoded))  # after the timed runs
    return records


def check_samples(samples: int, temperature: float, batch_size: int = 1,
                  batched: bool = False) -> None:
    """Refuse a `--samples` count the run cannot use."""
    if samples < 1:
        raise MCSDError(f"--samples must be at least 1, got {samples}")
    if samples > 1 and temperature == 0:
        raise MCSDError("--samples > 1 needs --temperature > 0: a greedy output is the same "
                        "every time")
    if samples > 1 and (batched or batch_size > 1):
        raise MCSDError("--samples > 1 decodes one sequence at a time: drop --batch-size")


def run_runners(pair: Pair, runners: dict, encoded: list[tuple[str, list[int]]], greedy: bool,
                progress: bool = True, desc: str = "eval", batch_size: int = 1,
                batched: bool = False, resampled: list[dict] | tuple = ()) -> list[Record]:
    """Runners (name -> `.generate(ids) -> Record`) on encoded prompts: one warm-up each, then
    prompt by prompt in a rotating order; greedy records are then compared with `hf`'s. With
    `batch_size` > 1 (or `batched`), consecutive prompts are decoded `batch_size` at a time by
    every runner's `generate_batch`, batch by batch in a rotating order, each record carrying
    its batch's id. `resampled`: the same methods under other seeds, each decoding every prompt
    again right after `runners` (records numbered by `sample`)."""
    from mcsd_runtime.progress import progress as progress_bar

    batched = batched or batch_size > 1
    size = batch_size if batched else 1
    batches = [encoded[i : i + size] for i in range(0, len(encoded), size)]
    for runner in runners.values():  # warm-up
        _decode(runner, batches[0], batched)
    records: list[Record] = []
    names = list(runners)
    with progress_bar(total=len(encoded), unit="prompt", disable=not progress,
                      desc=f"{desc} (batch size {batch_size})" if batched else desc) as bar:
        for i, batch in enumerate(batches):
            for sample, by_name in enumerate([runners, *resampled]):
                for name in names[i % len(names):] + names[: i % len(names)]:
                    for (pid, _), rec in zip(batch, _decode(by_name[name], batch, batched),
                                             strict=True):
                        rec.method, rec.prompt_id, rec.sample = name, pid, sample
                        rec.batch_id = f"batch{i:04d}" if batched else None
                        records.append(rec)
                        for observer in RECORD_OBSERVERS:
                            observer(rec)
            bar.set_postfix_str(f"{sum(r.new_tokens for r in records)} tokens")
            bar.update(len(batch))
    if greedy:
        mark_divergences(pair, records, dict(encoded))
    return records


def _decode(runner, batch: list[tuple[str, list[int]]], batched: bool) -> list[Record]:
    """A runner's records of one batch: through `generate_batch`, or `generate` (one prompt)."""
    prompts = [ids for _, ids in batch]
    return runner.generate_batch(prompts) if batched else [runner.generate(prompts[0])]
