"""Training a learned width (`mcsd_runtime.stop.width`) and replaying it.

Greedy, what a drafted step verifying the w likeliest of the draft's first-depth candidates
commits at each position of an output is known from the output itself: two tokens when the
output's next token is among those w, else one. One teacher-forced pass of the draft over each of
the target's greedy outputs (`draft_ranks`: the draft's k largest probabilities at every position
and the rank of the output's token among them) therefore replays any width rule exactly, priced
by a cost profile (`WidthReplay`): a step verifying w candidates costs
`CostProfile.step_seconds` of the tree `(w,)` at depth 1 with the draft's pending tokens (one
more forward of the draft reads them), the budget's last token an undrafted step, as the decoder
takes them.

`fit` calibrates, per rank i, the chance that the i-th likeliest candidate is the output's token
given the draft's probability of it (isotonic regression on the training outputs), and tunes the
rate the rule values time at until it equals the throughput the rule reaches on those outputs
(Dinkelbach's iteration for a ratio objective, as `train.copy_length.fit`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mcsd_runtime.costmodel.profile import CostProfile
from mcsd_runtime.progress import progress
from mcsd_runtime.stop.width import WidthPolicy
from mcsd_runtime.tree import Tree

RATE_ROUNDS = 4
Rule = Callable[["Ranked", int], int]  # an output and a position -> a width in 1..k


@dataclass
class Ranked:
    """One output with, at each position, the draft's k largest probabilities (`top` [n, k],
    descending) and the rank of the output's token among those k (`rank` [n], -1: none)."""

    top: np.ndarray
    rank: np.ndarray


@torch.no_grad()
def draft_ranks(pair, traces: Sequence, k: int, desc: str = "draft candidates") -> list[Ranked]:
    """`Ranked` of each trace (`train.copy_length.Trace`: a prompt and the target's output),
    from the draft's teacher-forced distributions (`teacher_forced_draft_logits`, which
    `train.copy_length.draft_hits` reads too)."""
    from train.copy_length import teacher_forced_draft_logits

    out = []
    for t in progress(traces, desc=desc, unit="output"):
        logits = teacher_forced_draft_logits(pair, t).float()
        top = torch.softmax(logits, -1).topk(k, dim=-1)
        hit = top.indices == torch.tensor(t.tokens, device=pair.device)[:, None]
        rank = torch.where(hit.any(-1), hit.int().argmax(-1), -1)
        out.append(Ranked(top.values.cpu().numpy().astype(float), rank.cpu().numpy()))
    return out


class WidthReplay:
    """Replays width rules over `Ranked` outputs under a profile's step costs."""

    def __init__(self, profile: CostProfile, k: int, max_pending: int = 2) -> None:
        self.k = k
        # [w - 1][p - 1]: a step verifying w candidates with p pending draft tokens
        self.drafted = [[profile.step_seconds(Tree((w,)), 1, p) for p in range(1, max_pending + 1)]
                        for w in range(1, k + 1)]
        self.last = [profile.step_seconds(Tree((k,)), 0, p) for p in range(1, max_pending + 1)]

    def walk(self, out: Ranked, rule: Rule) -> tuple[int, float, list[int]]:
        """(tokens, seconds, the width of every step) of one output decoded with `rule`."""
        n, t, pending, seconds, widths = len(out.rank), 0, 1, 0.0, []
        while t < n:
            if t == n - 1:  # the budget's last token: the decoder drafts nothing (width 0)
                seconds += self.last[pending - 1]
                widths.append(0)
                break
            w = rule(out, t)
            widths.append(w)
            seconds += self.drafted[w - 1][pending - 1]
            pending = 2 if 0 <= out.rank[t] < w else 1
            t += pending
        return n, seconds, widths

    def speed(self, out: Ranked, rule: Rule) -> float:
        tokens, seconds, _ = self.walk(out, rule)
        return tokens / seconds

    def rate(self, outs: Sequence[Ranked], rule: Rule) -> float:
        """Pooled tokens/s of `rule` over `outs`."""
        walks = [self.walk(o, rule) for o in outs]
        return sum(w[0] for w in walks) / sum(w[1] for w in walks)


def static(w: int) -> Rule:
    """Every step verifies w candidates."""
    return lambda out, t: w


def learned(policy: WidthPolicy) -> Rule:
    """The policy's choice from the draft's probabilities there."""
    return lambda out, t: policy.choose(out.top[t])


def oracle(out: Ranked, t: int) -> int:
    """The hindsight-best width: just wide enough to hold the output's token, else 1."""
    return int(out.rank[t]) + 1 if out.rank[t] >= 0 else 1


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
    knots = calibrate(outs, k)
    seconds = [replay.drafted[w][0] for w in range(k)]
    rate = replay.rate(outs, static(k))
    history = [rate]
    for _ in range(rounds):
        policy = WidthPolicy(k=k, calibration=knots, seconds=seconds, rate=rate)
        rate = replay.rate(outs, learned(policy))
        history.append(rate)
    policy = WidthPolicy(k=k, calibration=knots, seconds=seconds, rate=rate)
    positions = int(sum(len(o.rank) for o in outs))
    hits = np.concatenate([o.rank for o in outs])
    facts = {"outputs": len(outs), "positions": positions, "rates": history,
             "hit_rates": [float(np.mean((hits >= 0) & (hits < w))) for w in range(1, k + 1)]}
    return policy, facts
