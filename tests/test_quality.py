"""Quality proxies of evaluated outputs: the target's NLL per new token and repeated 4-grams."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from mcsd_runtime.evaluate import quality
from mcsd_runtime.evaluate.quality import (
    annotate,
    repeated_ngram_share,
    summary,
    target_nll,
    target_scores,
)


def test_target_nll_is_the_teacher_forced_loss_of_the_output_only(pair):
    prompt, output = [3, 9, 4, 1], [7, 7, 2, 5, 11]
    ids = torch.tensor([prompt + output])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100  # the prompt's tokens are context, not scored
    with torch.no_grad():
        loss = pair.target(input_ids=ids, labels=labels).loss
    assert target_nll(pair.target, prompt, output) == pytest.approx(float(loss), abs=1e-6)
    # scored token by token: the same number
    with torch.no_grad():
        logp = torch.log_softmax(pair.target(input_ids=ids).logits[0].double(), -1)
    by_hand = -sum(float(logp[len(prompt) + i - 1, t]) for i, t in enumerate(output)) / 5
    assert target_nll(pair.target, prompt, output) == pytest.approx(by_hand, abs=1e-12)
    assert target_nll(pair.target, prompt, output[:2]) != target_nll(pair.target, prompt, output)
    assert math.isnan(target_nll(pair.target, prompt, []))
    with pytest.raises(ValueError, match="non-empty prompt"):
        target_nll(pair.target, [], output)


def test_greedy_output_is_likelier_than_a_perturbed_one(pair):
    """The target's own greedy continuation scores lower NLL than the same one with a token
    swapped for the target's least likely token there, and every one of its tokens is the
    target's top-1; the perturbed one overrides the target once (its later tokens are scored
    after the swapped one, so they may or may not be top-1 there)."""
    from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig

    prompt = [5, 1, 8, 2]
    out = ARDecoder(pair, DecodeConfig(max_new_tokens=8)).generate(prompt).token_ids
    with torch.no_grad():
        logits = pair.target(input_ids=torch.tensor([prompt + out[:3]])).logits[0, -1]
    worse = out[:3] + [int(logits.argmin())] + out[4:]
    assert target_nll(pair.target, prompt, out) < target_nll(pair.target, prompt, worse)
    assert target_scores(pair.target, prompt, out)[1] == 1.0
    assert target_scores(pair.target, prompt, worse)[1] <= 7 / 8
    assert target_scores(pair.target, prompt, out[:3] + [int(logits.argmin())])[1] == 3 / 4


@pytest.mark.parametrize(("tokens", "share"), [
    ([1, 2, 3, 4, 1, 2, 3, 4], 1 / 5),  # (1,2,3,4) again at the end
    ([1, 2, 3, 4, 5, 6, 7, 8], 0.0),
    ([9] * 10, 6 / 7),  # a loop: every 4-gram after the first repeats
    ([1, 2, 3], 0.0),  # no 4-gram at all
    ([], 0.0),
])
def test_repeated_ngram_share(tokens, share):
    assert repeated_ngram_share(tokens) == pytest.approx(share)


def rec(method, prompt, tokens, nll=None, rep=None, top1=None):
    return SimpleNamespace(method=method, prompt_id=prompt, token_ids=tokens, target_nll=nll,
                           repeat_share=rep, target_top1_share=top1)


def test_annotate_scores_each_distinct_output_once(pair, monkeypatch):
    calls = []
    real = quality.target_scores

    def counting(model, prompt, output):
        calls.append((tuple(prompt), tuple(output)))
        return real(model, prompt, output)

    monkeypatch.setattr(quality, "target_scores", counting)
    records = [rec("ar", "p0", [1, 2, 3]), rec("mcsd", "p0", [1, 2, 3]),
               rec("lossy", "p0", [1, 2, 4]), rec("ar", "p1", [1, 2, 3])]
    annotate(pair.target, records, {"p0": [5, 6], "p1": [7, 8]})
    assert len(calls) == 3  # ar and mcsd share p0's output; p1 has another prompt
    assert records[0].target_nll == records[1].target_nll != records[2].target_nll
    assert records[3].target_nll != records[0].target_nll  # same output, other context
    assert all(r.repeat_share == 0.0 for r in records)
    assert all(0 <= r.target_top1_share <= 1 for r in records)


def test_summary_weights_tokens_and_pairs_with_ar():
    ar = [rec("ar", "p0", [1] * 2, 2.0, 0.0), rec("ar", "p1", [1] * 6, 1.0, 0.0)]
    same = [rec("m", "p0", [1] * 2, 2.0, 0.0), rec("m", "p1", [1] * 6, 1.0, 0.0)]
    s = summary(same, ar)
    assert s["target_nll"] == pytest.approx((2 * 2 + 1 * 6) / 8)  # per new token, all outputs
    assert s["target_nll_vs_ar"] == 0.0 and s["ci_target_nll_vs_ar"] == [0.0, 0.0]
    worse = [rec("m", "p0", [1] * 2, 2.5, 0.6, 0.5), rec("m", "p1", [1] * 6, 1.5, 0.2, 1.0)]
    s = summary(worse, ar)
    assert s["target_top1_share"] == pytest.approx((0.5 * 2 + 1.0 * 6) / 8)
    assert s["target_nll_vs_ar"] == pytest.approx(0.5)  # mean of per-prompt differences
    assert s["repeat4_share"] == pytest.approx(0.4) and s["loop_share"] == 0.5
    assert s["ci_target_nll_vs_ar"][0] <= 0.5 <= s["ci_target_nll_vs_ar"][1]
    assert summary(worse, None)["target_nll_vs_ar"] is None  # no ar ran
    assert summary([rec("m", "p0", [1])], ar)["target_nll"] is None  # an older run's records
