"""Offline replay of every learned decision, by the step rules of
`mcsd_runtime.pricing.step_model`, priced by a cost profile: the depth stopper over
full-depth collected rows (below), the copy length (`replay.copy`) and the width
(`replay.width`) over the target's own outputs (`collect.outputs`, one walk for both:
`replay.output_walk`); every replay asks its decisions through the engine's planner functions
(`mcsd_runtime.decode.planning.open_step`, `drive`); `replay.check` checks
each replay against end-to-end decoding, `replay.vs_eval` (`mcsd replay`) against a finished
evaluation, and `replay.runs` reads collected runs.

- `replay.data`: the rows arranged by prompt and step (`ReplayData`, `Prompt`, `Step`) and
  the frontier a stopper sees there;
- `replay.depth`: `replay`, a stopper over every prompt, one sequence or a batch at a
  time;
- `replay.oracles`: hindsight stoppers and bounds (`optimal_plan`, `PlanStopper`,
  `AcceptedOracle`, `StepLookahead`, `oracle_bound`);
- `replay.result`: what a decision did over any replay (`ReplayResult`, the depth, ragged,
  copy and width replays' one result), one replayed comparison of a decision against the
  deployed static, the
  best static, its peers and the oracle (`Comparison`), and the one writer of every decision's
  report, the artifact's dicts and the printed table (`Report`);
- `replay.sweeps`: the learned stopper over a grid of settings, scores cached
  (`MemoStopper`, `sweep`, `sweep_gates`, `sweep_skips`, `sweep_online`, `replay_setting`), the
  expected-throughput rule (`sweep_rates`), the tuned
  `switch` peer (`tune_switch`), and `baselines`.

    import replay as R
    data = R.ReplayData(df, new_tokens=output_lengths(manifests))
    R.replay(data, "static:3").throughput, R.replay(data, "oracle").throughput
"""

from replay.data import Prompt, ReplayData, Step
from replay.depth import NeverDraft, lookahead_schedule, replay
from replay.oracles import (
    AcceptedOracle,
    PlanStopper,
    StepLookahead,
    optimal_plan,
    oracle_bound,
)
from replay.result import ReplayResult
from replay.sweeps import (
    GATES,
    MIN_DEPTHS,
    ONLINE_STRENGTHS,
    SKIP_PROBES,
    SKIP_RATES,
    THRESHOLDS,
    MemoStopper,
    baselines,
    replay_setting,
    row_thresholds,
    skip_rates,
    sweep,
    sweep_gates,
    sweep_online,
    sweep_rates,
    sweep_skips,
    tune_switch,
)

__all__ = ["GATES", "MIN_DEPTHS", "ONLINE_STRENGTHS", "SKIP_PROBES", "SKIP_RATES", "THRESHOLDS",
           "AcceptedOracle",
           "MemoStopper", "NeverDraft", "PlanStopper", "Prompt", "ReplayData", "ReplayResult",
           "Step", "StepLookahead", "baselines", "lookahead_schedule", "optimal_plan",
           "oracle_bound", "replay", "replay_setting", "row_thresholds", "skip_rates", "sweep",
           "sweep_gates", "sweep_online", "sweep_rates", "sweep_skips", "tune_switch"]
