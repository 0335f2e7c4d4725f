"""The expected-throughput rule: thresholds from a cost profile, an isotonic calibration, the
fields that carry both in stopper.json, and a learned stopper deciding by them."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mcsd_runtime.decisions.artifact import FILE, ArtifactSpec
from mcsd_runtime.decisions.expected_rate import Calibration, marginal_seconds, rate_thresholds
from mcsd_runtime.decisions.features import DECISION_FEATURES
from mcsd_runtime.decisions.learned import load_stopper, stopper_from
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.tree import Tree
from train.node_model import ece_by_depth, expected_calibration_error, fit_calibration

OLD = Path(__file__).parent / "fixtures" / "stoppers-b8df3aa" / "lightgbm"


def test_thresholds_are_the_rate_times_the_marginal_seconds_by_hand():
    """Chain (1, 1, 1), verify 1/2/3/4 tokens 1.0/1.6/1.8/1.9 s, a draft forward 0.2 s: one
    more depth after depth 1 costs 0.2 (the forward of depth 1) + 1.8 - 1.6, after depth 2
    0.2 + 1.9 - 1.8; at 2 tokens/s the thresholds are twice that."""
    profile = CostProfile(tokens=[1, 2, 3, 4], target_s=[1.0, 1.6, 1.8, 1.9],
                          draft_s=[0.2, 0.2, 0.2, 0.2])
    tree = Tree((1, 1, 1))
    assert marginal_seconds(profile, tree) == pytest.approx([0.4, 0.3])
    assert rate_thresholds(profile, tree, 2.0) == pytest.approx((0.8, 0.6))
    flat = CostProfile(tokens=[1, 8], target_s=[1.0, 1.0], draft_s=[0.0, 0.0])
    assert rate_thresholds(flat, tree, 5.0) == pytest.approx((0.0, 0.0))  # free: always on
    with pytest.raises(MCSDError, match="rate"):
        rate_thresholds(profile, tree, 0.0)


def test_isotonic_calibration_corrects_overconfident_scores():
    """Seeded: the event happens with probability score**2; the map fitted on one half brings
    the other half's ECE down by more than half. With labels shuffled against the scores
    (a broken input) the fitted map is nearly flat at the base rate."""
    rng = np.random.default_rng(0)
    scores = rng.random(20000)
    labels = (rng.random(20000) < scores**2).astype(float)
    cal = fit_calibration(scores[:10000], labels[:10000])
    ece = expected_calibration_error
    before, after = ece(labels[10000:], scores[10000:]), ece(labels[10000:], cal(scores[10000:]))
    assert before > 0.1 and after < before / 2
    assert np.all(np.diff(cal.y) >= 0) and cal(np.array([0.0]))[0] <= cal(np.array([1.0]))[0]
    shuffled = fit_calibration(scores[:10000], rng.permutation(labels[:10000]))
    inner = shuffled(np.quantile(scores, [0.1, 0.9]))
    assert abs(inner[1] - inner[0]) < 0.15 and abs(inner.mean() - labels.mean()) < 0.1
    by_depth = ece_by_depth(np.repeat([1, 2], 5000), labels[10000:], scores[10000:], cal)
    assert set(by_depth) == {"all", "1", "2"}
    assert by_depth["all"]["ece_calibrated"] < by_depth["all"]["ece_raw"]


@pytest.mark.parametrize("x,y", [((0.0,), (0.0,)), ((0.0, 0.5, 0.4), (0.0, 0.1, 0.2)),
                                 ((0.0, 1.0), (0.5, 0.2)), ((0.0, 1.0), (0.0, 1.5))])
def test_a_bad_calibration_is_refused(x, y):
    with pytest.raises(MCSDError, match="calibration"):
        Calibration(x, y)


def test_the_rule_round_trips_through_stopper_json(tmp_path):
    folder = tmp_path / "rule"
    shutil.copytree(OLD, folder)
    spec = replace(ArtifactSpec.read(folder), aggregation="sum", depth_thresholds=(0.5, 0.2, 0.1),
                   calibration=Calibration((0.0, 0.5, 1.0), (0.0, 0.2, 0.9)))
    spec.write(folder)
    data = json.loads((folder / FILE).read_text())
    assert data["depth_thresholds"] == [0.5, 0.2, 0.1]
    assert data["calibration"] == {"x": [0.0, 0.5, 1.0], "y": [0.0, 0.2, 0.9]}
    stopper = load_stopper(folder)
    assert [stopper.threshold_at(d) for d in (1, 2, 3, 4)] == [0.5, 0.2, 0.1, 0.1]
    assert stopper.calibration == spec.calibration
    # an artifact without the fields writes none of them and decides by its threshold
    assert "depth_thresholds" not in json.loads((OLD / FILE).read_text())
    old = load_stopper(OLD)
    assert old.depth_thresholds is None and old.threshold_at(2) == old.threshold
    # a threshold given on loading replaces the rule
    over = load_stopper(folder, threshold=0.3)
    assert over.depth_thresholds is None and over.calibration is None
    assert over.threshold_at(1) == 0.3
    for bad, message in (([-0.1], "depth_thresholds"), ("high", "depth_thresholds"),
                         ({"x": [0, 1]}, "calibration")):
        field = "calibration" if isinstance(bad, dict) else "depth_thresholds"
        (folder / FILE).write_text(json.dumps(data | {field: bad}))
        with pytest.raises(MCSDError, match=message):
            load_stopper(folder)


class Front:
    """A frontier of `n` nodes with fixed decision features."""

    max_depth = 4

    def __init__(self, depth: int, x: np.ndarray) -> None:
        self.depth, self.x = depth, x

    def decision_features(self) -> np.ndarray:
        return self.x

    def trajectory(self) -> list[float]:
        return list(self.x[0, -4:])


def test_a_rule_stopper_compares_calibrated_sums_with_its_depth_threshold():
    """Its decision is sum(calibration(score)) >= the threshold of the frontier's depth: the
    same scores continue at a depth with a low threshold and stop at one with a high one."""
    spec = ArtifactSpec.read(OLD)
    cal = Calibration((0.0, 1.0), (0.0, 0.5))  # halves every score
    x = np.random.default_rng(1).random((3, len(DECISION_FEATURES)))
    raw = stopper_from(spec, OLD).node_scores(x)
    want = float(min(1.0, (raw / 2).sum()))
    stopper = stopper_from(spec, OLD, aggregation="sum", depth_thresholds=(want - 1e-6,
                                                                           want + 1e-6),
                           calibration=cal)
    assert stopper.frontier_score(Front(1, x)) == pytest.approx(want)
    assert stopper.should_continue(Front(1, x)) and not stopper.should_continue(Front(2, x))
    assert stopper.batch_continue([Front(1, x)]) and not stopper.batch_continue([Front(3, x)])
