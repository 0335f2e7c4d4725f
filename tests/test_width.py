"""A learned width (`mcsd_runtime.decisions.width`): the rule, its file, and the decoder that cuts a
drafted step's first depth to it — greedy output equal to the target's, batched too, sampled
output following the target's distribution (and the check failing on a biased verifier)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_copy_length import feature_pair as feature_pair_fixture
from test_decoder_sampling import (
    ALPHA,
    DRAFTS,
    N_BIASED,
    N_CHECKED,
    N_SAMPLES,
    PROMPT,
    exact_joint,
    micro_pair,
    p_value,
    residual_from_p,
    sampled_counts,
)

from collect.outputs import Ranked, draft_ranks, target_traces
from conftest import make_pair
from mcsd_runtime.cli import main
from mcsd_runtime.decisions.width import WidthPolicy
from mcsd_runtime.decode import speculative_sampling as V
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate.methods import check_method, short_name
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.tree import Tree
from replay.width import WidthReplay, learned, oracle, static
from train.width.fit import fit

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
    with pytest.raises(MCSDError, match="mcsd train --decision width"):
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
    # its biased verifier fails: `test_sampled_check_fails_on_a_biased_verifier`
    counts = sampled_counts(pair, verify, (3,), stopper="static:1", width=MICRO, n=N_CHECKED)
    assert p_value(counts, exact_joint(pair, 1.0)) > ALPHA


@pytest.mark.parametrize("draft_kind", ["one-hot", "support-2", "sharp-T0.2"])
def test_sampled_width_stays_exact_under_degenerate_drafts(draft_kind):
    """A draft with fewer than k non-zero tokens (one-hot, two) or a sharp one at a low
    temperature: the cut first depth still follows the target (chi-square)."""
    _, temperature, _ = DRAFTS[draft_kind]
    pair = micro_pair(draft_kind)
    # one-hot and support-2: their biased verifier is rejected in the test below (sharp-T0.2's
    # cut tree verifies one candidate at a time, where a residual drawn from p goes unseen)
    checked = draft_kind in ("one-hot", "support-2")
    counts = sampled_counts(pair, "mcss", (3,), temperature, stopper="static:1", width=MICRO,
                            n=N_CHECKED if checked else N_SAMPLES)
    assert p_value(counts, exact_joint(pair, temperature)) > ALPHA


@pytest.mark.parametrize("draft_kind", ["one-hot", "support-2"])
def test_degenerate_draft_check_fails_on_a_biased_verifier(draft_kind, monkeypatch):
    """The check above rejects a residual drawn from p under the small-support drafts (where
    the rule verifies one candidate, the unguarded verifier's failure cannot arise)."""
    pair = micro_pair(draft_kind)
    monkeypatch.setattr(V, "verify_children", residual_from_p)
    counts = sampled_counts(pair, "mcss", (3,), 1.0, stopper="static:1", width=MICRO,
                            n=N_BIASED)
    assert p_value(counts, exact_joint(pair, 1.0)) < ALPHA


@pytest.mark.parametrize("verify", ["mcss", "mcss-replacement"])
def test_sampled_check_fails_on_a_biased_verifier(monkeypatch, verify):
    pair = make_pair(vocab=6, seed=3, noise=0.5, init_range=0.5)
    monkeypatch.setattr(V, "verify_children", residual_from_p)
    counts = sampled_counts(pair, verify, (3,), stopper="static:1", width=MICRO, n=N_BIASED)
    assert p_value(counts, exact_joint(pair, 1.0)) < ALPHA


# ------------------------------------------------------------------ training and replay
feature_pair = feature_pair_fixture  # a fixture of test_copy_length, used here too
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [3, 3, 3, 3, 3], [9, 8, 7, 9, 8], [4, 5, 4, 5, 4]]


def cost_profile() -> CostProfile:
    """Verification dearer with every token, so that widths differ in cost."""
    return CostProfile(tokens=[1, 2, 3, 4, 5], target_s=[0.010, 0.0105, 0.011, 0.0115, 0.013],
                       draft_s=[0.001, 0.0012, 0.0014, 0.0016, 0.0018])


