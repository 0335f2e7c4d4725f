"""Sampled MCSD must follow the target's distribution exactly, whatever the draft looks like.

Two levels, each a seeded chi-square test that is also shown to reject a broken verifier:
- `verify_children` alone, on many rows at once: the output token against p, for every
  verifier and proposing distributions with full support, a one-hot q, a support smaller than
  k, and a float32 softmax at a low temperature (which underflows);
- the whole decoder: the joint distribution of the first two tokens on a micro pair, with
  drafts made one-hot, of small support, or sharp at T = 0.2 and T = 0.7.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from conftest import make_pair
from mcsd_runtime.constants import VERIFIERS
from mcsd_runtime.decisions.copy_length import FEATURES, CopyLength
from mcsd_runtime.decode import speculative_sampling as V
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder

# draws per chi-square test: under every configuration decoded below, a broken verifier (the
# residual drawn from p, or zero-probability candidates accepted) is rejected at p < 1e-20 at
# this many seeds
VOCAB, PROMPT, N_SAMPLES = 6, [1, 4, 2], 500
# a broken verifier's samples: rejected far below ALPHA already at this many (every biased
# arm here had p < 1e-8 at 200 seeds; the seeds are fixed, so the outcome is too)
N_BIASED = 200
# draws of a chi-square test whose own configuration (pair, draft, temperature, tree, verifier,
# proposer) is also shown to reject a broken verifier at as many draws of the same seeds, in
# the test itself or in a companion test (every such biased arm in this file had p < 1e-8 at
# 200 seeds). Tests without such a check keep N_SAMPLES.
N_CHECKED = N_BIASED
ALPHA = 1e-3


def p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness of fit, rare cells (expected < 5) pooled into one."""
    counts, probs = counts.double(), probs.double()
    expected = probs / probs.sum() * counts.sum()
    keep = expected >= 5
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]  # nothing pooled
        if obs.sum() < counts.sum():  # a token with probability 0 was produced
            return 0.0
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)


def unguarded_verify(p, q, cands, mode, generator):
    """The verifier before the q(x) > 0 guard: accepts zero-probability spare candidates."""
    n, k = cands.shape
    if mode == "naive":
        return V.verify_children(p, q, cands, mode, generator)
    u = torch.rand(n, k, generator=generator, dtype=p.dtype)
    rank = torch.full((n,), -1, dtype=torch.long)
    p, q = p.clone(), q.clone()
    rows = torch.arange(n)
    for i in range(k):
        x = cands[:, i]
        accept = (rank < 0) & (u[:, i] * q[rows, x] < p[rows, x])
        rank = torch.where(accept, i, rank)
        rejected = (rank < 0)[:, None]
        p = torch.where(rejected, V._normalize((p - q).clamp_min(0)), p)
        if mode == "mcss":
            q = torch.where(rejected, V._normalize(q.scatter(1, x[:, None], 0.0)), q)
    return rank, V.sample(p, generator)


def residual_from_p(p, q, cands, mode, generator):
    """A biased verifier: on rejection the next token is drawn from p, not norm(max(p-q, 0))."""
    n, k = cands.shape
    u = torch.rand(n, k, generator=generator, dtype=p.dtype)
    rank = torch.full((n,), -1, dtype=torch.long)
    rows = torch.arange(n)
    for i in range(k):
        x = cands[:, i]
        accept = (rank < 0) & (q[rows, x] > 0) & (u[:, i] * q[rows, x] < p[rows, x])
        rank = torch.where(accept, i, rank)
    return rank, V.sample(p, generator)


# ------------------------------------------------------------------ verify_children alone
P_ROW = torch.tensor([0.3, 0.4, 0.1, 0.1, 0.05, 0.05])


def _q(kind: str) -> torch.Tensor:
    if kind == "full":
        return torch.tensor([0.1, 0.2, 0.3, 0.2, 0.1, 0.1])
    if kind == "one-hot":
        return torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    if kind == "support-2":
        return torch.tensor([0.0, 0.7, 0.0, 0.3, 0.0, 0.0])
    # float32 softmax at T = 0.2 of spread logits: the tail underflows to exactly 0
    return torch.softmax(torch.tensor([0.0, 30.0, 5.0, 12.0, -4.0, 22.0]) / 0.2, -1)


