"""Training a learned width (`mcsd_runtime.decisions.width`) on the target's greedy outputs.

`fit` calibrates, per rank i, the chance that the i-th likeliest candidate is the output's token
given the draft's probability of it (isotonic regression on the training outputs,
`collect.outputs.draft_ranks`), and tunes the rate the rule values time at until it equals the
throughput the rule reaches on those outputs under `replay.width.WidthReplay` (Dinkelbach's
iteration for a ratio objective, as `train.copy.fit.fit`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from collect.outputs import Ranked
from mcsd_runtime.decisions.width import WidthPolicy
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.progress import working
from replay.width import WidthReplay, learned, static

RATE_ROUNDS = 4


def calibrate(outs: Sequence[Ranked], k: int) -> list[tuple[list[float], list[float]]]:
    """Per rank i: knots of the isotonic fit of "the output's token is the i-th candidate" on
    the draft's probability of that candidate, over every position of `outs`."""
    from sklearn.isotonic import IsotonicRegression

    top = np.concatenate([o.top for o in outs])
    rank = np.concatenate([o.rank for o in outs])
    knots = []
    for i in range(k):
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
        iso.fit(top[:, i], (rank == i).astype(float))
        knots.append((iso.X_thresholds_.tolist(), iso.y_thresholds_.tolist()))
    return knots


def fit(outs: Sequence[Ranked], profile: CostProfile, k: int,
        rounds: int = RATE_ROUNDS) -> tuple[WidthPolicy, dict]:
    """A width policy for `outs` (training outputs) under `profile`, and training facts: the
    calibration, the step seconds per width and the rate, tuned from width k's throughput."""
    replay = WidthReplay(profile, k)
    positions = int(sum(len(o.rank) for o in outs))
    with working(f"calibrating {k} candidate ranks on {positions} positions"):
        knots = calibrate(outs, k)
    seconds = [replay.drafted[w][0] for w in range(k)]
    with working(f"tuning the rate: {rounds + 1} replays of {len(outs)} outputs"):
        rate = replay.rate(outs, static(k))
        history = [rate]
        for _ in range(rounds):
            policy = WidthPolicy(k=k, calibration=knots, seconds=seconds, rate=rate)
            rate = replay.rate(outs, learned(policy))
            history.append(rate)
    policy = WidthPolicy(k=k, calibration=knots, seconds=seconds, rate=rate)
    hits = np.concatenate([o.rank for o in outs])
    facts = {"outputs": len(outs), "positions": positions, "rates": history,
             "hit_rates": [float(np.mean((hits >= 0) & (hits < w))) for w in range(1, k + 1)]}
    return policy, facts


