"""Calibration of node scores for the expected-throughput rule: an isotonic map fitted on
validation rows (`fit_calibration`), the expected calibration error (`expected_calibration_error`,
the one definition the per-category report also reads), and the ECE by depth before and after the
map (`ece_by_depth`), which metrics.json reports on test rows."""

from __future__ import annotations

import numpy as np

from mcsd_runtime.decisions.expected_rate import Calibration


def fit_calibration(scores: np.ndarray, labels: np.ndarray) -> Calibration:
    """The isotonic map from `scores` to the frequency of `labels` (0/1), clipped to [0, 1]
    and flat beyond the scores seen."""
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
    iso.fit(np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.float64))
    x, y = np.asarray(iso.X_thresholds_), np.clip(np.asarray(iso.y_thresholds_), 0.0, 1.0)
    if len(x) < 2:  # one score seen: a flat map
        x, y = np.array([0.0, 1.0]), np.full(2, y[0] if len(y) else 0.0)
    return Calibration(tuple(x), tuple(np.maximum.accumulate(y)))


def expected_calibration_error(y: np.ndarray, p: np.ndarray, bins: int = 10) -> float:
    """ECE with equal-width bins: the mean |predicted - observed| weighted by the bin's rows."""
    y, p = np.asarray(y, dtype=np.float64), np.clip(np.asarray(p, dtype=np.float64), 0, 1)
    which = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        mask = which == b
        if mask.any():
            total += mask.sum() * abs(p[mask].mean() - y[mask].mean())
    return float(total / max(len(y), 1))


def ece_by_depth(depths: np.ndarray, labels: np.ndarray, scores: np.ndarray,
                 calibration: Calibration | None) -> dict[str, dict]:
    """Per depth (and "all"): rows, positive rate, mean score, ECE of the raw scores and of the
    calibrated ones."""
    depths, labels, scores = (np.asarray(a) for a in (depths, labels, scores))
    ece, out = expected_calibration_error, {}
    for name, m in [("all", np.ones(len(depths), bool)),
                    *((str(int(d)), depths == d) for d in np.unique(depths))]:
        row = {"n": int(m.sum()), "positive_rate": float(labels[m].mean()),
               "mean_score": float(scores[m].mean()), "ece_raw": ece(labels[m], scores[m])}
        if calibration is not None:
            row["ece_calibrated"] = ece(labels[m], calibration(scores[m]))
        out[name] = row
    return out