def verified_tokens(verify, p, q, k, mode, n=40_000, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    pp, qq = p.expand(n, -1).contiguous(), q.expand(n, -1).contiguous()
    draw = V.sample_with_replacement if mode == "mcss-replacement" else (
        V.sample_without_replacement)
    cands = draw(qq, k, gen)
    rank, nxt = verify(pp, qq, cands, mode, gen)
    picked = cands.gather(1, rank.clamp_min(0)[:, None])[:, 0]
    return torch.where(rank >= 0, picked, nxt)


def test_low_temperature_q_really_has_small_support():
    assert int((_q("T=0.2") > 0).sum()) < 4  # the case below really has fewer than k=4 tokens


@pytest.mark.parametrize("mode", VERIFIERS)
@pytest.mark.parametrize("q_kind", ["full", "one-hot", "support-2", "T=0.2"])
def test_verify_children_outputs_p(mode, q_kind):
    out = verified_tokens(V.verify_children, P_ROW, _q(q_kind), 4, mode)
    assert p_value(torch.bincount(out, minlength=VOCAB), P_ROW) > ALPHA


@pytest.mark.parametrize("q_kind", ["one-hot", "support-2", "T=0.2"])
def test_chi_square_rejects_unguarded_verifier(q_kind):
    """The same test fails on the verifier that accepts zero-probability candidates."""
    out = verified_tokens(unguarded_verify, P_ROW, _q(q_kind), 4, "mcss")
    assert p_value(torch.bincount(out, minlength=VOCAB), P_ROW) < ALPHA


def test_issue_example_one_hot_draft_k2():
    """q one-hot on token 1, k = 2: token 4 must not be over-produced, token 0 must appear."""
    out = verified_tokens(V.verify_children, P_ROW, _q("one-hot"), 2, "mcss")
    freq = torch.bincount(out, minlength=VOCAB).double() / len(out)
    assert abs(freq[4] - 0.05) < 0.01 and abs(freq[0] - 0.3) < 0.02


def test_zero_probability_candidates_are_never_accepted():
    q = _q("support-2")
    gen = torch.Generator().manual_seed(1)
    qq = q.expand(5000, -1).contiguous()
    cands = V.sample_without_replacement(qq, 4, gen)
    assert (qq.gather(1, cands)[:, :2] > 0).all()  # real candidates come first
    rank, _ = V.verify_children(P_ROW.expand(5000, -1).contiguous(), qq, cands, "mcss", gen)
    accepted = cands.gather(1, rank.clamp_min(0)[:, None])[rank >= 0, 0]
    assert (q[accepted] > 0).all()


def test_residual_without_mass_falls_back_to_p():
    p = torch.tensor([[0.5, 0.5, 0.0]])
    assert torch.equal(V.residual(p, p.clone()), p)
    assert torch.allclose(V.residual(p, torch.tensor([[1.0, 0.0, 0.0]])),
                          torch.tensor([[0.0, 1.0, 0.0]]))


# ------------------------------------------------------------------ the whole decoder
def shape_logits(model, scale: float = 1.0, bias: torch.Tensor | None = None):
    """Make a model's output distribution as sharp (scale) or as narrow (bias) as a test needs."""
    bias = torch.zeros(VOCAB, dtype=torch.float64) if bias is None else bias.double()
    model.lm_head.register_forward_hook(lambda _m, _i, out: out * scale + bias)
    return model


def _bias(keep: dict[int, float]) -> torch.Tensor:
    b = torch.full((VOCAB,), -2000.0)
    for tok, v in keep.items():
        b[tok] = v
    return b


# name -> (draft shaping, temperature, k-config)
DRAFTS = {
    "one-hot": (dict(bias=_bias({1: 0.0})), 1.0, (4, 2)),
    "support-2": (dict(bias=_bias({1: 0.0, 3: 0.5})), 1.0, (4, 2)),
    "sharp-T0.2": (dict(scale=12.0), 0.2, (3, 2)),
    "sharp-T0.7": (dict(scale=40.0), 0.7, (3, 2)),
}


def micro_pair(draft_kind: str | None = None):
    # A noisy draft (q far from p) so that rejections and residual sampling are exercised.
    pair = make_pair(vocab=VOCAB, seed=3, noise=0.5, init_range=0.5)
    if draft_kind is not None:
        shape_logits(pair.draft, **DRAFTS[draft_kind][0])
    return pair


@pytest.fixture(scope="module")
def micro():
    return micro_pair()


def exact_joint(pair, temperature: float, prompt: list[int] = PROMPT) -> torch.Tensor:
    """p(x1, x2) of the target at `temperature`, by enumeration (float32 softmax, as decoded)."""
    with torch.no_grad():
        first = torch.softmax(pair.target(torch.tensor([prompt])).logits[0, -1].float()
                              / temperature, -1).double()
        ctx = torch.tensor([prompt + [x] for x in range(VOCAB)])
        second = torch.softmax(pair.target(ctx).logits[:, -1].float() / temperature, -1).double()
    return (first[:, None] * second).flatten()


def first_tokens(n: int):
    """An `on_commit` hook that ends a generation once it has committed `n` tokens (keeping the
    step's tokens): the steps that decide those tokens are the ones taken without it, with the
    same draws, and the steps after them are not decoded."""
    seen = [0]

    def hook(tokens: list[int]) -> int | None:
        seen[0] += len(tokens)
        return len(tokens) if seen[0] >= n else None

    return hook


# seeds of `sampled_counts` also decoded one at a time, to show its batch's rows are their draws
ALONE = 4


def sampled_counts(pair, verify: str, k_config, temperature: float = 1.0,
                   n: int = N_SAMPLES, prompt: list[int] = PROMPT, stopper: str | None = None,
                   copy_length: CopyLength | None = None, width=None,
                   **config) -> torch.Tensor:
    """Counts of the first two new tokens over seeds 0..n-1. The seeds are the rows of one
    batch in row mode, where each row drafts the tree its own stopper chooses and so draws what
    `generate` draws with its seed (the first ALONE seeds are checked against it): the same
    counts as n calls of `generate`, in a tenth of the time."""
    dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, temperature=temperature,
                                         verify=verify, max_new_tokens=3, batch_depth="row",
                                         **config), stopper,
                      copy_length=copy_length, width=width)
    rows = [r.token_ids[:2] for r in dec.generate_batch([prompt] * n, batch_size=n,
                                                        seeds=range(n))]
    for seed in range(min(ALONE, n)):
        alone = dec.generate(prompt, seed=seed, on_commit=first_tokens(2)).token_ids[:2]
        assert alone == rows[seed], f"seed {seed}: alone {alone}, in the batch {rows[seed]}"
    counts = torch.zeros(VOCAB * VOCAB)
    for x1, x2 in rows:
        counts[x1 * VOCAB + x2] += 1
    return counts


