"""Ragged batches in replay (`replay.ragged`) and their price (`CostProfile.ragged_*`): hand-made
dense chains whose accepted lengths are known."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from mcsd_runtime.decisions.features import NODE_FEATURES
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import BatchCosts, CostProfile, RaggedCosts
from replay.data import ReplayData
from replay.depth import replay
from replay.ragged import (
    affine_profile,
    compare,
    families,
    make_rule,
    ragged_replay,
    scaled_draft,
    table,
)

DEPTH = 4
PROFILE = CostProfile(tokens=[1, 4, 8], target_s=[1.0, 1.2, 1.6], draft_s=[0.1, 0.12, 0.16],
                      step_overhead_s=0.01, depth_overhead_s=0.002,
                      batches={4: BatchCosts(target_s=[1.2, 2.0, 3.2], draft_s=[0.12, 0.2, 0.3],
                                             step_overhead_s=0.02, depth_overhead_s=0.004)})


def chain_rows(lengths: list[int], new_tokens: int = 24, seed: int = 0) -> pd.DataFrame:
    """A dense 4-deep chain collection: one full-depth step at every position of each output
    (cap min(DEPTH, tokens left - 1)), accepted lengths drawn, path probabilities that follow
    them (high where accepted)."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(len(lengths)):
        for t in range(new_tokens - 1):
            cap = min(DEPTH, new_tokens - 1 - t)
            acc = min(int(rng.integers(0, lengths[p] + 1)), cap)
            log_path = 0.0
            for d in range(1, cap + 1):
                q = 0.9 if d <= acc else 0.3
                log_path += math.log(q)
                feats = dict.fromkeys(NODE_FEATURES, 0.0) | {
                    "depth": d, "frontier_size": 1, "draft_prob": q, "log_path_prob": log_path,
                    "q_top1": q}
                rows.append({"run_id": "r", "prompt_id": f"p{p:02d}", "step": t, "position": t,
                             "node": d - 1, "parent": d - 2, "init": "draft",
                             "accepted_length": acc, "drafted_depth": cap,
                             "on_accepted_path": d <= acc, "soft_label": 0.0} | feats)
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def data() -> ReplayData:
    df = chain_rows([0, 4, 1, 3, 2, 4, 0, 1, 4])
    keys = sorted(df["prompt_id"].unique())
    return ReplayData(df, k_config="1,1,1,1", new_tokens={f"r/{k}": 24 for k in keys})


def test_ragged_price_is_the_padded_curve_at_tokens_per_row():
    assert PROFILE.ragged_target(4, 1) == PROFILE.target(4)
    assert PROFILE.ragged_target(12, 4) == pytest.approx(PROFILE.target(3, 4))
    # 10 tokens over 4 rows: 2.5 a row, interpolated on the 4-row curve
    assert PROFILE.ragged_target(10, 4) == pytest.approx(1.2 + 1.5 / 3 * 0.8)
    assert PROFILE.ragged_draft(10, 4) == pytest.approx(0.12 + 1.5 / 3 * 0.08)
    # rows between measured sizes: interpolated between them, as padded forwards are
    assert PROFILE.ragged_target(6, 2) == pytest.approx(PROFILE.target(3, 2))
    assert PROFILE.ragged_target(0, 0) == 0.0 == PROFILE.ragged_draft(0, 4)
    # fewer tokens than rows: the batch's floor, its first point (one token a row)
    assert PROFILE.ragged_target(3, 4) == pytest.approx(PROFILE.target(1, 4))
    with pytest.raises(MCSDError, match="batch size"):
        PROFILE.ragged_target(16, 8)


def test_a_ragged_step_of_equal_rows_is_the_padded_step():
    tree = make_tree()
    for s in range(DEPTH + 1):
        for rows in (1, 4):
            padded = PROFILE.step_seconds(tree, s, 2, rows)
            assert PROFILE.ragged_step_seconds(tree, [(2, s, s)] * rows) == pytest.approx(padded)
    # a row that drafts nothing leaves the draft's forwards; one that verifies less is cheaper
    mixed = PROFILE.ragged_step_seconds(tree, [(1, 3, 3), (1, 0, 0), (1, 3, 1), (1, 1, 1)])
    assert mixed < PROFILE.step_seconds(tree, 3, 1, 4)


