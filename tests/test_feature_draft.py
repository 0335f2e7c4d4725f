"""Feature drafts (`distill.feature`): the decoder hands the draft the target's states, and the
draft's proposals are exactly what the draft computes from the committed text and those states.

The check is a replay: for each step, the draft run teacher-forced over the committed prefix (its
input at position p the target's state at p - 1, computed by one target forward over the whole
output) must give the probability the decoder's trace recorded for the depth-1 node, and, fed its
own state at the root, the depth-2 node's. Feeding zeros or the wrong position's state breaks it
(the engine's bookkeeping of pending states, the prefill, the re-fed accepted path)."""

from __future__ import annotations

import pytest
import torch
from test_decoder_greedy import prompts, reference

from conftest import make_pair
from mcsd_runtime.backend.layers import cut_draft
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
from mcsd_runtime.distill.feature import (
    FeatureDraft,
    attach_feature_input,
    is_feature_draft,
    save_feature_draft,
    with_feature_input,
)
from mcsd_runtime.distill.feature_train import shifted
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.pair import Pair


class Traces:
    needs_hidden = False

    def __init__(self) -> None:
        self.steps = []

    def on_step(self, trace) -> None:
        self.steps.append(trace)


@pytest.fixture(scope="module")
def fpair() -> Pair:
    base = make_pair(vocab=64, seed=3)
    draft = with_feature_input(cut_draft(base.target, [0, 1])).to(torch.float64)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():  # a draft that is not the target's last layer verbatim
        for p in draft.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return Pair(base.target, draft.eval())


def teacher_forced(fpair: Pair, ids: list[int], extra_states: int = 0):
    """The draft's distributions and states over `ids`, each position reading the target's
    state one position back (the last `extra_states` positions read the draft's own state
    instead, as drafted nodes do)."""
    t = torch.tensor([ids])
    states = fpair.target.get_decoder()(input_ids=t).last_hidden_state
    pos = torch.arange(len(ids))[None]
    prev = shifted(states, pos)
    for k in range(extra_states, 0, -1):
        own = fpair.draft(input_ids=t, prev_hidden=prev, output_hidden_states=True)
        prev = prev.clone()
        prev[0, len(ids) - k] = own.hidden_states[0][0, len(ids) - k - 1]
    out = fpair.draft(input_ids=t, prev_hidden=prev, output_hidden_states=True)
    return torch.softmax(out.logits[0].float(), -1)


@pytest.mark.parametrize("k_config", [(1, 1, 1), (2, 2, 1)])
def test_proposals_replay_from_the_targets_states(fpair, k_config):
    prompt = prompts(fpair.vocab_size, n=3, seed=11)[2]
    rec = Traces()
    dec = MCSDDecoder(fpair, DecodeConfig(k_config=k_config, max_new_tokens=24), "static",
                      recorder=rec)
    out = dec.generate(prompt)
    assert out.token_ids == reference(fpair, prompt, 24)
    text = prompt + out.token_ids
    at = len(prompt) - 1  # the root of the first step
    accepted = checked = 0
    for trace, step in zip(rec.steps, out.steps, strict=True):
        ctx = text[: at + 1]
        accepted += step.accepted
        at += step.committed
        if trace.drafted < 2:  # the budget's last steps
            continue
        k1 = k_config[0]
        q = teacher_forced(fpair, ctx)[-1]
        nodes = trace.tokens[1 : 1 + k1].tolist()
        torch.testing.assert_close(trace.draft_prob[:k1].double(), q[nodes].double(),
                                   rtol=1e-6, atol=1e-9)
        first = nodes[0]
        q2 = teacher_forced(fpair, [*ctx, first], extra_states=1)[-1]
        k2 = k_config[1]
        kids = trace.tokens[1 + k1 : 1 + k1 + k2].tolist()
        torch.testing.assert_close(trace.draft_prob[k1 : k1 + k2].double(), q2[kids].double(),
                                   rtol=1e-6, atol=1e-9)
        checked += 1
    assert checked >= 4
    assert accepted > 0  # the re-fed accepted path was exercised


def test_replay_fails_when_the_states_are_zeroed(fpair, monkeypatch):
    """The replay above is not vacuous: a decoder feeding zeros gives other proposals."""
    real = FeatureDraft.forward

    def zeroed(self, input_ids, prev_hidden=None, **kw):
        return real(self, input_ids, None, **kw)

    monkeypatch.setattr(FeatureDraft, "forward", zeroed)
    prompt = prompts(fpair.vocab_size, n=3, seed=11)[2]
    rec = Traces()
    MCSDDecoder(fpair, DecodeConfig(k_config=(1, 1, 1), max_new_tokens=12), "static",
                recorder=rec).generate(prompt)
    monkeypatch.setattr(FeatureDraft, "forward", real)
    q = teacher_forced(fpair, prompt)[-1]
    first = rec.steps[0].tokens[1].item()
    assert abs(rec.steps[0].draft_prob[0].item() - q[first].item()) > 1e-6


