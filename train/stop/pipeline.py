"""The depth stopper's stages after the node model's (`train.node_model`: rows -> labels ->
grouped split -> model -> metrics): replay-chosen threshold and aggregation -> artifact folder ->
end-to-end check. `train.stop.trainer.StopTrainer` runs them as `train.decision` runs every
decision's:

    prep = prepare(df, manifests, config)             # train.node_model: labels, split, arrays
    fitted = fit(prep, config, out)                   # train.node_model: model files, metrics
    choice = choose(prep, manifests, fitted.folder, config)  # latency, replay, peers, headline
    summary = write(prep, fitted, choice, manifests, out, config)  # plots, metrics, stopper.json
    checks = replay_checks(choice, final, manifests, config)  # decoded end to end
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import replay as R
from mcsd_runtime.benchmarks.decision_cost import stopper_latency
from mcsd_runtime.decisions.aggregation import AGGREGATIONS, ROW_AGGREGATIONS
from mcsd_runtime.decisions.artifact import ArtifactSpec, BatchSetting
from mcsd_runtime.decisions.expected_rate import Calibration
from mcsd_runtime.decisions.learned import LearnedStopper, load_stopper, stopper_from
from mcsd_runtime.decisions.skip import DEFAULT_PROBE
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from replay.result import Comparison
from replay.runs import (
    collected_prompt_format,
    output_lengths,
    pair_fingerprint,
    sequence_ids,
)
from train.node_model import (
    Fit,
    Log,
    Prepared,
    ece_by_depth,
    fit_calibration,
    provisional_spec,
    write_json,
)
from train.stop import report
from train.stop.config import TrainConfig

if TYPE_CHECKING:
    pass

PEER_GRID = {"confidence": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
             "cumprod": (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99),
             "entropy": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
             "heuristic": (1, 2, 3, 4, 6, 8)}  # its initial depth budget
METRIC = "throughput"  # what the replay maximizes and reports
UNREACHABLE = 2.0  # a threshold no frontier score (in [0, 1]) reaches: a static depth


def _slim_manifest(m: dict) -> dict:
    return {k: v for k, v in m.items() if not isinstance(v, (list, dict)) or k in
            ("pair", "pair_fingerprint", "k_config", "counts")}


# ------------------------------------------------------------------ 3. choose
@dataclass
class Choice:
    """The replay's verdict: aggregation, threshold and min_depth chosen on validation prompts,
    every method replayed on validation and test prompts, and the headline."""

    spec: ArtifactSpec  # the provisional stopper.json (aggregation max, threshold 0.5)
    data: R.ReplayData  # every prompt; its mode, tree and depth
    sequences: dict[str, set]  # split -> sequence ids
    profile: CostProfile  # the given one, or a relative one
    measured: bool  # whether a (seconds) profile was given
    latency: dict  # bench_latency, with the in-decoder cost where the pair is local
    decision_s: float  # seconds the replay charges per decision
    curve: list[dict]  # the validation sweep
    chosen: dict  # its best point
    peers: dict[str, str]  # built-in stopper -> its tuned spec
    results: dict[str, dict]  # "val"/"test" -> method -> ReplayResult.as_dict()
    headline: dict
    # batch size above 1 -> its sweep, chosen setting, results and headline (`choose_batch`)
    batches: dict[int, dict] = field(default_factory=dict)
    calibration: Calibration | None = None  # fitted on validation rows (the rule reads it)
    rates: list[dict] = field(default_factory=list)  # the rule's replayed points
    ece: dict = field(default_factory=dict)  # ece_by_depth on test rows


def _spec_fields(setting: dict, calibration: Calibration | None) -> dict:
    """The stopper.json fields of a chosen setting: its threshold or its expected-throughput
    rule (per-depth thresholds and the calibration), aggregation, min_depth, gate, skip and
    online recalibration."""
    out = {k: setting[k] for k in ("threshold", "aggregation", "min_depth", "min_depth_gate",
                                   "skip_rate", "skip_probe")}
    out["online_strength"] = setting.get("online_strength", 0.0)
    rule = setting.get("rule") == "expected-rate"
    return out | {"depth_thresholds": tuple(setting["depth_thresholds"]) if rule else None,
                  "calibration": calibration if rule else None}


def deploy_static(results: dict[str, dict]) -> str:
    """The static depth a user would deploy: the best replayed one on validation prompts."""
    statics = {k: v for k, v in results.items() if k.startswith("static:")}
    return max(statics, key=lambda k: statics[k][METRIC])


def best_peer(results: dict[str, dict]) -> str | None:
    """The tuned built-in peer (a `NAME:SETTING(tuned)` entry) replayed fastest in `results`."""
    tuned = [k for k in results if k.endswith("(tuned)")]
    return max(tuned, key=lambda k: results[k][METRIC]).removesuffix("(tuned)") if tuned else None


def _comparison(results: dict, split: str, facts: dict) -> Comparison:
    """`split`'s replayed methods compared (`report.HEADLINE`): the learned stopper against the
    split's best static, the oracle, AR and the built-in peer tuned fastest on validation."""
    methods, peer = results[split], best_peer(results["val"])
    best = deploy_static(methods)
    return Comparison(split, {m: r.get(METRIC) for m, r in methods.items()}, best, best,
                      peer=f"{peer}(tuned)" if peer else None, facts=facts)