def make_tree():
    from mcsd_runtime.tree import Tree

    return Tree((1,) * DEPTH)


def test_one_row_replays_as_the_padded_replay(data):
    for s in range(1, DEPTH + 1):
        padded = replay(data, f"static:{s}", PROFILE, batch_size=1)
        ragged = ragged_replay(data, f"static:{s}", PROFILE, 1)
        assert (ragged.tokens, ragged.steps, ragged.target_tokens) == (
            padded.tokens, padded.steps, padded.target_tokens)
        assert ragged.cost_s == pytest.approx(padded.cost_s)


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_every_rule_commits_every_output(data, batch):
    total = sum(p.new_tokens for p in data.prompts.values())
    for spec in ("static:2", "cumprod:0.5", "survival:1", "oracle", "oracle-budget"):
        res = ragged_replay(data, spec, PROFILE, batch)
        assert res.tokens == total, spec
        assert res.stopper == spec


def test_the_oracle_verifies_exactly_what_is_accepted(data):
    res = ragged_replay(data, "oracle", PROFILE, 4)
    assert res.drafted_depth == res.accepted  # nothing drafted is rejected
    statics = [ragged_replay(data, f"static:{s}", PROFILE, 4).throughput
               for s in range(1, DEPTH + 1)]
    padded = [replay(data, f"static:{s}", PROFILE, batch_size=4).throughput
              for s in range(1, DEPTH + 1)]
    assert res.throughput > max(statics) >= max(padded)


def test_the_budget_fed_the_truth_is_the_oracle_when_drafting_is_free(data):
    free = CostProfile(**{**PROFILE.__dict__, "draft_s": [0.0] * 3, "depth_overhead_s": 0.0,
                          "batches": {4: BatchCosts(target_s=[1.2, 2.0, 3.2],
                                                    draft_s=[0.0] * 3)}})
    oracle = ragged_replay(data, "oracle", free, 4)
    budget = ragged_replay(data, "oracle-budget", free, 4)
    assert (budget.steps, budget.drafted_depth, budget.accepted) == (
        oracle.steps, oracle.drafted_depth, oracle.accepted)
    # with a costly draft it drops depths that do not pay and is at least as fast
    costly = ragged_replay(data, "oracle-budget", PROFILE, 4)
    assert costly.drafted_depth <= oracle.drafted_depth


def test_a_costlier_draft_drafts_less_under_the_survival_rule(data):
    drafted = []
    for factor in (0.1, 2.0, 10.0):
        prof = scaled_draft(PROFILE, factor)
        assert prof.ragged_draft(8, 4) == pytest.approx(factor * PROFILE.ragged_draft(8, 4))
        drafted.append(ragged_replay(data, "survival:1", prof, 4).drafted_depth)
    assert drafted == sorted(drafted, reverse=True) and drafted[0] > drafted[-1]


def test_compare_and_its_table(data):
    result = compare(data, PROFILE, [1, 4])
    assert set(result) == {1, 4}
    fams = result[4]["families"]
    assert [f.name for f in families(DEPTH)] == list(fams)
    assert fams["padded static"]["vs_padded"] == pytest.approx(1.0)
    assert fams["oracle"]["tokens_per_s"] >= fams["ragged static"]["tokens_per_s"]
    text = table(result)
    assert "| oracle |" in text and "B=4" in text


def test_unknown_rules_and_collections_are_refused(data):
    with pytest.raises(MCSDError, match="unknown ragged rule"):
        make_rule("heuristic")
    with pytest.raises(MCSDError, match="needs a number"):
        make_rule("survival:x")
    with pytest.raises(MCSDError, match="batch size"):
        ragged_replay(data, "oracle", PROFILE, 8)