def test_greedy_equals_the_target_alone_and_in_batches(fpair):
    ps = prompts(fpair.vocab_size, n=5, seed=2)
    refs = [reference(fpair, p, 16) for p in ps]
    for k_config, stopper in (((4, 2, 2, 1), "static"), ((1, 1, 1, 1), "heuristic"),
                              ((2, 2), "static:1")):
        dec = MCSDDecoder(fpair, DecodeConfig(k_config=k_config, max_new_tokens=16), stopper)
        assert [dec.generate(p).token_ids for p in ps] == refs
        batch = dec.generate_batch(ps, batch_size=3)
        assert [r.token_ids for r in batch] == refs


def test_sampled_batch_rows_equal_each_prompt_alone(fpair):
    ps = prompts(fpair.vocab_size, n=4, seed=4)
    dec = MCSDDecoder(fpair, DecodeConfig(k_config=(2, 1, 1), max_new_tokens=12,
                                          temperature=0.8, seed=5), "static")
    alone = [dec.generate(p, seed=9 + i).token_ids for i, p in enumerate(ps)]
    batch = dec.generate_batch(ps, batch_size=3, seeds=[9 + i for i in range(len(ps))])
    assert [r.token_ids for r in batch] == alone


def test_target_initialized_candidates_are_refused(fpair):
    dec = MCSDDecoder(fpair, DecodeConfig(k_config=(2, 1), max_new_tokens=4, init="target"))
    with pytest.raises(MCSDError, match="feature draft"):
        dec.generate([1, 2, 3])


def test_saved_and_loaded_feature_draft_is_the_same(fpair, tmp_path):
    from transformers import AutoModelForCausalLM

    save_feature_draft(fpair.draft, tmp_path)
    loaded = attach_feature_input(
        AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64), tmp_path)
    assert is_feature_draft(loaded) and not is_feature_draft(fpair.target)
    ids = torch.tensor([[5, 9, 1, 40]])
    prev = torch.randn(1, 4, fpair.draft.config.hidden_size, dtype=torch.float64)
    # (rotary tables computed once in float32 before the cast, once after: ~1e-6 apart)
    torch.testing.assert_close(loaded(input_ids=ids, prev_hidden=prev).logits,
                               fpair.draft(input_ids=ids, prev_hidden=prev).logits,
                               rtol=1e-4, atol=1e-5)
    assert attach_feature_input(fpair.target, tmp_path / "nothing") is fpair.target


def test_generate_and_hf_assisted_are_refused_for_a_feature_draft(fpair):
    from mcsd_runtime.decode.decoder import DecodeConfig
    from mcsd_runtime.evaluate.runners import build_method

    with pytest.raises(MCSDError, match="generate"):
        fpair.draft.generate(torch.tensor([[1, 2]]))
    with pytest.raises(MCSDError, match="hf-assisted"):
        build_method("hf-assisted", fpair, DecodeConfig(k_config=(1,), max_new_tokens=4))


@pytest.mark.parametrize("draft_kind", [None, "one-hot", "sharp-T0.2", "biased verifier"])
def test_sampling_with_a_feature_draft_follows_the_target(draft_kind, monkeypatch):
    """Chi-square of the first two sampled tokens against the target's exact joint, with a
    noisy feature draft, a near one-hot one and a sharp one at a low temperature; the same test
    rejects a verifier that draws the residual from p (the noisy draft's case) and, under the
    degenerate drafts, one that accepts zero-probability candidates."""
    from test_decoder_sampling import (
        ALPHA,
        DRAFTS,
        N_BIASED,
        N_CHECKED,
        exact_joint,
        micro_pair,
        p_value,
        residual_from_p,
        sampled_counts,
        shape_logits,
        unguarded_verify,
    )

    from mcsd_runtime.decode import speculative_sampling as V

    base = micro_pair()
    draft = with_feature_input(cut_draft(base.target, [0, 1])).to(torch.float64)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    temperature, k_config = 1.0, (3, 2)
    if draft_kind in DRAFTS:
        shape, temperature, k_config = DRAFTS[draft_kind]
        shape_logits(draft, **shape)
    broken = draft_kind == "biased verifier"
    if broken:
        monkeypatch.setattr(V, "verify_children", residual_from_p)
    pair = Pair(base.target, draft.eval())
    exact = exact_joint(pair, temperature)
    counts = sampled_counts(pair, "mcss", k_config, temperature,
                            n=N_BIASED if broken else N_CHECKED)
    assert (p_value(counts, exact) > ALPHA) != broken
    if draft_kind in DRAFTS:
        monkeypatch.setattr(V, "verify_children", unguarded_verify)
        counts = sampled_counts(pair, "mcss", k_config, temperature, n=N_BIASED)
        assert p_value(counts, exact) < ALPHA
