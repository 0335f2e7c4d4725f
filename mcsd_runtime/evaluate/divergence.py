"""How two outputs of one prompt compare token by token: where they first part (and the
target's top-2 logit margin there: a near-tie is float numerics, a wide margin a bug) and the
share of positions where they agree."""

from __future__ import annotations

import torch

from mcsd_runtime.evaluate.record import Record
from mcsd_runtime.models.pair import Pair


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two outputs differ (a token against another, or against the
    end of the shorter one); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def top2_margin(model, ids: list[int]) -> float:
    """The gap between the two largest next-token logits after `ids`: one forward of `model`.
    A float32 near-tie (a gap near 0) lets two exact greedy decoders part ways there."""
    x = torch.tensor([ids], device=model.device)
    logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, -1].double()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def divergence(model, prompt: list[int], tokens: list[int], ref: list[int]) -> dict | None:
    """Where `tokens` first leaves `ref` (both greedy continuations of `prompt`) and the
    target's top-2 logit margin there; None when they are equal."""
    i = first_difference(tokens, ref)
    if i is None:
        return None
    at = [seq[i] if i < len(seq) else None for seq in (tokens, ref)]
    return {"position": i, "token": at[0], "reference_token": at[1],
            "top2_margin": top2_margin(model, prompt + tokens[:i])}


def mark_divergences(pair: Pair, records: list[Record], prompts: dict[str, list[int]]) -> None:
    """Greedy runs: give every lossless record that differs from `hf`'s its `hf_divergence`."""
    hf = {r.prompt_id: r.token_ids for r in records if r.method == "hf"}
    for r in records:
        if r.lossless and r.method != "hf" and r.prompt_id in hf:
            r.hf_divergence = divergence(pair.target, prompts[r.prompt_id], r.token_ids,
                                         hf[r.prompt_id])


def agreement(a: list[int], b: list[int]) -> float:
    """Share of positions (over the longer output) where two outputs carry the same token."""
    n = max(len(a), len(b))
    return sum(x == y for x, y in zip(a, b, strict=False)) / n if n else 1.0