def _headline(results: dict, chosen: dict, mode: str, measured: bool, latency: dict,
              decision_s: float, batch_size: int | None = None) -> tuple[dict, str]:
    """The headline (metrics.json: the test prompts' comparison, `report.HEADLINE`) and the
    printed table of the validation and test prompts'."""
    facts = {"metric": METRIC, "units": "tokens/s" if measured else "relative (no profile)",
             "mode": mode, "chosen": chosen, "latency_us": latency["median_us"],
             "decision_s": decision_s} | ({"batch_size": batch_size} if batch_size else {})
    (_, headline), table = report.HEADLINE.write([_comparison(results, split, facts)
                                                  for split in ("val", "test")])
    return headline, table


def _warn_if_a_peer_wins(results: dict, headline: dict, log: Log) -> None:
    """Say so when a tuned built-in peer replays faster than the learned stopper on validation:
    the user may be better served by it."""
    peer, val = headline["best_peer"], results["val"]
    if peer and val[f"{peer}(tuned)"][METRIC] > val["learned"][METRIC]:
        log(f"note: the tuned built-in {peer} replays faster than the learned stopper on "
            f"validation ({val[f'{peer}(tuned)'][METRIC]:.4g} vs {val['learned'][METRIC]:.4g}; "
            f"test: learned/{peer} {headline['learned_vs_best_peer']:.3f}); consider "
            f"deploying that stopper spec")


def choose(prep: Prepared, manifests: list[dict], out: str | Path, config: TrainConfig,
           profile: CostProfile | None = None, log: Log = print) -> Choice:
    """With a provisional stopper description (in memory) of the fitted model in `out`, choose
    the aggregation, threshold and min_depth by replayed throughput on validation prompts, tune the
    built-in peers there, and replay everything on validation and test prompts."""
    out = Path(out)
    measured = profile is not None
    profile = profile or CostProfile.relative()
    fp = pair_fingerprint(manifests)
    data = R.ReplayData(prep.df, prep.k_config, mode=config.replay_mode, hidden=config.hidden,
                        new_tokens=output_lengths(manifests))
    spec = provisional_spec(prep, config, fp, data.tree.k_config,
                             collected_prompt_format(manifests))
    stopper = stopper_from(spec, out)
    latency = stopper_latency(stopper, prep.n_inputs if config.hidden else None, fp, prep.k_config)
    decision_s = _decision_seconds(config, latency, measured)

    sequences = sequence_ids(prep.df)
    keys = {k: set(sequences[m].unique()) for k, m in prep.masks.items()}
    val, test = data.subset(keys["val"]), data.subset(keys["test"])
    curve, chosen, no_skip = _choose_threshold(val, stopper, profile, config, decision_s)
    # the expected-throughput rule on calibrated scores, with the same skips and without; it
    # replaces the threshold only where it replays faster on validation prompts (ties: the
    # threshold)
    calibration = fit_calibration(stopper.node_scores(prep.x["val"]),
                                  prep.parts["val"]["label_hard"].to_numpy())
    chosen, by_rule, rates = _choose_rule(val, stopper, profile, chosen, no_skip, calibration,
                                          config, decision_s)
    peers = _tune_peers(val, profile, data.depth)
    learned = {f"learned({rule}{tail})": setting  # both rules
               for rules, tail in ((by_rule, ""), (no_skip, ", no skip"))
               for rule, setting in rules.items()}
    results = _replay_splits({"val": val, "test": test}, peers, learned, chosen, spec, out,
                             profile, calibration, decision_s)
    headline, table = _headline(results, chosen, data.mode, measured, latency, decision_s)
    log(_replay_line(headline, table, chosen, data.mode))
    _warn_if_a_peer_wins(results, headline, log)
    test_scores = stopper.node_scores(prep.x["test"])
    choice = Choice(spec, data, keys, profile, measured, latency, decision_s, curve, chosen,
                    peers, results, headline, calibration=calibration, rates=rates,
                    ece=ece_by_depth(prep.parts["test"]["depth"].to_numpy(),
                                     prep.parts["test"]["label_hard"].to_numpy(), test_scores,
                                     calibration))
    for b in config.batch_sizes[1:]:
        choice.batches[b] = choose_batch(choice, stopper, out, b, config, log)
    return choice