@pytest.mark.parametrize("kind", ["draft", "feature draft"])
def test_decoder_takes_the_widths_and_steps_its_replay_takes(pair, feature_pair, kind):
    """Greedy, the replay over the target's output and the draft's teacher-forced candidates
    walks exactly the decoder's steps (widths and all), and the profile prices both alike;
    with the ranks hidden, the walk differs."""
    p = pair if kind == "draft" else feature_pair
    profile = cost_profile()
    replay = WidthReplay(profile, 4)
    traces = target_traces(p, PROMPTS, 30)
    ranked = draft_ranks(p, traces, 4)
    policy = varied(4, step=0.06)
    dec = MCSDDecoder(p, DecodeConfig(k_config=(4,), max_new_tokens=30, eos_token_ids=()),
                      "static:1", width=policy)
    widths = set()
    for trace, out in zip(traces, ranked, strict=True):
        got = dec.generate(trace.prompt)
        assert got.token_ids == trace.tokens
        result = replay.walk(out, learned(policy))
        walked = result.choices
        assert walked == [s.tree_size if s.drafted else 0 for s in got.steps]
        assert result.tokens == len(got.token_ids) and result.steps == len(got.steps)
        assert profile.decode_seconds(Tree((4,)), got.steps) == pytest.approx(result.cost_s)
        blind = Ranked(out.top, np.full_like(out.rank, -1))
        assert replay.walk(blind, learned(policy)).choices != walked
        widths |= set(walked)
    assert len(widths - {0}) >= 3


def test_fit_calibrates_and_tunes_the_rate_to_its_own_throughput(pair):
    profile = cost_profile()
    ranked = draft_ranks(pair, target_traces(pair, PROMPTS * 2, 30), 4)
    policy, facts = fit(ranked, profile, 4)
    for x, y in policy.calibration:
        assert list(x) == sorted(x) and all(0 <= v <= 1 for v in y) and list(y) == sorted(y)
    replay = WidthReplay(profile, 4)
    assert policy.rate == pytest.approx(facts["rates"][-1])
    assert facts["rates"][0] == pytest.approx(replay.rate(ranked, static(4)))
    # the tuned rate is (nearly) the policy's own replayed throughput
    assert replay.rate(ranked, learned(policy)) == pytest.approx(policy.rate, rel=0.02)
    assert facts["hit_rates"] == sorted(facts["hit_rates"])
    assert all(replay.speed(o, oracle()) >= replay.speed(o, learned(policy)) - 1e-9
               for o in ranked)


def test_train_width_trains_reports_decodes_and_refuses_bad_input(toy_tiny, tmp_path, capsys):
    profile = tmp_path / "cost.json"
    cost_profile().save(profile)
    out = tmp_path / "width"
    base = ["train", "--decision", "width", "--target", str(toy_tiny / "target"), "--draft",
            str(toy_tiny / "draft"), "--prompts", "toy-code", "--limit", "3",
            "--eval-prompts", "toy-doc", "--eval-limit", "2", "--max-new-tokens", "24",
            "--dtype", "fp32", "--cost-profile", str(profile)]
    assert main([*base, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "toy-code (trained)" in printed and "width:" in printed
    policy = WidthPolicy.load(out)
    assert policy.k == 4 and policy.trained["report"][0]["outputs"] in (2, 3)
    assert main([*base, "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    # checked end to end: greedy, the decoders take the replay's steps, width by width
    checked = tmp_path / "checked"
    assert main([*base, "--out", str(checked), "--check-prompts", "1"]) == 0
    check = json.loads((checked / "check.json").read_text())
    assert set(check["per_method"]) == {"ar", "width 1", "width 2", "width 3", "width 4",
                                        "learned"}
    assert all(r["steps_replayed"] == r["steps_measured"] for r in check["per_method"].values())
    assert "replay vs end to end on 1 held-out prompts" in capsys.readouterr().out
    assert json.loads((checked / "decision.json").read_text())["decision"] == "width"
    short = tmp_path / "short.json"
    CostProfile(tokens=[1, 4], target_s=[0.01, 0.012], draft_s=[0.001, 0.001]).save(short)
    assert main([*base[:-1], str(short), "--out", str(tmp_path / "o2")]) == 2
    assert "--max-tokens 5" in capsys.readouterr().err and not (tmp_path / "o2").exists()
    # decoded through `mcsd eval`: lossless, and refused on a first depth of another width
    from mcsd_runtime.evaluate.runners import build_method
    from mcsd_runtime.models.pair import load_pair

    tiny = load_pair(toy_tiny / "target", toy_tiny / "draft", device="cpu", dtype="float32")
    cfg = DecodeConfig(k_config=(4, 2), max_new_tokens=16)
    ids = [5, 6, 7, 8]
    ar = build_method("ar", tiny, cfg).generate(ids)
    for method in (f"width:{out}", f"lookup:8:2+width:{out}"):
        assert build_method(method, tiny, cfg).generate(ids).token_ids == ar.token_ids
    with pytest.raises(MCSDError, match="first depth drafts 4"):
        build_method(f"width:{out}", tiny, DecodeConfig(k_config=(3,), max_new_tokens=16))
    with pytest.raises(MCSDError, match="mcsd train --decision width"):
        check_method(f"width:{tmp_path / 'none'}")
    assert short_name(f"lookup:8:3+width:{out}") == "lookup:8:3+width:width"
