"""`Record`: one method's output on one prompt, with its counts and timings; every number of
an evaluation's reports is derived from these."""

from __future__ import annotations

from dataclasses import dataclass

from mcsd_runtime import metrics


@dataclass
class Record:
    method: str
    prompt_id: str
    token_ids: list[int]
    new_tokens: int
    wall_time: float
    target_calls: int
    draft_calls: int
    drafted_tokens: int | None  # None: the method does not say (hf-assisted)
    accepted_tokens: int | None
    acceptance_rate: float | None
    lossless: bool
    steps: list[tuple[int, int]]  # (drafted depth, accepted) per step
    forward_time: float = 0.0  # seconds inside model forwards
    # of wall_time: the prompt's forwards before the first step (None: not measured apart).
    # Replay models the rest, so its speeds compare with new_tokens / (wall - prefill)
    prefill_time: float | None = None
    hf_divergence: dict | None = None  # greedy: where the output first leaves `hf`'s
    # batches: the prompts decoded together (`batch_id`) are the unit speed is paired on, and
    # their throughput is the batch's, committed tokens of all rows per decode second
    batch_id: str | None = None
    batch_tokens_per_s: float | None = None
    target_nll: float | None = None  # target NLL per new token (mcsd_runtime.evaluate.quality)
    target_top1_share: float | None = None  # share of new tokens that are the target's top-1
    repeat_share: float | None = None  # share of the output's 4-grams seen earlier in it
    sample: int = 0  # which of a prompt's sampled decodes (`--samples`; seed = --seed + sample)

    @property
    def tokens_per_s(self) -> float:
        if self.batch_tokens_per_s is not None:
            return self.batch_tokens_per_s
        return metrics.throughput(self.new_tokens, self.wall_time)

    @property
    def unit(self) -> str:
        """What speed is paired on: the prompt, or the batch it was decoded in."""
        return self.batch_id or self.prompt_id