def _decision_seconds(config: TrainConfig, latency: dict, measured: bool) -> float:
    """Seconds the replay charges per stopper decision: `decision_us` (default: the benchmarked
    latency, in the decoder where measured there), and none on a relative profile."""
    # decisions cost real seconds: only added to a measured (seconds) profile; `decision_us`
    # overrides the benchmark (e.g. a per-decision cost measured inside the decoder)
    decision_us = config.decision_us
    if decision_us is None:
        decision_us = latency.get("in_decoder_us") or latency["median_us"]
    return decision_us * 1e-6 if measured else 0.0


def _choose_threshold(val: R.ReplayData, stopper: LearnedStopper, profile: CostProfile,
                      config: TrainConfig, decision_s: float
                      ) -> tuple[list[dict], dict, dict[str, dict]]:
    """The validation sweep over aggregations, thresholds and min_depths, and the best setting
    of the threshold rule: its depth gate, then its skips; also that setting without skips,
    as {"threshold": setting} (`_choose_rule` adds the no-skip expected-rate setting)."""
    curve = R.sweep(val, stopper, profile, config.aggregations or tuple(AGGREGATIONS),
                    decision_s=decision_s, progress=config.progress)
    chosen = max(curve, key=lambda c: (c[METRIC], c["tau"])) | {"min_depth_gate": 0.0}
    gated = R.sweep_gates(val, stopper, profile, chosen, decision_s=decision_s)
    chosen = max([chosen, *gated], key=lambda c: c[METRIC])  # ties keep the ungated choice
    chosen |= {"skip_rate": 0.0, "skip_probe": DEFAULT_PROBE, "rule": "threshold"}
    # steps without a draft where acceptance is too low for drafting to pay (ties: none)
    no_skip = {"threshold": chosen}
    chosen = max([chosen, *R.sweep_skips(val, stopper, profile, chosen, decision_s=decision_s)],
                 key=lambda c: c[METRIC])
    return curve, chosen, no_skip


def _choose_rule(val: R.ReplayData, stopper: LearnedStopper, profile: CostProfile,
                 chosen: dict, no_skip: dict[str, dict], calibration: Calibration,
                 config: TrainConfig, decision_s: float
                 ) -> tuple[dict, dict[str, dict], list[dict]]:
    """The expected-rate rule swept beside the threshold setting `chosen` (with its skips) and
    beside the one in `no_skip` (without; its best point is added to `no_skip`), the faster
    rule on validation prompts kept, then online recalibration where asked for and faster
    (ties: off). Returns the setting, the settings by rule (with skips) and the rule's
    replayed points."""
    rates = []
    by_rule = {"threshold": chosen}
    for rules, base in ((by_rule, chosen), (no_skip, no_skip["threshold"])):
        points = R.sweep_rates(val, stopper, profile, base, calibration, decision_s=decision_s)
        rates += points
        if points:
            rules["expected-rate"] = max(points, key=lambda c: c[METRIC]) | {
                "rule": "expected-rate"}
    chosen = max(by_rule.values(), key=lambda c: c[METRIC])
    # per-sequence recalibration from the acceptances seen, if asked for, where it replays
    # faster (ties: off)
    online = R.sweep_online(val, stopper, profile, chosen, decision_s=decision_s,
                            calibration=calibration) if config.online else []
    chosen = max([chosen | {"online_strength": 0.0}, *online], key=lambda c: c[METRIC])
    return chosen, by_rule, rates


