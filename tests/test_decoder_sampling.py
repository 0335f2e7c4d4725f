"""Sampled MCSD must follow the target's distribution exactly: a seeded chi-square test on the
joint distribution of the first two tokens, on a micro pair, for each verifier."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from conftest import make_pair
from mcsd_runtime import verify as V
from mcsd_runtime.decoder import DecodeConfig, MCSDDecoder

VOCAB, PROMPT, N_SAMPLES, TEMPERATURE = 6, [1, 4, 2], 2000, 1.0


@pytest.fixture(scope="module")
def micro():
    # A noisy draft (q far from p) so that rejections and residual sampling are exercised.
    return make_pair(vocab=VOCAB, seed=3, noise=0.5, init_range=0.5)


def exact_joint(pair) -> torch.Tensor:
    """p(x1, x2) of the target at TEMPERATURE, by enumeration."""
    with torch.no_grad():
        first = torch.softmax(pair.target(torch.tensor([PROMPT])).logits[0, -1] / TEMPERATURE, -1)
        ctx = torch.tensor([PROMPT + [x] for x in range(VOCAB)])
        second = torch.softmax(pair.target(ctx).logits[:, -1] / TEMPERATURE, -1)
    return (first[:, None] * second).flatten()


def sampled_counts(pair, verify: str, k_config, n: int = N_SAMPLES) -> torch.Tensor:
    dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, temperature=TEMPERATURE,
                                         verify=verify, max_new_tokens=3))
    counts = torch.zeros(VOCAB * VOCAB)
    for seed in range(n):
        x1, x2 = dec.generate(PROMPT, seed=seed).token_ids[:2]
        counts[x1 * VOCAB + x2] += 1
    return counts


def p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected >= 5  # pool the rare cells so the chi-square approximation holds
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


@pytest.mark.parametrize(("verify", "k_config"), [("mcss", (3, 2)), ("mcss-replacement", (3, 2)),
                                                   ("naive", (3, 2)), ("mcss", (1, 1))])
def test_sampling_matches_target_distribution(micro, verify, k_config):
    counts = sampled_counts(micro, verify, k_config)
    assert p_value(counts, exact_joint(micro)) > 1e-3


def test_chi_square_detects_a_biased_verifier(micro, monkeypatch):
    """The same test must fail when the residual is drawn from p instead of norm(max(p-q, 0))."""

    def biased(p, q, cands, mode, generator):
        n, k = cands.shape
        u = torch.rand(n, k, generator=generator, dtype=p.dtype)
        rank = torch.full((n,), -1, dtype=torch.long)
        rows = torch.arange(n)
        for i in range(k):
            x = cands[:, i]
            accept = (rank < 0) & (u[:, i] * q[rows, x] < p[rows, x])
            rank = torch.where(accept, i, rank)
        return rank, V.sample(p, generator)

    monkeypatch.setattr(V, "verify_children", biased)
    counts = sampled_counts(micro, "mcss", (3, 2))
    assert p_value(counts, exact_joint(micro)) < 1e-3


def test_sampling_is_seeded(micro):
    dec = MCSDDecoder(micro, DecodeConfig(k_config=(2, 2), temperature=1.0, max_new_tokens=8))
    assert dec.generate(PROMPT, seed=11).token_ids == dec.generate(PROMPT, seed=11).token_ids
    outs = {tuple(dec.generate(PROMPT, seed=s).token_ids) for s in range(10)}
    assert len(outs) > 1


def test_exact_joint_sums_to_one(micro):
    assert abs(float(exact_joint(micro).sum()) - 1) < 1e-9
    assert len(list(itertools.product(range(VOCAB), repeat=2))) == VOCAB * VOCAB
