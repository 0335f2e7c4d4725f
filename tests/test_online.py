"""Per-sequence recalibration of a learned stopper (`mcsd_runtime.decisions.online`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mcsd_runtime.decisions.artifact import ArtifactSpec
from mcsd_runtime.decisions.learned import stopper_from
from mcsd_runtime.decisions.online import OnlineCalibration
from mcsd_runtime.errors import MCSDError

FIXTURE = Path(__file__).parent / "fixtures" / "stoppers-b8df3aa" / "lightgbm"


def test_the_factor_moves_with_the_evidence():
    cal = OnlineCalibration(strength=2.0)
    assert cal.factor() == 1.0
    cal.drafted_past(1, 0.8)
    cal.drafted_past(2, 0.5)
    cal.update(drafted=3, accepted=2)  # accepted past depth 1, not past depth 2
    assert (cal.predicted, cal.accepted) == pytest.approx((1.3, 1.0))
    assert cal.factor() == pytest.approx(3.0 / 3.3)
    cal.drafted_past(3, 0.9)
    cal.update(drafted=3, accepted=3)  # a continue whose next depth was never drafted: unseen
    assert (cal.predicted, cal.accepted) == pytest.approx((1.3, 1.0)) and cal.pending == []


class Confident:
    """Node scores of 0.9 for every frontier: a stopper sure the path goes on."""

    def __call__(self, frontiers):
        return [(np.array([0.9]), np.zeros((1, 1))) for _ in frontiers]


def decided(strength: float, accepted: int, steps: int = 12) -> list[bool]:
    """The stopper's decision after depth 1 at each step of a sequence whose target accepts
    `accepted` tokens at every step, drafted to depth 2 whenever it continues."""
    stopper = stopper_from(ArtifactSpec.read(FIXTURE), FIXTURE, threshold=0.5,
                           aggregation="max", min_depth=1, online_strength=strength)
    stopper.reset()
    stopper.node_scores_of = Confident()
    frontier = SimpleNamespace(depth=1, trajectory=lambda: [0.0] * 16)
    out = []
    for _ in range(steps):
        go = stopper.should_continue(frontier)
        stopper.update(2 if go else 1, min(accepted, 2 if go else 1))
        out.append(go)
    return out


def test_an_overconfident_stopper_learns_to_stop_and_a_right_one_goes_on():
    assert all(decided(0.0, accepted=0))  # off: sure, and wrong, at every step
    wrong = decided(1.0, accepted=0)
    assert wrong[0] and not any(wrong[3:])  # scaled below the threshold within a few steps
    assert all(decided(1.0, accepted=2))  # its confidence borne out: it goes on


class Fixed:
    """The same node score for every frontier."""

    def __init__(self, score: float) -> None:
        self.score = score

    def __call__(self, frontiers):
        return [(np.array([self.score]), np.zeros((1, 1))) for _ in frontiers]


@pytest.mark.parametrize(("strength", "node_score", "predicted"), [
    (0.0, 0.5, 0.0),  # off: the raw score
    (1.0, 0.5, 0.0),  # on, nothing seen yet: factor 1
    (1.0, 1.0, 1.0),  # on, one miss seen: factor (0 + 1) / (1 + 1) = 0.5
])
def test_a_score_exactly_at_the_threshold_goes_on(strength, node_score, predicted):
    # the rule is `score >= threshold` with the online factor applied as well as without it
    stopper = stopper_from(ArtifactSpec.read(FIXTURE), FIXTURE, threshold=0.5,
                           aggregation="max", min_depth=1, online_strength=strength)
    stopper.reset()
    stopper.online.predicted = predicted
    stopper.node_scores_of = Fixed(node_score)
    frontier = SimpleNamespace(depth=1, trajectory=lambda: [0.0] * 16)
    factor = stopper.online.factor() if strength else 1.0
    assert node_score * factor == 0.5  # exactly the threshold
    assert stopper.should_continue(frontier)
    assert stopper.online.pending == ([(1, node_score)] if strength else [])
    stopper.node_scores_of = Fixed(np.nextafter(node_score, 0.0))  # just under it: stops
    assert not stopper.should_continue(frontier)


def test_a_sequence_starts_afresh():
    stopper = stopper_from(ArtifactSpec.read(FIXTURE), FIXTURE, online_strength=1.0)
    stopper.online.drafted_past(1, 0.9)
    stopper.update(2, 0)
    assert stopper.online.factor() < 1
    stopper.reset()
    assert stopper.online.factor() == 1.0


@pytest.mark.parametrize("bad", [-1, "x", True])
def test_a_bad_strength_is_refused(bad):
    with pytest.raises(MCSDError, match="online_strength must be a number >= 0"):
        ArtifactSpec.read(FIXTURE).__class__(**{**vars(ArtifactSpec.read(FIXTURE)),
                                              "online_strength": bad})