def _best_peer(val: R.ReplayData, name: str, grid, profile: CostProfile,
               batch_size: int = 1) -> str:
    """`name:T`, T the threshold of `grid` whose replay on `val` is fastest (the first of
    equals)."""
    best = max(grid, key=lambda t: R.replay(val, f"{name}:{t}", profile,
                                            batch_size=batch_size).throughput)
    return f"{name}:{best}"


def _tune_peers(val: R.ReplayData, profile: CostProfile, depth: int) -> dict[str, str]:
    """Each built-in stopper's spec at its best threshold on validation prompts (`PEER_GRID`),
    and the deployed static depth switched off where acceptance drops (TensorRT-LLM, vLLM)."""
    # tuned peers: best built-in threshold on validation
    peers = {name: _best_peer(val, name, grid, profile) for name, grid in PEER_GRID.items()}
    # the deployed static depth, switched off where acceptance drops (TensorRT-LLM, vLLM)
    deploy = int(deploy_static({k: R.replay(val, k, profile).as_dict()
                                for k in (f"static:{d}" for d in range(1, depth + 1))})
                 .split(":")[1])
    peers["switch"] = R.tune_switch(val, profile, deploy)
    return peers


def _replay_splits(parts: dict[str, R.ReplayData], peers: dict[str, str],
                   learned: dict[str, dict], chosen: dict, spec: ArtifactSpec, out: Path,
                   profile: CostProfile, calibration: Calibration, decision_s: float
                   ) -> dict[str, dict]:
    """Every method replayed on each split (name -> data): the baselines, the tuned `peers`,
    each `learned` setting (name -> setting) and the `chosen` one (`learned`); on exact test
    replay also the oracle bounds. Returns split -> method -> ReplayResult.as_dict()."""
    results = {}
    for split, part in parts.items():
        base = R.baselines(part, profile)
        base |= {f"{p}(tuned)": R.replay(part, p, profile) for p in peers.values()}
        for name, setting in learned.items():
            base[name] = R.replay(part, stopper_from(spec, out,
                                                     **_spec_fields(setting, calibration)),
                                  profile, name=name, decision_s=decision_s)
        final = stopper_from(spec, out, **_spec_fields(chosen, calibration))
        base["learned"] = R.replay(part, final, profile, name="learned", decision_s=decision_s)
        results[split] = {k: v.as_dict() for k, v in base.items()}
        if split == "test" and part.mode == "exact":  # the optimum, and that of depths alone
            results[split]["oracle-bound"] = {METRIC: R.oracle_bound(part, profile, 1)}
            results[split]["oracle-bound(drafting)"] = {
                METRIC: R.oracle_bound(part, profile, 1, skip=False)}
    return results


def _replay_line(headline: dict, table: str, chosen: dict, mode: str) -> str:
    """The log of the replay's verdict: the learned stopper against the best static and the
    oracle (`report.HEADLINE`'s table), and the setting chosen."""
    return (
        f"replay ({mode}, {headline['units']}):\n{table}\n(share: of the oracle's gain over the "
        f"best static, the learned stopper's; drafting, share*: the same for the optimum over "
        f"schedules that draft at every step, what depth decisions alone can add; best peer: "
        f"the built-in stopper tuned fastest on validation prompts)\n"
        f"chosen: aggregation {chosen['aggregation']}, threshold "
        f"{chosen['threshold']:g}, decisions from depth {chosen['min_depth']} while the recent "
        f"acceptance rate is >= {chosen['min_depth_gate']:g}, else from depth 1; no draft "
        f"while the recent acceptance rate is below {chosen['skip_rate']:g} (probing every "
        f"{chosen['skip_probe']} steps); rule {chosen['rule']}"
        + (f" at {chosen['rate']:.4g} tokens/s (thresholds by depth "
           f"{', '.join(f'{t:.3g}' for t in chosen['depth_thresholds'])})"
           if chosen["rule"] == "expected-rate" else "")
        + "; online recalibration "
        + (f"strength {chosen['online_strength']:g}" if chosen["online_strength"] else "off"))


def check_batch_sizes(config: TrainConfig, profile: CostProfile | None) -> None:
    """Refuse batch sizes above 1 without a profile measured at them, before any work."""
    if config.batch_sizes[-1] == 1:
        return
    if profile is None:
        raise MCSDError("--batch-size above 1 needs a measured --cost-profile "
                        "(`mcsd profile --batch-size ...`)")
    profile.check_rows(config.batch_sizes[-1])


