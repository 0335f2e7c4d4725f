"""A learned width (`mcsd_runtime.stop.width`): the rule, its file, and the decoder that cuts a
drafted step's first depth to it — greedy output equal to the target's, batched too, sampled
output following the target's distribution (and the check failing on a biased verifier)."""

from __future__ import annotations

import json

import pytest
import torch
from test_decoder_sampling import (
    ALPHA,
    PROMPT,
    exact_joint,
    p_value,
    residual_from_p,
    sampled_counts,
)

from conftest import make_pair
from mcsd_runtime.decode import verify as V
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.stop.width import WidthPolicy

IDENTITY = ([0.0, 1.0], [0.0, 1.0])  # calibration: the draft's probability is the hit chance


def varied(k: int, step: float = 0.15) -> WidthPolicy:
    """A policy whose choice spans the widths as the draft's probabilities vary: one more
    candidate pays when its probability exceeds `step`."""
    return WidthPolicy(k=k, calibration=[IDENTITY] * k,
                       seconds=[1.0 + step * w for w in range(k)], rate=1.0)


def test_rule_verifies_a_candidate_when_its_chance_pays_for_it():
    policy = WidthPolicy(k=3, calibration=[([0.0, 0.5, 1.0], [0.0, 0.2, 1.0])] * 3,
                         seconds=[1.0, 1.1, 1.2], rate=1.0)
    # calibrated chances 0.84, 0.16, 0.04: the second pays 0.1 s at 1 token/s, the third not
    assert list(policy.hit_chances([0.9, 0.4, 0.1])) == pytest.approx([0.84, 0.16, 0.04])
    assert policy.choose([0.9, 0.4, 0.1]) == 2
    assert policy.choose([0.95, 0.2, 0.1]) == 1  # 0.08 < 0.1
    assert policy.choose([0.4, 0.4, 0.4]) == 3  # each 0.16 > 0.1
    assert WidthPolicy(k=3, calibration=[IDENTITY] * 3, seconds=[1.0, 1.1, 1.2],
                       rate=0.01).choose([0.9, 0.05, 0.04]) == 3  # time is cheap: verify all


def test_policy_file_round_trip_and_clear_errors(tmp_path):
    policy = varied(4)
    policy.save(tmp_path / "w")
    back = WidthPolicy.load(tmp_path / "w")
    assert back.to_json() == policy.to_json()
    assert [back.choose(t) for t in ([0.9, 0.05, 0.03, 0.01], [0.3, 0.25, 0.2, 0.2])] == [1, 4]
    with pytest.raises(MCSDError, match="mcsd train-width"):
        WidthPolicy.load(tmp_path / "missing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "width.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(MCSDError, match="not a width policy"):
        WidthPolicy.load(tmp_path / "bad")
    with pytest.raises(MCSDError, match="one calibration and one cost per width"):
        WidthPolicy(k=2, calibration=[IDENTITY], seconds=[1.0, 1.1], rate=1.0)


def test_decoder_refuses_a_width_for_another_first_depth(pair):
    with pytest.raises(MCSDError, match="first depth drafts 4"):
        MCSDDecoder(pair, DecodeConfig(k_config=(3, 2)), "static:1", width=varied(4))


# the micro pair's noisy draft: a second candidate pays above 0.05, a third above 0.07
MICRO = WidthPolicy(k=3, calibration=[IDENTITY] * 3, seconds=[1.0, 1.05, 1.12], rate=1.0)


def prompts(n: int) -> list[list[int]]:
    return [torch.randint(0, 64, (4 + i,), generator=torch.Generator().manual_seed(i)).tolist()
            for i in range(n)]


@pytest.mark.parametrize("k_config", [(4,), (4, 2)])
def test_greedy_output_is_the_targets_at_every_width(pair, k_config):
    """Cut to 1..4 candidates step by step (deeper trees stopped at depth 1), the output equals
    the target's greedy output, alone and in a batch; the steps verify the chosen widths."""
    cfg = DecodeConfig(k_config=k_config, max_new_tokens=40, eos_token_ids=())
    ar = ARDecoder(pair, cfg)
    dec = MCSDDecoder(pair, cfg, "static:1", width=varied(4, step=0.06))
    ps = prompts(5)
    want = [ar.generate(p).token_ids for p in ps]
    alone = [dec.generate(p) for p in ps]
    assert [r.token_ids for r in alone] == want
    sizes = {s.tree_size for r in alone for s in r.steps if s.drafted}
    assert {1, 2, 3, 4} <= sizes
    batch = dec.generate_batch(ps, batch_size=3)
    assert [r.token_ids for r in batch] == want
    assert [[s.tree_size for s in r.steps] for r in batch] == [
        [s.tree_size for s in r.steps] for r in alone]


def test_greedy_width_matches_a_static_width_when_it_always_picks_it(pair):
    """A policy that always picks width 2 takes exactly the steps of a first depth of 2."""
    two = WidthPolicy(k=4, calibration=[IDENTITY] * 4, seconds=[1.0, 1.0, 9.0, 9.0], rate=1.0)
    cfg = DecodeConfig(k_config=(4,), max_new_tokens=30, eos_token_ids=())
    narrow = MCSDDecoder(pair, DecodeConfig(k_config=(2,), max_new_tokens=30, eos_token_ids=()),
                         "static:1")
    cut = MCSDDecoder(pair, cfg, "static:1", width=two)
    for p in prompts(3):
        a, b = narrow.generate(p), cut.generate(p)
        assert [(s.accepted, s.tree_size) for s in a.steps] == [
            (s.accepted, s.tree_size) for s in b.steps]


@pytest.mark.parametrize("verify", ["mcss", "mcss-replacement"])
def test_sampled_output_follows_the_target_at_every_width(verify):
    """The micro pair's noisy draft at temperature 1: widths 1..3 all occur, and (x1, x2)
    follows the target's joint distribution (chi-square)."""
    pair = make_pair(vocab=6, seed=3, noise=0.5, init_range=0.5)
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(3,), temperature=1.0, verify=verify,
                                         max_new_tokens=3), "static:1", width=MICRO)
    assert {s.tree_size for seed in range(40) for s in dec.generate(PROMPT, seed=seed).steps
            if s.drafted} == {1, 2, 3}
    counts = sampled_counts(pair, verify, (3,), stopper="static:1", width=MICRO)
    assert p_value(counts, exact_joint(pair, 1.0)) > ALPHA


def test_sampled_check_fails_on_a_biased_verifier(monkeypatch):
    pair = make_pair(vocab=6, seed=3, noise=0.5, init_range=0.5)
    monkeypatch.setattr(V, "verify_children", residual_from_p)
    counts = sampled_counts(pair, "mcss", (3,), stopper="static:1", width=MICRO)
    assert p_value(counts, exact_joint(pair, 1.0)) < ALPHA
