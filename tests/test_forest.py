"""LightGBM's trees as tensor operations (`mcsd_runtime.decisions.forest`) predict what LightGBM's
own library predicts, at split thresholds, zeros and NaNs included, for a trained stopper too."""

from __future__ import annotations

from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest
import torch

from mcsd_runtime.decisions.forest import TensorForest
from mcsd_runtime.decisions.lightgbm_native import NativeBooster

FIXTURE = Path(__file__).parent / "fixtures" / "stoppers-b8df3aa" / "lightgbm" / "model.txt"


def trained(tmp_path: Path, objective: str, zero_as_missing: bool = False) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 5))
    x[rng.random(x.shape) < 0.1] = 0.0
    x[rng.random(x.shape) < 0.05] = np.nan
    y = (np.nan_to_num(x[:, 0]) + 0.5 * np.nan_to_num(x[:, 1]) > 0.2).astype(float)
    if objective == "cross_entropy":
        y = np.clip(y * 0.8 + 0.1 * rng.random(len(y)), 0, 1)
    params = {"objective": objective, "num_leaves": 7, "verbose": -1, "seed": 0,
              "min_data_in_leaf": 5, "zero_as_missing": zero_as_missing}
    booster = lgb.train(params, lgb.Dataset(x, y), num_boost_round=12)
    path = tmp_path / f"{objective}-{zero_as_missing}.txt"
    booster.save_model(str(path))
    return path


def probes(forest: TensorForest, n_features: int, rows: int = 400) -> np.ndarray:
    """Random rows, with values set exactly at split thresholds, zero and NaN."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(rows, n_features))
    thresholds = forest.threshold.flatten().numpy()
    features = forest.feature.flatten().numpy()
    for i in range(rows // 4):
        j = rng.integers(len(thresholds))
        x[i, features[j]] = thresholds[j]
    x[rng.random(x.shape) < 0.08] = 0.0
    x[rng.random(x.shape) < 0.05] = np.nan
    return x


@pytest.mark.parametrize("objective,zero", [("binary", False), ("binary", True),
                                            ("cross_entropy", False), ("regression", False)])
def test_forest_predicts_as_lightgbm(tmp_path, objective, zero):
    path = trained(tmp_path, objective, zero)
    forest = TensorForest.load(path)
    x = probes(forest, 5)
    want = lgb.Booster(model_file=str(path)).predict(x)
    got = forest(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_forest_predicts_a_trained_stopper_as_the_native_booster():
    forest = TensorForest.load(FIXTURE)
    x = probes(forest, 13)
    x = np.nan_to_num(x).astype(np.float32)  # a decoder's features: float32, never NaN
    want = NativeBooster(FIXTURE).predict(x.astype(np.float64))
    got = forest(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_strict_split_rule_is_caught(tmp_path, monkeypatch):
    """At a value equal to a threshold LightGBM goes left: `<` instead of `<=` is caught."""
    path = trained(tmp_path, "binary")
    forest = TensorForest.load(path)
    x = probes(forest, 5)
    want = lgb.Booster(model_file=str(path)).predict(x)
    forest.threshold = torch.nextafter(forest.threshold, torch.tensor(-np.inf,
                                                                      dtype=torch.float64))
    got = forest(torch.from_numpy(x)).numpy()
    assert np.abs(got - want).max() > 1e-6
