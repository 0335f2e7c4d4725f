"""More seeded chi-square tests of sampled decoding, each beside the same test failing on a
deliberately broken input: adaptive stoppers on a deeper tree (three tokens), `naive` and
`mcss-replacement` below T = 1, AR sampling and `generate()` sampling."""

from __future__ import annotations

import pytest
import torch
from test_decoder_sampling import (
    ALPHA,
    N_BIASED,
    N_CHECKED,
    PROMPT,
    VOCAB,
    exact_joint,
    first_tokens,
    micro_pair,
    p_value,
    residual_from_p,
    sampled_counts,
)
from test_hf_generate import N_SAMPLES as HF_DRAWS  # the draws of its chi-square test

from mcsd_runtime.decisions.builtin import StopperBase, make_stopper
from mcsd_runtime.decode import speculative_sampling as V
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder

# switch: no draft at the first step (the prior rate 0.5 < 0.6), a draft of 1 depth at the next
ADAPTIVE = ["confidence:0.5", "heuristic:2", "cumprod:0.6", "entropy:0.6:0.3", "switch:0.6:1:1"]


@pytest.fixture(scope="module")
def micro():
    return micro_pair()


def squared_sampler(monkeypatch) -> None:
    """A biased sampler: draws from p² (renormalized) wherever a token is sampled from p."""
    sample = V.sample
    monkeypatch.setattr(V, "sample", lambda p, g: sample(p * p / (p * p).sum(-1, keepdim=True),
                                                         g))


def exact_triple(pair, temperature: float) -> torch.Tensor:
    """p(x1, x2, x3) of the target, by enumeration (float32 softmax, as decoded)."""
    pairs = exact_joint(pair, temperature)
    ctx = torch.tensor([PROMPT + [a, b] for a in range(VOCAB) for b in range(VOCAB)])
    with torch.no_grad():
        third = torch.softmax(pair.target(ctx).logits[:, -1].float() / temperature, -1).double()
    return (pairs[:, None] * third).flatten()


class Rotating(StopperBase):
    """A different adaptive stopper for each sampled output (one per seed): every one of them
    must leave the output distributed as the target's, so their mixture must too. `learned`:
    a LightGBM stopper artifact's folder, added to the built-in ones."""

    def __init__(self, learned) -> None:
        self.names = [*ADAPTIVE, "learned"]
        self.stoppers = [make_stopper(s) for s in ADAPTIVE] + [make_stopper(f"stopper:{learned}")]
        self.current = self.stoppers[0]
        self.needs_hidden, self.decisions = False, {s: [0, 0] for s in self.names}
        self.skipped = 0  # steps some stopper decoded without a draft

    def use(self, i: int) -> None:
        self.current = self.stoppers[i % len(self.stoppers)]

    def reset(self) -> None:
        self.current.reset()

    def update(self, drafted: int, accepted: int) -> None:
        self.current.update(drafted, accepted)

    def check_tree(self, k_config) -> None:
        pass

    def should_draft(self, start) -> bool:
        go = self.current.should_draft(start)
        self.skipped += not go
        return go

    def should_continue(self, frontier) -> bool:
        go = self.current.should_continue(frontier)
        self.decisions[self.names[self.stoppers.index(self.current)]][go] += 1
        return go


def _triple_counts(pair, stopper: Rotating, n: int = N_CHECKED) -> torch.Tensor:
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(2, 2, 2), temperature=1.0,
                                         max_new_tokens=4), stopper=stopper)
    counts = torch.zeros(VOCAB ** 3)
    for seed in range(n):
        stopper.use(seed)
        x1, x2, x3 = dec.generate(PROMPT, seed=seed, on_commit=first_tokens(3)).token_ids[:3]
        counts[(x1 * VOCAB + x2) * VOCAB + x3] += 1
    return counts


def test_adaptive_stoppers_on_a_deeper_tree_keep_three_tokens_exact(micro, monkeypatch,
                                                                   tmp_path):
    from test_hf_generate_inputs import _artifact

    _artifact(tmp_path / "learned", threshold=0.6, k_config=(2, 2, 2))
    stopper = Rotating(tmp_path / "learned")
    exact = exact_triple(micro, 1.0)
    assert p_value(_triple_counts(micro, stopper), exact) > ALPHA
    for spec, (stops, goes) in stopper.decisions.items():  # each really adapted its depth
        assert stops > 0 and (goes > 0 or spec.startswith("switch")), spec
    assert stopper.skipped >= N_CHECKED // len(stopper.names)  # and steps without a draft
    monkeypatch.setattr(V, "verify_children", residual_from_p)  # the same test, a biased verifier
    assert p_value(_triple_counts(micro, Rotating(tmp_path / "learned"), N_BIASED),
                   exact) < ALPHA


@pytest.mark.parametrize("verify", ["naive", "mcss-replacement"])
def test_other_verifiers_below_temperature_one(micro, verify, monkeypatch):
    exact = exact_joint(micro, 0.7)
    assert p_value(sampled_counts(micro, verify, (3, 2), temperature=0.7, n=N_CHECKED),
                   exact) > ALPHA
    monkeypatch.setattr(V, "verify_children", residual_from_p)  # the same test, a biased verifier
    assert p_value(sampled_counts(micro, verify, (3, 2), temperature=0.7, n=N_BIASED),
                   exact) < ALPHA


def _pair_counts(first_two, n: int) -> torch.Tensor:
    """Counts of the first two new tokens over seeds 0..n-1 (`first_two(seed)` draws them)."""
    counts = torch.zeros(VOCAB * VOCAB)
    for seed in range(n):
        x1, x2 = first_two(seed)
        counts[x1 * VOCAB + x2] += 1
    return counts


def _ar_counts(pair, n: int) -> torch.Tensor:
    """As test_hf_reference draws them: the seeds as rows of one batch."""
    dec = ARDecoder(pair, DecodeConfig(temperature=0.7, max_new_tokens=2))
    rows = dec.generate_batch([PROMPT] * n, batch_size=n, seeds=range(n))
    return _pair_counts(lambda seed: rows[seed].token_ids, n)


def test_ar_sampling_test_rejects_a_biased_sampler(micro, monkeypatch):
    """test_hf_reference's AR chi-square, on a sampler that draws from p² instead of p (the
    unbiased sampler passing it: `test_ar_sampling_follows_the_target` there, on 500 seeds
    of the same target, temperature and prompt)."""
    squared_sampler(monkeypatch)
    assert p_value(_ar_counts(micro, 400), exact_joint(micro, 0.7)) < ALPHA


def _generate_counts(pair, n: int) -> torch.Tensor:
    from mcsd_runtime.integrations.hf import generate as mcsd_generate

    x = torch.tensor([PROMPT])

    def first_two(seed: int) -> list[int]:
        torch.manual_seed(seed)
        out = pair.target.generate(x, attention_mask=torch.ones_like(x),
                                   custom_generate=mcsd_generate, draft_model=pair.draft,
                                   k_config=(3, 2), do_sample=True, temperature=0.7, top_k=0,
                                   max_new_tokens=2)
        return out[0, len(PROMPT):].tolist()

    return _pair_counts(first_two, n)


def test_generate_sampling_test_rejects_a_biased_sampler(micro, monkeypatch):
    """test_hf_generate's chi-square, on the decoder drawing residual and bonus tokens from p²
    (the unbiased decoder passing it on these very draws, the same pair, seeds and settings:
    `test_sampling_follows_the_target_at_its_temperature` there)."""
    squared_sampler(monkeypatch)
    assert p_value(_generate_counts(micro, HF_DRAWS), exact_joint(micro, 0.7)) < ALPHA