def choose_batch(choice: Choice, stopper: LearnedStopper, out: str | Path, batch_size: int,
                 config: TrainConfig, log: Log = print) -> dict:
    """The setting for `batch_size` rows, chosen by batched replay on validation prompts: the
    node aggregation chosen alone, every row aggregation, threshold and min_depth, and every
    static depth (a threshold no score reaches), then gates; peers tuned and every method
    replayed at that batch size on validation and test prompts, with `oracle` (there the step
    lookahead, `train.replay.StepLookahead`: a hindsight heuristic below the optimum) and
    `oracle-bound` (above every schedule)."""
    val = choice.data.subset(choice.sequences["val"])
    test = choice.data.subset(choice.sequences["test"])
    profile, b = choice.profile, batch_size
    costs: dict[str, Any] = {"decision_s": choice.decision_s,
                             "decision_row_s": choice.latency.get("batch_row_us", 0.0) * 1e-6
                             if choice.measured else 0.0}
    curve = R.sweep(val, stopper, profile, (choice.chosen["aggregation"],), batch_size=b,
                    row_aggregations=tuple(ROW_AGGREGATIONS), progress=config.progress,
                    **costs)
    # static depths as settings (a threshold no score reaches: min_depth depths, no model
    # call), so that the table falls back to a static depth where deciding does not pay
    cache: dict = {}
    curve += [R.replay_setting(val, stopper, profile, cache,
                               {"aggregation": choice.chosen["aggregation"],
                                "row_aggregation": "max", "threshold": UNREACHABLE,
                                "min_depth": m}, b, **costs)
              for m in range(1, choice.data.depth + 1)]
    chosen = max(curve, key=lambda c: (c[METRIC], c["tau"])) | {"min_depth_gate": 0.0}
    gated = R.sweep_gates(val, stopper, profile, chosen, batch_size=b,
                          min_depths=sorted({*R.MIN_DEPTHS, chosen["min_depth"]}), **costs)
    chosen = max([chosen, *gated], key=lambda c: c[METRIC])
    setting = BatchSetting(**{k: chosen[k] for k in ("threshold", "aggregation",
                                                     "row_aggregation", "min_depth",
                                                     "min_depth_gate")})
    final = stopper_from(choice.spec, out, batch={b: setting})
    peers = {name: _best_peer(val, name, grid, profile, b) for name, grid in PEER_GRID.items()}
    results = {}
    for split, part in (("val", val), ("test", test)):
        base = R.baselines(part, profile, b)
        base |= {f"{p}(tuned)": R.replay(part, p, profile, batch_size=b) for p in peers.values()}
        base["learned"] = R.replay(part, final, profile, name="learned", batch_size=b, **costs)
        results[split] = {k: v.as_dict() for k, v in base.items()}
        if part.mode == "exact":
            results[split]["oracle-bound"] = {METRIC: R.oracle_bound(part, profile, b)}
    headline, table = _headline(results, chosen, choice.data.mode, choice.measured,
                                choice.latency, choice.decision_s, batch_size=b)
    log(f"batch {b} ({headline['units']}; oracle: the step lookahead, a hindsight heuristic "
        f"below the optimum):\n{table}\nbatch {b} chosen: rows {chosen['row_aggregation']} of "
        f"{chosen['aggregation']}, threshold {chosen['threshold']:g}, min_depth "
        f"{chosen['min_depth']} (gate {chosen['min_depth_gate']:g})")
    return {"curve": curve, "chosen": chosen, "setting": setting, "peers": peers,
            "results": results, "headline": headline}


# ------------------------------------------------------------------ 4. write

def _plots(prep: Prepared, fitted: Fit, choice: Choice, out: Path, config: TrainConfig) -> None:
    """replay_curve.png, calibration.png and (where there is one) importance.png in `out`."""
    data, fp = choice.data, choice.spec.pair_fingerprint
    from mcsd_runtime.paths import short_model_name as short

    pair = f"{short(fp.get('target'))} / {short(fp.get('draft'))}" if fp else "pair"
    k = str(data.tree.k_config)
    what = f"{config.model} ({config.label} labels), {pair}, k={k}"
    lines = {k: v[METRIC] for k, v in choice.results["val"].items()
             if k.startswith("static:") or k == "oracle"}
    report.plot_replay(
        choice.curve, choice.chosen, lines, METRIC,
        f"Choosing the threshold: replay on {prep.n_prompts['val']} VALIDATION prompts "
        f"({data.mode}; metrics.json's headline is on the {prep.n_prompts['test']} test "
        f"prompts)\n{what}", out / "replay_curve.png",
        units=choice.headline["units"])
    report.plot_calibration({"stopper": fitted.calibration},
                            f"calibration on {prep.n_prompts['test']} test prompts: {what}",
                            out / "calibration.png")
    if fitted.importance:
        report.plot_importance(fitted.importance, f"feature importance, "
                               f"{prep.n_prompts['test']} test prompts: {what}",
                               out / "importance.png")


