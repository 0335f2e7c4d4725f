"""Learned stoppers' arithmetic by value: each aggregation over a frontier, and LightGBM's fast
paths (one row: a chain tree's frontier, the demo's default; a batch) against Booster.predict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mcsd_runtime.decisions.features import DECISION_FEATURES, FEATURE_NAMES
from mcsd_runtime.decisions.learned import NativeBooster, aggregate
from mcsd_runtime.errors import MCSDError

SCORES = np.array([0.2, 0.4, 0.9])
PATH_PROBS = [0.5, 0.25, 0.25]  # the nodes' path probabilities under the draft


def frontier(names: tuple[str, ...]) -> np.ndarray:
    """Three nodes' feature rows in the column order of `names`: noise but log_path_prob."""
    feats = np.random.default_rng(0).normal(size=(3, len(names)))
    feats[:, names.index("log_path_prob")] = np.log(PATH_PROBS) - 3.0  # a deep path: small
    return feats


@pytest.mark.parametrize("names", [FEATURE_NAMES, DECISION_FEATURES],
                         ids=["features", "decision_features"])
def test_aggregations_by_value(names):
    feats = frontier(names)
    assert aggregate("max", SCORES, feats) == 0.9
    assert aggregate("sum", SCORES, feats) == 1.0  # 1.5, capped: a probability
    assert aggregate("sum", SCORES[:2], feats[:2]) == pytest.approx(0.6)
    assert aggregate("mean", SCORES, feats) == pytest.approx(0.5)
    # path: scores weighted by the nodes' path probabilities (normalized over the frontier)
    assert aggregate("path", SCORES, feats) == pytest.approx(0.2 * 0.5 + 0.4 * 0.25 + 0.9 * 0.25)
    with pytest.raises(MCSDError, match="unknown aggregation 'median'"):
        aggregate("median", SCORES, feats)


def test_path_aggregation_survives_tiny_path_probabilities():
    feats = frontier(FEATURE_NAMES)
    feats[:, FEATURE_NAMES.index("log_path_prob")] = np.log(PATH_PROBS) - 800.0  # exp() == 0
    value = aggregate("path", SCORES, feats)
    assert math.isfinite(value) and value == pytest.approx(0.425)


@pytest.fixture(scope="module")
def booster():
    import lightgbm as lgb

    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, len(DECISION_FEATURES)))
    y = (x[:, 3] + 0.5 * x[:, 4] + rng.normal(0, 0.5, 400) > 0).astype(float)
    return lgb.train({"objective": "binary", "num_leaves": 7, "verbose": -1, "seed": 0,
                      "num_threads": 1}, lgb.Dataset(x, y), num_boost_round=20)


def test_lightgbm_single_row_and_batch_paths_match_booster_predict(booster, tmp_path):
    booster.save_model(str(tmp_path / "model.txt"))
    fast = NativeBooster(tmp_path / "model.txt")
    x = np.random.default_rng(2).normal(size=(64, len(DECISION_FEATURES)))
    want = booster.predict(x)
    assert len(set(np.round(want, 6))) > 10  # the predictions vary: a real comparison
    for i in range(len(x)):  # one row at a time: LGBM_BoosterPredictForMatSingleRowFast
        assert fast.predict(x[i: i + 1]) == pytest.approx(want[i: i + 1], abs=1e-12)
    assert fast.predict(x) == pytest.approx(want, abs=1e-12)
    assert fast.predict(x.astype(np.float32)) == pytest.approx(
        booster.predict(x.astype(np.float32)), abs=1e-12)
    n = len(DECISION_FEATURES)
    with pytest.raises(MCSDError, match=rf"expects {n} features per row, got shape \(64, {n - 1}"):
        fast.predict(x[:, :-1])
