"""Batched decoding (`generate_batch`) is lossless per row: greedy rows equal the same prompt
decoded alone and the target's own greedy decoding, sampled rows follow the target."""

from __future__ import annotations

import copy

import pytest
import torch
from test_decoder_greedy import prompts, reference
from test_decoder_sampling import (
    ALPHA,
    DRAFTS,
    PROMPT,
    VOCAB,
    exact_joint,
    micro_pair,
    p_value,
    residual_from_p,
    unguarded_verify,
)

from conftest import make_pair
from mcsd_runtime.decode import verify as V
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.stop.builtin import StopperBase, make_stopper

CASES = [((4, 2, 2, 1), "static"), ((4, 2, 2, 1), "heuristic"), ((2, 3), "static:1"),
         ((1, 1, 1, 1), "confidence:0.3"), ((3, 1, 1, 1, 1, 1), "cumprod:0.8")]


@pytest.fixture(scope="module")
def refs(pair):
    return [(p, reference(pair, p, 20)) for p in prompts(pair.vocab_size, n=11, seed=5)]


@pytest.mark.parametrize(("k_config", "stopper"), CASES)
@pytest.mark.parametrize("batch_size", [3, 8])
def test_greedy_rows_equal_alone_and_target(pair, refs, k_config, stopper, batch_size):
    dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, max_new_tokens=20), stopper=stopper)
    out = dec.generate_batch([p for p, _ in refs], batch_size=batch_size)
    assert len(out) == len(refs)
    for (prompt, ref), res in zip(refs, out, strict=True):
        assert res.token_ids == ref
        assert res.token_ids == dec.generate(prompt).token_ids
    assert out.stats.new_tokens == sum(len(r.token_ids) for r in out)
    assert out.stats.tau > 1.0  # steps commit several tokens of several rows
    assert 0 < out.stats.decode_time < out.stats.wall_time


def test_ar_batches_equal_the_target(pair, refs):
    out = ARDecoder(pair, DecodeConfig(max_new_tokens=20)).generate_batch(
        [p for p, _ in refs], batch_size=4)
    assert [r.token_ids for r in out] == [ref for _, ref in refs]
    assert all(s.drafted == 0 and s.committed == 1 for r in out for s in r.steps)


def test_rows_finish_at_different_steps_on_eos_inside_accepted_paths():
    """A target with an EOS token: rows stop where alone they stop, often inside an accepted
    path, and the freed slots take the next prompts."""
    eos_pair = make_pair(vocab=16, eos=3, seed=2, noise=0.01)
    ps = prompts(16, n=9, seed=1)
    dec = MCSDDecoder(eos_pair, DecodeConfig(k_config=(2, 2, 1), max_new_tokens=30))
    alone = [dec.generate(p) for p in ps]
    out = dec.generate_batch(ps, batch_size=4)
    assert [r.token_ids for r in out] == [r.token_ids for r in alone]
    assert [r.token_ids for r in out] == [reference(eos_pair, p, 30)[: len(r.token_ids)]
                                         for p, r in zip(ps, out, strict=True)]
    ended = [r for r in out if r.token_ids[-1] == 3]
    lengths = {len(r.token_ids) for r in ended}
    assert len(ended) >= 3 and len(lengths) >= 2  # EOS rows, ending at different lengths
    # EOS inside an accepted path: the step that committed it accepted more than it committed
    assert any(r.steps[-1].accepted + 1 > r.steps[-1].committed for r in ended)


def test_row_depth_gives_each_row_its_own_steps(pair, refs):
    """batch_depth='row': every row's steps (depths, accepted, committed, target cache) equal
    those of the prompt decoded alone (the draft may have seen more of the path: its cache can
    be longer); 'max' drafts deeper and needs no more steps."""
    cfg = DecodeConfig(k_config=(3, 2, 1, 1), max_new_tokens=20)
    ps = [p for p, _ in refs]
    alone = MCSDDecoder(pair, cfg, stopper="heuristic")
    solo = [alone.generate(p).steps for p in ps]
    row = MCSDDecoder(pair, DecodeConfig(**{**vars(cfg), "batch_depth": "row"}),
                      stopper="heuristic").generate_batch(ps, batch_size=4)
    own = lambda steps: [(s.drafted, s.accepted, s.committed, s.tree_size, s.target_cache,  # noqa: E731
                          s.target_pending) for s in steps]
    assert [own(r.steps) for r in row] == [own(st) for st in solo]
    deep = MCSDDecoder(pair, cfg, stopper="heuristic").generate_batch(ps, batch_size=4)
    assert sum(s.drafted for r in deep for s in r.steps) > sum(s.drafted for st in solo
                                                               for s in st)
    assert sum(len(r.steps) for r in deep) <= sum(len(st) for st in solo)


def test_cache_holds_each_row_exactly(pair, refs):
    """After every step a row's caches hold its committed tokens but the pending ones."""
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(4, 2, 2, 1), max_new_tokens=20),
                      stopper="heuristic")
    ps = [p for p, _ in refs]
    for prompt, res in zip(ps, dec.generate_batch(ps, batch_size=5), strict=True):
        total = len(prompt)
        for s in res.steps:
            total += s.committed
            assert s.target_cache == total - s.target_pending
            assert s.draft_cache == total - s.draft_pending