def proposals_smaller_than_k(pair, temperature: float, k: int) -> bool:
    """Whether the draft's first proposing distribution has fewer than k non-zero tokens."""
    with torch.no_grad():
        logits = pair.draft(torch.tensor([PROMPT])).logits[0, -1].float()
    return int((torch.softmax(logits / temperature, -1) > 0).sum()) < k


# (verifier, tree) of the micro pair's plain draft at T = 1
MATCH_CASES = [("mcss", (3, 2)), ("mcss-replacement", (3, 2)), ("naive", (3, 2)),
               ("mcss", (1, 1)), ("mcss", "3,2/2"), ("naive", "3,2/2")]


@pytest.mark.parametrize(("verify", "k_config"), MATCH_CASES)
def test_sampling_matches_target_distribution(micro, verify, k_config):
    """Each case's biased verifier fails the same test:
    `test_chi_square_detects_a_biased_verifier`."""
    counts = sampled_counts(micro, verify, k_config, n=N_CHECKED)
    assert p_value(counts, exact_joint(micro, 1.0)) > ALPHA


@pytest.mark.parametrize("draft_kind", list(DRAFTS))
def test_degenerate_drafts_stay_exact_and_the_old_verifier_does_not(draft_kind, monkeypatch):
    """mcss under a draft with fewer than k non-zero tokens matches the target; the unguarded
    verifier, run through the same decoder and test, is rejected."""
    _, temperature, k_config = DRAFTS[draft_kind]
    pair = micro_pair(draft_kind)
    assert proposals_smaller_than_k(pair, temperature, k_config[0])
    exact = exact_joint(pair, temperature)
    assert p_value(sampled_counts(pair, "mcss", k_config, temperature, n=N_CHECKED),
                   exact) > ALPHA
    monkeypatch.setattr(V, "verify_children", unguarded_verify)
    assert p_value(sampled_counts(pair, "mcss", k_config, temperature, n=N_BIASED), exact) < ALPHA


@pytest.mark.parametrize("verify", ["mcss-replacement", "naive"])
def test_one_hot_draft_other_verifiers(verify, monkeypatch):
    """The biased verifier (the residual drawn from p) fails the same test."""
    pair = micro_pair("one-hot")
    exact = exact_joint(pair, 1.0)
    assert p_value(sampled_counts(pair, verify, (4, 2), n=N_CHECKED), exact) > ALPHA
    monkeypatch.setattr(V, "verify_children", residual_from_p)
    assert p_value(sampled_counts(pair, verify, (4, 2), n=N_BIASED), exact) < ALPHA


