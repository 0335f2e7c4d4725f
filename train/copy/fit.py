"""Training a learned prompt-lookup copy length (`mcsd_runtime.decisions.copy_length`).

The model's rows come from walking each of the target's outputs (`collect.outputs`) under a few
fixed copy rules (`replay.copy`: every length of each match visited, labelled "accepted at least
i tokens"); the exchange rate is then tuned on the same outputs until it equals the throughput
the policy reaches (Dinkelbach's iteration for a ratio objective). Beside a draft (`--k-config`),
a step that copies nothing drafts the tree's first depth instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from collect.outputs import Trace
from mcsd_runtime.decisions.copy_length import FEATURES, CopyLength
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.progress import working
from replay.copy import Replay, copy_all, long_matches_only

RATE_ROUNDS = 4


def out_of_fold(traces: Sequence[Trace], costs: list[float], folds: int = 5, seed: int = 0,
                **fit_kwargs) -> list[float]:
    """Each output's replayed speed over AR under a policy fitted on the other folds (outputs
    dealt to `folds` folds at random): how the policy does on outputs it was not trained on."""
    fold = np.random.default_rng(seed).permutation(len(traces)) % folds
    speed = [0.0] * len(traces)
    with working(f"the copy length out of fold: {folds} fits on {len(traces)} outputs"):
        for f in range(folds):
            policy, _, _ = fit([traces[i] for i in np.flatnonzero(fold != f).tolist()], costs,
                               seed=seed, progress=False, **fit_kwargs)
            for i in np.flatnonzero(fold == f).tolist():
                replay = Replay(traces[i], policy.max_copy, policy.min_ngram, policy.max_ngram)
                speed[i] = replay.speedup(policy.choose, costs, policy.draft_costs,
                                          policy.draft_prior)
    return speed


BEHAVIOUR = (copy_all(10**6), copy_all(2), long_matches_only(8, 3))


def _hits(trace: Trace) -> list[int]:
    """The trace's `hits` (`draft_hits`), which a policy beside a draft is fitted on."""
    if trace.hits is None:
        raise MCSDError("a copy length beside a draft is fitted on outputs with their draft "
                        "hits (`draft_hits`)")
    return trace.hits


def fit(traces: Sequence[Trace], costs: list[float], min_ngram: int = 1, max_ngram: int = 4,
        seed: int = 0, n_estimators: int = 200, draft_costs: list[float] | None = None,
        progress: bool = True) -> tuple[CopyLength, str, dict]:
    """The policy trained on `traces` under `costs` (index k: a step copying k tokens), the
    model file's text and training facts; with `draft_costs` (the traces carrying `hits`),
    beside a draft: copying nothing drafts, and the rate is tuned on walks that draft.
    `progress`: each stage says it is alive on stderr (`mcsd_runtime.progress.working`)."""
    import lightgbm as lgb

    max_copy = len(costs) - 1
    replays = [Replay(t, max_copy, min_ngram, max_ngram) for t in traces]
    rows: list = []
    with working(f"walking {len(traces)} outputs under {len(BEHAVIOUR)} copy rules",
                 disable=not progress):
        for r in replays:
            for rule in BEHAVIOUR:
                r.walk(rule, costs, rows)
    if not rows or len({y for _, y in rows}) < 2:
        raise MCSDError("the outputs hold too few repeats to learn from (no prompt-lookup match, "
                        "or every copy accepted or none): use more prompts or longer outputs")
    x = np.array([f for f, _ in rows], dtype=np.float64)
    y = np.array([int(v) for _, v in rows])
    mono = [0] * (len(FEATURES) - 1) + [-1]  # longer copies never survive more often
    clf = lgb.LGBMClassifier(n_estimators=n_estimators, learning_rate=0.05, num_leaves=15,
                             min_child_samples=20, monotone_constraints=mono, random_state=seed,
                             n_jobs=1, verbose=-1)
    with working(f"fitting the copy length's LightGBM ({n_estimators} trees) on {len(rows)} "
                 f"rows", disable=not progress):
        clf.fit(x, y, feature_name=list(FEATURES))
    booster = clf.booster_
    policy = CopyLength(booster, costs, 1 / costs[0], min_ngram, max_ngram)
    if draft_costs is not None:  # a drafted step's tokens before a row has drafted
        policy.draft_costs = list(draft_costs)
        policy.draft_prior = 1 + float(np.mean([h for t in traces for h in _hits(t)[:-1]]))
    with working(f"tuning the rate: {RATE_ROUNDS} walks of {len(traces)} outputs",
                 disable=not progress):
        for _ in range(RATE_ROUNDS):  # the rate the policy itself reaches on its outputs
            seconds = sum(r.walk(policy.choose, costs, None, policy.draft_costs,
                                 policy.draft_prior).cost_s for r in replays)
            policy.rate = sum(len(t.tokens) for t in traces) / seconds
    text = booster.model_to_string()
    facts = {"rows": len(rows), "accept_share": float(y.mean()), "outputs": len(traces),
             "tokens": sum(len(t.tokens) for t in traces)}
    if draft_costs is not None:
        facts["draft_prior"] = policy.draft_prior
    return policy, text, facts