class Counting(StopperBase):
    """Counts how many sequences asked it, through `copy` (one copy per row)."""

    def __init__(self) -> None:
        self.inner, self.copies = make_stopper("heuristic"), [0]

    def __copy__(self):
        new = Counting()
        new.inner, new.copies = copy.copy(self.inner), self.copies
        self.copies[0] += 1
        return new

    def reset(self) -> None:
        self.inner.reset()

    def should_continue(self, frontier) -> bool:
        return self.inner.should_continue(frontier)

    def update(self, drafted: int, accepted: int) -> None:
        self.inner.update(drafted, accepted)


class BatchVote(StopperBase):
    """A batch decision: continue while at least `n` rows are asked; records what it saw."""

    def __init__(self, n: int) -> None:
        self.n, self.seen, self.sizes = n, [], []

    def for_batch(self, batch_size: int) -> BatchVote:
        self.sizes.append(batch_size)
        return self

    def should_continue(self, frontier) -> bool:
        raise AssertionError("a batch decision never asks rows one by one")

    def batch_continue(self, frontiers) -> bool:
        self.seen.append((frontiers[0].depth, len(frontiers)))
        return len(frontiers) >= self.n


def test_each_row_runs_its_own_stopper_copy(pair, refs):
    stopper = Counting()
    ps = [p for p, _ in refs]
    out = MCSDDecoder(pair, DecodeConfig(max_new_tokens=20), stopper=stopper).generate_batch(
        ps, batch_size=4)
    assert stopper.copies[0] == len(ps)
    assert [r.token_ids for r in out] == [ref for _, ref in refs]


def test_batch_continue_decides_for_all_rows(pair, refs):
    vote = BatchVote(3)
    ps = [p for p, _ in refs]
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(2, 2, 2), max_new_tokens=20), stopper=vote)
    out = dec.generate_batch(ps, batch_size=4)
    assert vote.sizes == [4]
    assert {n for _, n in vote.seen} >= {1, 4}  # the full batch, then its tail
    # every step's depth follows the vote: deep while >= 3 rows are asked, else depth 1
    assert {s.drafted for r in out for s in r.steps} <= {0, 1, 3, 2}
    assert [r.token_ids for r in out] == [ref for _, ref in refs]


def test_batch_errors(pair):
    dec = MCSDDecoder(pair, DecodeConfig(max_new_tokens=4))
    with pytest.raises(MCSDError, match="batch_size"):
        dec.generate_batch([[1, 2]], batch_size=0)
    with pytest.raises(MCSDError, match="seeds"):
        dec.generate_batch([[1, 2], [3]], batch_size=2, seeds=[1])
    with pytest.raises(MCSDError, match="empty prompt"):
        dec.generate_batch([[1, 2], []], batch_size=2)
    with pytest.raises(MCSDError, match="init='draft'"):
        MCSDDecoder(pair, DecodeConfig(init="target")).generate_batch([[1], [2]], batch_size=2)
    with pytest.raises(MCSDError, match="batch_depth"):
        DecodeConfig(batch_depth="min")


# ---------------------------------------------------------------------------- sampling
def batch_counts(pair, n: int = 1000, batch_size: int = 8, temperature: float = 1.0,
                 k_config: tuple[int, ...] = (3, 2)) -> torch.Tensor:
    dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, temperature=temperature,
                                         max_new_tokens=3), stopper="heuristic")
    out = dec.generate_batch([PROMPT] * n, batch_size=batch_size, seeds=list(range(n)))
    counts = torch.zeros(VOCAB * VOCAB)
    for res in out:
        x1, x2 = res.token_ids[:2]
        counts[x1 * VOCAB + x2] += 1
    return counts


def test_sampled_rows_follow_the_target_and_a_biased_verifier_fails(monkeypatch):
    micro = micro_pair()
    exact = exact_joint(micro, 1.0)
    assert p_value(batch_counts(micro), exact) > ALPHA
    monkeypatch.setattr(V, "verify_children", residual_from_p)
    assert p_value(batch_counts(micro), exact) < ALPHA


@pytest.mark.parametrize("draft_kind", ["one-hot", "sharp-T0.2"])
def test_batched_rows_stay_exact_under_degenerate_drafts(draft_kind, monkeypatch):
    """A one-hot draft, and a sharp draft at temperature 0.2: proposals with fewer non-zero
    tokens than the tree has slots, in batches; the unguarded verifier fails the same test."""
    _, temperature, k_config = DRAFTS[draft_kind]
    pair = micro_pair(draft_kind)
    exact = exact_joint(pair, temperature)
    assert p_value(batch_counts(pair, temperature=temperature, k_config=k_config), exact) > ALPHA
    monkeypatch.setattr(V, "verify_children", unguarded_verify)
    assert p_value(batch_counts(pair, temperature=temperature, k_config=k_config), exact) < ALPHA


def test_sampled_rows_draw_as_the_prompt_alone(pair, refs):
    """Each row samples with its own generator: the same seed gives the same tokens as
    `generate`, whatever the batch around it."""
    cfg = DecodeConfig(k_config=(4, 2, 1), temperature=0.8, max_new_tokens=16)
    dec = MCSDDecoder(pair, cfg)
    ps = [p for p, _ in refs]
    seeds = [11 * i for i in range(len(ps))]
    out = dec.generate_batch(ps, batch_size=4, seeds=seeds)
    assert [r.token_ids for r in out] == [dec.generate(p, seed=s).token_ids
                                          for p, s in zip(ps, seeds, strict=True)]
