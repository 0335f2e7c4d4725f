"""Sweeps over replayed settings: the learned stopper at every threshold, aggregation,
min_depth, gate and skip rate (`sweep`, `sweep_gates`, `sweep_skips`, `replay_setting`; node
scores cached across settings by `MemoStopper`), the expected-throughput rule at the rates
Dinkelbach's iteration visits (`sweep_rates`), the tuned `switch` peer (`tune_switch`), and
the baselines every method is compared with (`baselines`, autoregressive decoding among
them)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mcsd_runtime.decisions.contract import Frontier
from mcsd_runtime.decisions.expected_rate import Calibration, rate_thresholds
from mcsd_runtime.decisions.learned import LearnedStopper
from mcsd_runtime.decisions.skip import DEFAULT_PROBE, SkipGate, break_even_rate
from mcsd_runtime.pricing.profile import CostProfile
from replay.data import ReplayData, _Frontier, replayed
from replay.depth import NeverDraft, replay
from replay.result import ReplayResult


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

    def node_scores_of(self, frontiers: Sequence[Frontier]
                       ) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self._cached(replayed(f)) for f in frontiers]

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


# skip rates tried for the chosen setting (0: a draft at every step), beside the profile's
# break-even rate (`mcsd_runtime.decisions.skip.break_even_rate`), and the probe intervals
SKIP_RATES = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
SKIP_PROBES = (4, 8, 16, 32, 64)


def _kept(chosen: dict, *names: str) -> dict:
    """The fields `names` of a chosen setting that it has."""
    return {k: chosen[k] for k in names if k in chosen}


def _setting_name(s: dict) -> str:
    online = f"/online{s['online_strength']:g}" if s.get("online_strength") else ""
    return _base_name(s) + online


def _base_name(s: dict) -> str:
    if s.get("depth_thresholds"):
        skip = (f"/skip<{s['skip_rate']:g}~{s.get('skip_probe', DEFAULT_PROBE)}"
                if s.get("skip_rate") else "")
        return f"learned:expected-rate@{s['rate']:.4g}{skip}"
    rows = f"/{s['row_aggregation']}" if s.get("row_aggregation", "max") != "max" else ""
    gate = f"/{s['min_depth_gate']:g}" if "min_depth_gate" in s else ""
    skip = (f"/skip<{s['skip_rate']:g}~{s.get('skip_probe', DEFAULT_PROBE)}"
            if s.get("skip_rate") else "")
    return f"learned:{s['aggregation']}{rows}@{s['threshold']:g}/{s['min_depth']}{gate}{skip}"


def skip_rates(data: ReplayData, profile: CostProfile | None) -> list[float]:
    """SKIP_RATES and 0.8, 1 and 1.2x the break-even rate of `profile` on the collection's tree,
    rounded, at most 1 (a rate)."""
    even = break_even_rate(profile or CostProfile.relative(), data.tree)
    near = (min(1.0, round(even * f, 3)) for f in (0.8, 1.0, 1.2) if even < 1)
    return sorted({*SKIP_RATES, *near})


def replay_setting(data: ReplayData, learned, profile: CostProfile | None, cache: dict,
                   setting: dict, batch_size: int = 1, decision_s: float = 0.0,
                   decision_row_s: float = 0.0, calibration: Calibration | None = None) -> dict:
    """The learned stopper replayed with `setting`'s fields (threshold, aggregations,
    min_depth, gate, skip rate and probe, or the expected-throughput rule's `depth_thresholds`;
    node scores cached in `cache`): the setting and the ReplayResult. A `calibration` (the
    rule's) is passed apart from the setting, which stays JSON."""
    memo = MemoStopper(learned, cache)
    memo.calibration = calibration
    for k, v in setting.items():
        if k not in ("skip_rate", "skip_probe", "rate", "rule"):
            setattr(memo, k, v)
    memo.skip = SkipGate(setting.get("skip_rate", 0.0),
                         setting.get("skip_probe", DEFAULT_PROBE))
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
    keep = _kept(chosen, "aggregation", "row_aggregation", "threshold")
    return [replay_setting(data, learned, profile, cache,
                            keep | {"min_depth": m, "min_depth_gate": float(gate)}, batch_size,
                            decision_s, decision_row_s)
            for m in min_depths if 1 < m < data.depth for gate in gates]


def sweep_skips(data: ReplayData, learned, profile: CostProfile | None, chosen: dict,
                decision_s: float = 0.0, rates=None, probes=SKIP_PROBES,
                calibration: Calibration | None = None) -> list[dict]:
    """Replay the chosen setting (threshold or expected-throughput rule, with its
    `calibration`) at every (skip rate, probe): steps without a draft while the recent
    acceptance rate is below the rate (`SkipGate`), at batch size 1. `rates`: default
    `skip_rates` (SKIP_RATES and the profile's break-even rate)."""
    cache: dict = {}
    keep = _kept(chosen, "aggregation", "threshold", "min_depth", "min_depth_gate", "rule",
                 "rate", "depth_thresholds")
    rule = chosen.get("rule") == "expected-rate"
    rates = skip_rates(data, profile) if rates is None else rates
    return [replay_setting(data, learned, profile, cache,
                           keep | {"skip_rate": float(r), "skip_probe": int(n)},
                           decision_s=decision_s, calibration=calibration if rule else None)
            for r in rates if r > 0 for n in probes]


# prior strengths (tokens) of the per-sequence recalibration tried for the chosen setting
ONLINE_STRENGTHS = (0.5, 1.0, 2.0, 4.0)


def sweep_online(data: ReplayData, learned, profile: CostProfile | None, chosen: dict,
                 decision_s: float = 0.0, strengths=ONLINE_STRENGTHS,
                 calibration: Calibration | None = None) -> list[dict]:
    """Replay the chosen setting (threshold or expected-throughput rule, skips included) with
    per-sequence recalibration (`mcsd_runtime.decisions.online`) at every prior strength, at batch
    size 1."""
    cache: dict = {}
    keep = _kept(chosen, "aggregation", "threshold", "min_depth", "min_depth_gate", "skip_rate",
                 "skip_probe", "rule", "rate", "depth_thresholds")
    rule = chosen.get("rule") == "expected-rate"
    return [replay_setting(data, learned, profile, cache,
                           keep | {"online_strength": float(s)}, decision_s=decision_s,
                           calibration=calibration if rule else None)
            for s in strengths]


# multiples of the rate Dinkelbach's iteration settles at, replayed beside it
RATE_FACTORS = (0.8, 0.9, 1.1, 1.25)


def sweep_rates(data: ReplayData, learned, profile: CostProfile | None, chosen: dict,
                calibration: Calibration | None, decision_s: float = 0.0, iterations: int = 5,
                factors=RATE_FACTORS) -> list[dict]:
    """The expected-throughput rule (`mcsd_runtime.decisions.expected_rate`: calibrated node scores
    summed, a threshold per depth of λ × the profile's marginal seconds) with `chosen`'s skip
    setting, at batch size 1: λ starts at autoregressive decoding's replayed throughput and
    becomes the rule's own throughput until it settles (Dinkelbach), then `factors` of the
    best one. Every replayed point, in that order."""
    cache: dict = {}
    keep = {"aggregation": "sum", "min_depth": 1, "min_depth_gate": 0.0,
            "skip_rate": chosen.get("skip_rate", 0.0),
            "skip_probe": chosen.get("skip_probe", DEFAULT_PROBE)}

    def at(rate: float) -> dict:
        depths = list(rate_thresholds(profile or CostProfile.relative(), data.tree, rate))
        return replay_setting(data, learned, profile, cache,
                              keep | {"rate": rate, "threshold": depths[0] if depths else 1.0,
                                      "depth_thresholds": depths},
                              decision_s=decision_s, calibration=calibration)

    if data.depth < 2:
        return []
    rate, points = replay(data, NeverDraft(), profile, name="ar").throughput, []
    for _ in range(iterations):
        points.append(at(rate))
        new = points[-1]["throughput"]
        if abs(new - rate) <= 0.005 * rate:
            break
        rate = new
    best = max(points, key=lambda p: p["throughput"])["rate"]
    return points + [at(best * f) for f in factors]


def tune_switch(data: ReplayData, profile: CostProfile | None, depth: int,
                rates=None, probes=SKIP_PROBES) -> str:
    """The `switch:RATE:DEPTH:PROBE` spec with the best replayed throughput on `data` at the
    static `depth` (a user's deployed depth, switched off where acceptance drops)."""
    rates = skip_rates(data, profile) if rates is None else rates
    specs = [f"switch:{r:g}:{depth}:{n}" for r in rates if r > 0 for n in probes]
    return max(specs, key=lambda spec: replay(data, spec, profile).throughput)


def baselines(data: ReplayData, profile: CostProfile | None,
              batch_size: int = 1) -> dict[str, ReplayResult]:
    """Autoregressive decoding (`ar`), static depths 1..D, the built-in heuristics at their
    defaults, the throughput oracle and the accepted-length oracle, at `batch_size` (above 1
    `oracle` is `lookahead_schedule`'s, a heuristic below the optimum)."""
    out = {"ar": replay(data, NeverDraft(), profile, name="ar", batch_size=batch_size)}
    out |= {f"static:{d}": replay(data, f"static:{d}", profile, batch_size=batch_size)
            for d in range(1, data.depth + 1)}
    for spec in ("heuristic", "confidence", "entropy", "cumprod", "oracle", "oracle-accepted"):
        out[spec] = replay(data, spec, profile, batch_size=batch_size)
    return out
