"""How a learned stopper turns its frontier's node scores into one continue-score.

- `max`: the paper's rule, continue while any node scores above the threshold;
- `sum`: the sum of node scores, clipped at 1. At most one frontier node lies on the accepted
  path, so the node events are exclusive and their probabilities add up to P(L > depth);
- `mean`: the plain mean;
- `path`: the mean weighted by each node's draft path probability.

Over a batch (`LearnedStopper.batch_continue`), the frontier scores of the rows asked (those
whose cap is deeper than the batch's depth) become one decision, `ROW_AGGREGATIONS`:

- `max`: draft on while the best row's score is >= the threshold (what asking every row's own
  stopper and continuing if ANY says yes decides);
- `mean`: while the rows' mean score is >= the threshold;
- `sum`: while the rows' summed score is >= the threshold, a count of tokens: with `sum` node
  aggregation the expected accepted tokens that one more depth adds over the batch, whose
  verification the whole batch pays for (so fewer rows asked need surer ones).

Numpy only: the stopper artifact's reader checks names against it without loading a model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mcsd_runtime.decisions.features import column
from mcsd_runtime.errors import MCSDError

_LOG_PATH = column("log_path_prob")


def _agg_max(p: np.ndarray, feats: np.ndarray) -> float:
    return float(p.max())


def _agg_sum(p: np.ndarray, feats: np.ndarray) -> float:
    return float(min(1.0, p.sum()))


def _agg_mean(p: np.ndarray, feats: np.ndarray) -> float:
    return float(p.mean())


def _agg_path(p: np.ndarray, feats: np.ndarray) -> float:
    logw = feats[:, _LOG_PATH].astype(np.float64)
    w = np.exp(logw - logw.max())
    return float((p * w).sum() / w.sum())


AGGREGATIONS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "max": _agg_max, "sum": _agg_sum, "mean": _agg_mean, "path": _agg_path}


def check_aggregation(name: str) -> str:
    """`name` if it is an aggregation, else MCSDError naming the known ones."""
    if name not in AGGREGATIONS:
        raise MCSDError(f"unknown aggregation {name!r}: use one of {', '.join(AGGREGATIONS)}")
    return name


def aggregate(name: str, scores: np.ndarray, feats: np.ndarray) -> float:
    """The frontier's continue-score from its node scores (`feats`: the frontier's features)."""
    return AGGREGATIONS[check_aggregation(name)](np.asarray(scores, dtype=np.float64),
                                                 np.asarray(feats))


ROW_AGGREGATIONS: dict[str, Callable[[np.ndarray], float]] = {
    "max": lambda s: float(s.max()), "mean": lambda s: float(s.mean()),
    "sum": lambda s: float(s.sum())}


def check_row_aggregation(name: str) -> str:
    """`name` if it is a row aggregation, else MCSDError naming the known ones."""
    if name not in ROW_AGGREGATIONS:
        raise MCSDError(f"unknown row aggregation {name!r}: use one of "
                        f"{', '.join(ROW_AGGREGATIONS)}")
    return name


def reachable(row_aggregation: str, threshold: float, rows: int) -> bool:
    """Whether `rows` frontier scores (each in [0, 1]: every node aggregation is) can reach
    `threshold` under `row_aggregation`. A setting that cannot drafts up to its min_depth and
    stops there without scoring anything: a static depth, chosen where deciding does not pay."""
    return threshold <= (rows if row_aggregation == "sum" else 1.0)


def batch_decision(name: str, scores, threshold: float) -> bool:
    """Whether the batch drafts one more depth: the asked rows' frontier scores aggregated by
    ROW_AGGREGATIONS[name], against `threshold`."""
    return ROW_AGGREGATIONS[check_row_aggregation(name)](np.asarray(scores, float)) >= threshold