@pytest.mark.parametrize(("verify", "k_config"), MATCH_CASES)
def test_chi_square_detects_a_biased_verifier(micro, monkeypatch, verify, k_config):
    """The decoder-level test fails when the residual is drawn from p, in every case above."""
    monkeypatch.setattr(V, "verify_children", residual_from_p)
    counts = sampled_counts(micro, verify, k_config, n=N_BIASED)
    assert p_value(counts, exact_joint(micro, 1.0)) < ALPHA


# its last token occurred before: prompt lookup proposes [3, 0] (q one-hot) at the first step,
# and the target gives token 3 a probability of 0.45 there
LOOKUP_PROMPT = [1, 3, 0, 1]


class ConfidentCopies:
    """A learned copy length that copies one token at a time, and only at the first step or
    after a token the target gave over 40%: its choice reads the confidence each sampled
    verdict carries."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        conf, length = x[:, FEATURES.index("conf_last")], x[:, -1]
        return np.where(((conf < 0) | (conf > 0.4)) & (length == 1), 0.9, 0.0)


COPY_LENGTHS = {"static": None,
                "learned": CopyLength(ConfidentCopies(), [1.0, 1.05, 1.1], rate=1.0),
                # beside a draft: drafts first, then copies or drafts as the sampled drafted
                # steps commit (their running value), on a wide tree
                "beside-draft": CopyLength(ConfidentCopies(), [1.0, 1.05, 1.1], rate=1.0,
                                           draft_costs=[1.1, 1.1, 1.1], draft_prior=2.0)}


# beside a chain (stopper none: the target alone elsewhere), or a tree of several candidates
# drafted where nothing is copied (the copies then go on a chain tree of their own)
LOOKUP_TREES = {"chain": ((1, 1), "none"), "wide": ((3, 2), "static")}
# (copy length, tree): the beside-draft policy on the wide tree only, where it chooses between
# copying and drafting; beside the chain (nothing drafted) it takes `learned`'s steps, copy for
# copy and token for token at every seed, so that case would repeat `learned` on the chain
LOOKUP_CASES = [(c, t) for c in COPY_LENGTHS for t in LOOKUP_TREES
                if (c, t) != ("beside-draft", "chain")]


@pytest.mark.parametrize(("copy_length", "tree"), LOOKUP_CASES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_prompt_lookup_matches_target_distribution(micro, temperature, copy_length, tree):
    """Copied chains are verified as drafts from a one-hot q: the output follows the target,
    whether the copy length is fixed or chosen step by step, beside a chain or a wide tree.
    Each case's biased verifier fails the same test below."""
    k_config, stopper = LOOKUP_TREES[tree]
    counts = sampled_counts(micro, "mcss", k_config, temperature, prompt=LOOKUP_PROMPT,
                            stopper=stopper, lookup=2, lookup_min_ngram=1,
                            copy_length=COPY_LENGTHS[copy_length], n=N_CHECKED)
    assert p_value(counts, exact_joint(micro, temperature, LOOKUP_PROMPT)) > ALPHA


@pytest.mark.parametrize(("copy_length", "tree"), LOOKUP_CASES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chi_square_detects_a_biased_verifier_under_lookup(micro, monkeypatch, temperature,
                                                           copy_length, tree):
    k_config, stopper = LOOKUP_TREES[tree]
    monkeypatch.setattr(V, "verify_children", residual_from_p)
    counts = sampled_counts(micro, "mcss", k_config, temperature, prompt=LOOKUP_PROMPT,
                            stopper=stopper, lookup=2, lookup_min_ngram=1,
                            copy_length=COPY_LENGTHS[copy_length], n=N_BIASED)
    assert p_value(counts, exact_joint(micro, temperature, LOOKUP_PROMPT)) < ALPHA


def test_target_init_never_commits_a_token_the_target_excludes():
    """Target-initialised roots (lossy by design) never pick a root of target probability 0."""
    pair = make_pair(vocab=VOCAB, seed=3, noise=0.5, init_range=0.5)
    shape_logits(pair.target, bias=_bias({2: 0.0, 5: 0.3}))
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(4, 1), init="target", temperature=1.0,
                                         max_new_tokens=4))
    firsts = {dec.generate(PROMPT, seed=s).token_ids[0] for s in range(60)}
    assert firsts <= {2, 5}


def test_sampling_is_seeded(micro):
    dec = MCSDDecoder(micro, DecodeConfig(k_config=(2, 2), temperature=1.0, max_new_tokens=8))
    assert dec.generate(PROMPT, seed=11).token_ids == dec.generate(PROMPT, seed=11).token_ids
    outs = {tuple(dec.generate(PROMPT, seed=s).token_ids) for s in range(10)}
    assert len(outs) > 1


def test_exact_joint_sums_to_one(micro):
    assert abs(float(exact_joint(micro, 1.0).sum()) - 1) < 1e-6