def test_the_command_replays_a_collection_folder(tmp_path, capsys):
    from mcsd_runtime.cli import build_parser, run_parser
    from mcsd_runtime.decisions.features import TRAJECTORY_FEATURES
    from replay.ragged_cli import register

    df = chain_rows([1, 4, 2, 3, 0], new_tokens=12)
    df = df.assign(**dict.fromkeys(TRAJECTORY_FEATURES, 0.0))
    (tmp_path / "run").mkdir()
    df.to_parquet(tmp_path / "run" / "rows.parquet")
    PROFILE.save(tmp_path / "cost.json")
    parser = build_parser([register])
    argv = ["replay-batches", "--runs", str(tmp_path / "run"), "--cost-profile",
            str(tmp_path / "cost.json"), "--batch-size", "1,4", "--out", str(tmp_path / "r.json")]
    assert run_parser(parser, argv) == 0
    out = capsys.readouterr().out
    assert "| oracle |" in out and "B=4" in out
    assert (tmp_path / "r.json").is_file()
    assert run_parser(parser, [*argv[:-2], "--holdout", "--families", "oracle,cumprod",
                               "--affine", "--draft-scale", "0.5"]) == 0
    assert "settings chosen on 3 other prompts" in capsys.readouterr().out
    assert run_parser(parser, [*argv[:-2], "--batch-size", "8"]) == 2
    assert run_parser(parser, [*argv[:-2], "--families", "nope"]) == 2


def test_the_affine_profile_is_a_line_through_each_curve():
    bumpy = CostProfile(tokens=[1, 2, 3, 4], target_s=[1.0, 1.4, 1.0, 1.6],
                        draft_s=[0.3, 0.2, 0.1, 0.0])
    line = affine_profile(bumpy, 4)
    assert line.target_s == pytest.approx([1.04, 1.18, 1.32, 1.46])
    assert line.draft_s == pytest.approx([0.15] * 4)  # a falling curve is held flat
    assert affine_profile(bumpy, 3).target_s == pytest.approx([1.133333, 1.133333, 1.133333,
                                                               1.133333], rel=1e-5)
    with pytest.raises(MCSDError, match="two token counts"):
        affine_profile(bumpy, 1)


def test_measured_ragged_forwards_scale_with_the_draft_and_drop_under_the_affine_fit():
    ragged = {4: RaggedCosts(target=[[4, 0.5], [16, 0.9]], draft=[[1, 0.05], [16, 0.25]])}
    measured = replace(PROFILE, ragged=ragged)
    assert measured.ragged_draft(8, 4) != PROFILE.ragged_draft(8, 4)  # the points are read
    doubled = scaled_draft(measured, 2.0)
    assert doubled.ragged_draft(8, 4) == pytest.approx(2 * measured.ragged_draft(8, 4))
    assert doubled.ragged_target(8, 4) == measured.ragged_target(8, 4)
    fitted = affine_profile(measured, 8)
    assert fitted.ragged == {}
    assert fitted.ragged_target(8, 4) == affine_profile(PROFILE, 8).ragged_target(8, 4)


def test_each_forward_is_priced_as_the_engine_runs_it():
    """Packed where `step_model.packs` says the engine packs (real tokens at most 3/4 of the
    grid), else padded at the widest row: a packed curve dearer than the padded one (as measured
    on a CPU) never prices a forward the engine runs padded."""
    dear = replace(PROFILE, ragged={4: RaggedCosts(target=[[4, 9.0], [32, 9.0]],
                                                   draft=[[1, 9.0], [32, 9.0]])})
    equal = [(1, 2, 2)] * 4  # 3 tokens each: the padded grid itself
    assert dear.ragged_step_seconds(_tree(2), equal) == PROFILE.ragged_step_seconds(
        _tree(2), equal)
    assert dear.as_run("target_s", [3, 3, 3, 3]) == PROFILE.target(3, 4)
    assert dear.as_run("target_s", [3, 1, 1, 1]) == 9.0  # 6 of 12: packed
    assert dear.as_run("target_s", [3, 3, 3, 1]) == PROFILE.target(3, 4)  # 10 of 12: padded
    assert dear.as_run("draft_s", [0, 0, 0, 0]) == 0.0
    assert PROFILE.as_run("target_s", [5]) == PROFILE.target(5, 1)  # one row: never packed


def _tree(depth: int):
    from mcsd_runtime.tree import Tree, parse_k_config

    return Tree(parse_k_config(",".join(["1"] * depth)))
