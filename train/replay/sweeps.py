"""Sweeps over replayed settings: the learned stopper at every threshold, aggregation,
min_depth and gate (`sweep`, `sweep_gates`, `replay_setting`; node scores cached across
settings by `MemoStopper`), and the baselines every method is compared with (`baselines`)."""

from __future__ import annotations

import numpy as np

from mcsd_runtime.costmodel.profile import CostProfile
from mcsd_runtime.stop.learned import LearnedStopper
from train.replay.data import ReplayData, _Frontier
from train.replay.engine import ReplayResult, replay


class MemoStopper(LearnedStopper):
    """A learned stopper whose node scores are cached by (prompt, position, depth, trajectory),
    so that sweeping thresholds and aggregations costs one model call per distinct frontier.
    It decides with `LearnedStopper`'s own code, alone and for a batch (`row_aggregation`),
    each frontier scored alone; its setting (threshold, aggregations, min_depth, gate) is the
    one it is given at every batch size."""

    def __init__(self, learned: LearnedStopper, cache: dict | None = None) -> None:
        vars(self).update(vars(learned))
        self.cache = {} if cache is None else cache

    def for_batch(self, batch_size: int) -> MemoStopper:
        return self

    def node_scores_of(self, frontiers: list[_Frontier]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self._cached(f) for f in frontiers]

    def _cached(self, frontier: _Frontier) -> tuple[np.ndarray, np.ndarray]:
        key = (*frontier.key, *frontier.trajectory())
        hit = self.cache.get(key)
        if hit is None:
            x, feats = self._inputs(frontier)
            hit = (self.node_scores(x), feats)
            self.cache[key] = hit
        frontier.read = True
        return hit


THRESHOLDS = np.round(np.concatenate([np.linspace(0.02, 0.2, 10), np.linspace(0.25, 0.95, 15)]),
                      3)


MIN_DEPTHS = (1, 2, 3)
# min_depth_gate values tried for the chosen setting (0: depths below min_depth always drafted)
GATES = (0.0, 0.4, 0.5, 0.6, 0.7)


def row_thresholds(row_aggregation: str, batch_size: int, thresholds=THRESHOLDS) -> np.ndarray:
    """The thresholds swept for a row aggregation: a `sum` over rows ranges up to the batch
    size, so its grid is scaled by it."""
    return np.asarray(thresholds) * (batch_size if row_aggregation == "sum" else 1)


def _setting_name(s: dict) -> str:
    rows = f"/{s['row_aggregation']}" if s.get("row_aggregation", "max") != "max" else ""
    gate = f"/{s['min_depth_gate']:g}" if "min_depth_gate" in s else ""
    return f"learned:{s['aggregation']}{rows}@{s['threshold']:g}/{s['min_depth']}{gate}"


def replay_setting(data: ReplayData, learned, profile: CostProfile | None, cache: dict,
                   setting: dict, batch_size: int = 1, decision_s: float = 0.0,
                   decision_row_s: float = 0.0) -> dict:
    """The learned stopper replayed with `setting`'s fields (threshold, aggregations,
    min_depth, gate; node scores cached in `cache`): the setting and the ReplayResult."""
    memo = MemoStopper(learned, cache)
    for k, v in setting.items():
        setattr(memo, k, v)
    r = replay(data, memo, profile, name=_setting_name(setting), decision_s=decision_s,
               batch_size=batch_size, decision_row_s=decision_row_s)
    return setting | r.as_dict()


def sweep(data: ReplayData, learned, profile: CostProfile | None, aggregations,
          thresholds=THRESHOLDS, decision_s: float = 0.0, progress: bool = False,
          min_depths=MIN_DEPTHS, batch_size: int = 1, row_aggregations=("max",),
          decision_row_s: float = 0.0) -> list[dict]:
    """Replay the learned stopper at every (aggregation, row aggregation, threshold, min_depth)
    at `batch_size` (`progress`: on stderr); decisions are charged `decision_s` each, where the
    stopper looked, plus `decision_row_s` per further row a batched decision read."""
    from mcsd_runtime.progress import progress as progress_bar

    cache: dict = {}
    grid = [{"aggregation": agg, "row_aggregation": rows, "threshold": float(thr),
             "min_depth": m}
            for agg in aggregations for rows in row_aggregations
            for thr in row_thresholds(rows, batch_size, thresholds)
            for m in min_depths if m < data.depth or m == 1]
    return [replay_setting(data, learned, profile, cache, s, batch_size, decision_s,
                            decision_row_s)
            for s in progress_bar(grid, desc="replay sweep", unit="setting",
                                  disable=not progress)]


def sweep_gates(data: ReplayData, learned, profile: CostProfile | None, chosen: dict,
                gates=GATES, decision_s: float = 0.0, min_depths=MIN_DEPTHS,
                batch_size: int = 1, decision_row_s: float = 0.0) -> list[dict]:
    """Replay the chosen aggregations and threshold at every (min_depth, min_depth_gate); gates
    apply below a min_depth above 1 only."""
    cache: dict = {}
    keep = {k: chosen[k] for k in ("aggregation", "row_aggregation", "threshold")
            if k in chosen}
    return [replay_setting(data, learned, profile, cache,
                            keep | {"min_depth": m, "min_depth_gate": float(gate)}, batch_size,
                            decision_s, decision_row_s)
            for m in min_depths if 1 < m < data.depth for gate in gates]


def baselines(data: ReplayData, profile: CostProfile | None,
              batch_size: int = 1) -> dict[str, ReplayResult]:
    """Static depths 1..D, the built-in heuristics at their defaults, the throughput oracle and
    the accepted-length oracle, at `batch_size` (above 1 `oracle` is `lookahead_schedule`'s, a
    heuristic below the optimum)."""
    out = {f"static:{d}": replay(data, f"static:{d}", profile, batch_size=batch_size)
           for d in range(1, data.depth + 1)}
    for spec in ("heuristic", "confidence", "entropy", "cumprod", "oracle", "oracle-accepted"):
        out[spec] = replay(data, spec, profile, batch_size=batch_size)
    return out
