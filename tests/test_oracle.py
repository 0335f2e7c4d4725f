"""The throughput oracle (`optimal_plan`) against brute force: every stop plan of a few short
dense walks replayed, and its own dynamic program's totals against a replay of its plan."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_train_data import Recorder

from conftest import make_pair
from mcsd_runtime.costmodel.profile import CostProfile
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
from train import replay as R

K, MAX_NEW = (2, 1, 1), 7
PROMPTS = [[3, 9, 4], [17, 2], [40, 41, 42, 43]]
PROFILES = {
    "cheap-draft": CostProfile(tokens=[1, 8, 64], target_s=[1.0, 1.1, 2.0],
                               draft_s=[0.2, 0.22, 0.4], step_overhead_s=0.05),
    "costly-draft": CostProfile(tokens=[1, 8, 64], target_s=[1.0, 1.1, 2.0],
                                draft_s=[0.5, 0.55, 1.0], step_overhead_s=0.05,
                                depth_overhead_s=0.02),
}


@pytest.fixture(scope="module")
def data() -> R.ReplayData:
    pair = make_pair(noise=0.02)  # accepted lengths 0..3 along the walks
    frames, lengths = [], {}
    for i, ids in enumerate(PROMPTS):
        rec = Recorder(K, f"p{i}", ids)
        res = MCSDDecoder(pair, DecodeConfig(k_config=K, max_new_tokens=MAX_NEW, commit_limit=1),
                          stopper="static", recorder=rec).generate(ids)
        frames.append(pd.DataFrame(rec.rows))
        lengths[f"run0/p{i}"] = res.stats.new_tokens
    return R.ReplayData(pd.concat(frames, ignore_index=True), new_tokens=lengths)


def plans(data: R.ReplayData, p: R.Prompt) -> list[dict]:
    """Every stop plan of one prompt's dense walk: a depth at each position the walk visits."""
    out = []

    def walk(t: int, plan: dict) -> None:
        step = p.by_position.get(t)
        if t >= p.new_tokens or step is None:
            out.append(plan)
            return
        for s in range(1, step.cap + 1):
            walk(t + min(step.accepted, s) + 1, plan | {(p.key, t): s})

    walk(0, {})
    return out


@pytest.mark.parametrize("profile", PROFILES.values(), ids=PROFILES)
def test_oracle_is_the_best_of_all_plans(data, profile):
    """Each plan of each prompt replayed alone (tokens and seconds add up over prompts), then
    the best tokens/s over every combination of the prompts' plans."""
    totals = []
    for p in data.prompts.values():
        runs = [R.replay(data.subset([p.key]), R.PlanStopper(plan), profile)
                for plan in plans(data, p)]
        totals.append(np.array([(r.tokens, r.cost_s) for r in runs]))
    assert all(len(t) > 10 for t in totals)  # real choices at several positions
    tokens = sum(np.ix_(*[t[:, 0] for t in totals]))
    seconds = sum(np.ix_(*[t[:, 1] for t in totals]))
    best = float((tokens / seconds).max())
    oracle = R.replay(data, "oracle", profile)
    assert oracle.throughput == pytest.approx(best, rel=1e-12)
    static = max(R.replay(data, f"static:{d}", profile).throughput for d in (1, 2, 3))
    assert best > static * 1.02  # a case where no static depth is already optimal


@pytest.mark.parametrize("profile", PROFILES.values(), ids=PROFILES)
def test_oracle_program_totals_equal_a_replay_of_its_plan(data, profile):
    """At the oracle's own rate, each prompt's dynamic program reports the tokens and seconds
    that replaying the plan it wrote gives."""
    lam = R.replay(data, "oracle", profile).throughput
    tree = data.tree
    costs = {(s, pend): profile.step_seconds(tree, s, pend)
             for s in range(data.depth + 1) for pend in R.PENDING_STATES}
    for p in data.prompts.values():
        plan: dict = {}
        tokens, seconds = R._plan_prompt(p, True, costs, lam, plan)
        r = R.replay(data.subset([p.key]), R.PlanStopper(plan), profile)
        assert (r.tokens, r.cost_s) == (pytest.approx(tokens), pytest.approx(seconds))
