"""Output quality proxies for evaluation, computed after the timed runs, never inside them.

- **Target NLL per new token**: the target's own negative log-likelihood (nats, at temperature
  1) of each output given its prompt, from one teacher-forced forward over prompt + output.
  Lower means text the target finds likelier. Greedy AR takes the target's likeliest token at
  every step, a low-NLL reference (not the lowest: greedy is not the likeliest sequence). In
  greedy runs a lossless method's outputs equal AR's token for token, and so do their NLLs,
  exactly. Reported per method as the mean over all its new tokens, and against AR as the mean
  over prompts of the per-prompt difference, with a 95% bootstrap CI.
- **Target top-1 share**: the share of new tokens that are the target's most likely token
  after the text before them (the output's own, not AR's). Greedy AR and every lossless method
  in greedy runs score 100% (but for float near-ties); a lossy method's shortfall is how often
  it overrode the target, whatever happened to the text after.
- **Repeated 4-grams**: the share of an output's token 4-grams that already occurred earlier
  in the same output, and the share of outputs where at least half of them do (a repetition
  loop).

Both score the text whatever the decoding temperature: NLL at temperature 1.

What they cannot say: NLL is the target's judgement of the text, not a human's or a task's (a
degenerate loop can have a very low NLL, which is why repetition is reported beside it), and
code and prose repeat 4-grams legitimately (`self.`, indentation), so repetition is read
against AR's on the same prompts, never on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from mcsd_runtime.metrics import mean_ci

NGRAM = 4
LOOP_SHARE = 0.5  # an output with at least this share of repeated 4-grams is in a loop


@torch.inference_mode()
def target_scores(model: torch.nn.Module, prompt: Sequence[int], output: Sequence[int]
                  ) -> tuple[float, float]:
    """(mean NLL in nats per token of `output` under `model` given `prompt`, share of its
    tokens that are the model's top-1 after the text before them): one forward over prompt +
    output; NaNs for an empty output."""
    if not output:
        return float("nan"), float("nan")
    if not prompt:
        raise ValueError("scoring needs a non-empty prompt (the first output token's context)")
    ids = torch.tensor([list(prompt) + list(output)], device=model.device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1].double(), dim=-1)
    out = ids[0, len(prompt):]
    picked = logp.gather(1, out[:, None]).squeeze(1)
    return float(-picked.mean()), float((logp.argmax(-1) == out).double().mean())


def target_nll(model: torch.nn.Module, prompt: Sequence[int], output: Sequence[int]) -> float:
    """Mean NLL (nats) per token of `output` under `model` given `prompt` (`target_scores`)."""
    return target_scores(model, prompt, output)[0]


def repeated_ngram_share(tokens: Sequence[int], n: int = NGRAM) -> float:
    """Share of the output's n-grams (by position) that occurred earlier in it; 0.0 when it has
    none."""
    seen: set[tuple[int, ...]] = set()
    repeated = total = 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        repeated += gram in seen
        seen.add(gram)
        total += 1
    return repeated / total if total else 0.0


def annotate(model: torch.nn.Module, records: list, prompts: dict[str, list[int]]) -> None:
    """Give every record its `target_nll`, `target_top1_share` and `repeat_share` (each
    distinct prompt + output is scored once)."""
    cache: dict[tuple[str, tuple[int, ...]], tuple[float, float]] = {}
    for r in records:
        key = (r.prompt_id, tuple(r.token_ids))
        if key not in cache:
            cache[key] = target_scores(model, prompts[r.prompt_id], r.token_ids)
        r.target_nll, r.target_top1_share = cache[key]
        r.repeat_share = repeated_ngram_share(r.token_ids)


def _weighted(records: list, field: str) -> float | None:
    """The mean of a per-output score over all the outputs' tokens."""
    scored = [(v, len(r.token_ids)) for r in records
              if (v := getattr(r, field, None)) is not None and not math.isnan(v)]
    tokens = sum(n for _, n in scored)
    return sum(v * n for v, n in scored) / tokens if tokens else None


def summary(records: list, ar: list | None) -> dict:
    """A method's quality columns: NLL per new token over all its outputs (token-weighted), its
    difference from `ar`'s on the same prompts, the share of its tokens that are the target's
    top-1 (token-weighted), the mean share of repeated 4-grams and the share of outputs in a
    loop. None where the records carry no scores (e.g. read from an older run)."""
    scored = [r for r in records if getattr(r, "target_nll", None) is not None]
    if not scored:
        return {"target_nll": None, "target_nll_vs_ar": None,
                "ci_target_nll_vs_ar": [None, None], "target_top1_share": None,
                "repeat4_share": None, "loop_share": None}
    ar_nll: dict[str, list[float]] = {}  # a prompt's sampled outputs: their mean
    for r in ar or []:
        if getattr(r, "target_nll", None) is not None:
            ar_nll.setdefault(r.prompt_id, []).append(r.target_nll)
    ar_by_prompt = {p: sum(v) / len(v) for p, v in ar_nll.items()}
    diffs = [r.target_nll - ar_by_prompt[r.prompt_id] for r in scored
             if r.prompt_id in ar_by_prompt and not math.isnan(r.target_nll)
             and not math.isnan(ar_by_prompt[r.prompt_id])]
    delta = mean_ci(diffs)
    shares = [r.repeat_share for r in scored]
    return {"target_nll": _weighted(scored, "target_nll"), "target_nll_vs_ar": delta["mean"],
            "ci_target_nll_vs_ar": [delta["ci_low"], delta["ci_high"]],
            "target_top1_share": _weighted(scored, "target_top1_share"),
            "repeat4_share": sum(shares) / len(shares),
            "loop_share": sum(s >= LOOP_SHARE for s in shares) / len(shares)}