def write(prep: Prepared, fitted: Fit, choice: Choice, manifests: list[dict], out: str | Path,
          config: TrainConfig, log: Log = print, started: float | None = None) -> dict:
    """Plots, replay_curve.json, metrics.json and the final stopper.json in `out`, then the
    optional end-to-end check (config.check_prompts); returns the summary (metrics.json).
    `started`: the run's time.perf_counter() start, for elapsed_s."""
    out = Path(out)
    _plots(prep, fitted, choice, out, config)
    write_json(out / "replay_curve.json",
                {"metric": METRIC, "mode": choice.data.mode, "curve": choice.curve,
                 "chosen": choice.chosen, "baselines_val": choice.results["val"],
                 "batches": {str(b): {"curve": c["curve"], "chosen": c["chosen"]}
                             for b, c in choice.batches.items()}})
    profile = choice.profile
    summary = {"model": config.model, "label": config.label, "headline": choice.headline,
               "metrics": fitted.metrics, "calibration": fitted.calibration,
               "importance": fitted.importance, "replay": choice.results,
               "calibration_by_depth": choice.ece, "expected_rate_sweep": choice.rates,
               "peers": choice.peers, "deploy_static": deploy_static(choice.results["val"]),
               "latency": choice.latency, "fit_s": fitted.fit_s,
               "profile": {"measured": choice.measured, "note": profile.note,
                           "device": profile.device},
               "elapsed_s": time.perf_counter() - started if started is not None else None}
    if choice.batches:  # chosen, peers, results and headline at each batch size above 1
        summary["batches"] = {str(b): {k: v for k, v in c.items() if k not in ("curve", "setting")}
                              for b, c in choice.batches.items()}
    write_json(out / "metrics.json", summary)
    chosen = choice.chosen
    spec = replace(
        choice.spec, **_spec_fields(chosen, choice.calibration),
        batch={b: c["setting"] for b, c in choice.batches.items()} or None,
        metrics={"test": fitted.metrics["test"], "headline": choice.headline}
        | ({"batches": {str(b): c["headline"] for b, c in choice.batches.items()}}
           if choice.batches else {}),
        training_data={"runs": [_slim_manifest(m) for m in manifests],
                       "rows": int(len(prep.df)), "seed": config.seed,
                       "prompts": {k: sorted(v) for k, v in choice.sequences.items()}},
        created=datetime.now(UTC).isoformat(timespec="seconds"))
    spec.write(out)
    load_stopper(out)  # the final artifact must load
    return summary


def replay_checks(choice: Choice, final: LearnedStopper, manifests: list[dict],
                  config: TrainConfig, log: Log = print) -> dict:
    """The end-to-end check of replay against decoding (config.check_prompts test prompts) at
    batch size 1 (`replay_check`) and each larger one (`batches`: by size, as a string)."""
    from replay.check import format_check
    from replay.check import stopper_check as end_to_end_check

    data, profile = choice.data, choice.profile
    stoppers: dict[str, Any] = {f"static:{d}": f"static:{d}" for d in range(1, data.depth + 1)}
    stoppers["learned"] = final
    test = data.subset(choice.sequences["test"])
    check = end_to_end_check(test, manifests, profile, stoppers, limit=config.check_prompts,
                             decision_s={"learned": choice.decision_s}, progress=config.progress)
    log(format_check(check))
    checks: dict = {"replay_check": check, "batches": {}}
    row_s = choice.latency.get("batch_row_us", 0.0) * 1e-6
    for b in choice.batches:  # the same prompts decoded together, 3 rounds per size
        check = end_to_end_check(test, manifests, profile, stoppers, limit=config.check_prompts,
                                 batch_size=b, repeats=3,
                                 decision_s={"learned": choice.decision_s},
                                 decision_row_s={"learned": row_s}, progress=config.progress)
        log(format_check(check))
        checks["batches"][str(b)] = check
    return checks
