"""A trained stopper on collections of other domains, never trained on: how well its node scores
are calibrated there (reliability, ECE) and its replayed speed against the static depth a user
would deploy (the best one on the training collection's validation prompts), the domain's
hindsight best static depth, the tuned heuristic and the tuned built-in peer that replayed
fastest on validation.

Replay on another domain's dense collection is exact (as on the training collection), so this
is a cheap first look at transfer; `mcsd eval` over the same prompt sets is the measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

import replay as R
from mcsd_runtime.decisions.features import DECISION_FEATURES
from mcsd_runtime.metrics import oracle_share
from mcsd_runtime.pricing.profile import CostProfile
from replay.runs import load_runs, output_lengths
from train.node_model import expected_calibration_error
from train.stop import labels as L
from train.stop import report

METRIC = "throughput"


def _scored_rows(df: pd.DataFrame, stopper) -> tuple[np.ndarray, np.ndarray]:
    """Hard labels and the stopper's node scores on a collection's decision rows, with the
    trajectory features a decoder would have seen (as training recomputes them)."""
    df = L.walk_trajectory(L.add_labels(df))
    rows = df[df["decision"].to_numpy()]
    x = rows[list(DECISION_FEATURES)].to_numpy(np.float32)
    return rows["label_hard"].to_numpy(), stopper.node_scores(x)


def check_domain(run_dir: str | Path, stopper, deploy: str, heuristic: str,
                 profile: CostProfile, decision_s: float, switch: str | None = None,
                 peer: str | None = None) -> dict:
    """Calibration and replayed speed of `stopper` on one domain's dense collection, against
    autoregressive decoding, the deploy static, the domain's best static, the tuned heuristic,
    (`switch`) the tuned switch peer and (`peer`) the built-in peer that replayed fastest on the
    training validation prompts; the share of the oracle's gain over the best static it
    captures."""
    df, manifests = load_runs([run_dir])
    y, p = _scored_rows(df, stopper)
    data = R.ReplayData(df, stopper.k_config, mode="auto", new_tokens=output_lengths(manifests))
    statics = {f"static:{d}": R.replay(data, f"static:{d}", profile).as_dict()
               for d in range(1, data.depth + 1)}
    best = max(statics, key=lambda k: statics[k][METRIC])
    learned = R.replay(data, stopper, profile, name="learned", decision_s=decision_s).as_dict()
    heur = R.replay(data, heuristic, profile).as_dict()
    oracle = R.replay(data, "oracle", profile).as_dict()
    ar = R.replay(data, R.NeverDraft(), profile, name="ar").as_dict()
    peers = {"heuristic": heur, "oracle": oracle, "ar": ar}
    if switch:
        peers["switch"] = R.replay(data, switch, profile).as_dict()
    if peer:
        peers["peer"] = R.replay(data, peer, profile).as_dict()
    value, best_value = learned[METRIC], statics[best][METRIC]
    captured = oracle_share(value, best_value, oracle[METRIC])
    return {
        "prompts": len(data.prompts), "replay_mode": data.mode,
        "metrics": report.classification_metrics(y, p),
        "ece": expected_calibration_error(y, p), "calibration": report.calibration(y, p),
        "best_static": best, "deploy": deploy, "heuristic": heuristic,
        "learned_vs_deploy": value / statics[deploy][METRIC],
        "learned_vs_best_static": value / statics[best][METRIC],
        "learned_vs_heuristic": value / heur[METRIC],
        "learned_vs_ar": value / ar[METRIC],
        "learned_vs_switch": value / peers["switch"][METRIC] if switch else None,
        "switch": switch,
        "learned_vs_peer": value / peers["peer"][METRIC] if peer else None, "peer": peer,
        "best_static_vs_ar": best_value / ar[METRIC],
        "oracle_gain_captured": float("nan") if captured is None else captured,
        "heuristic_vs_best_static": heur[METRIC] / statics[best][METRIC],
        "oracle_vs_best_static": oracle[METRIC] / statics[best][METRIC],
        # the same bound over schedules that draft at every step: what depth decisions alone
        # can reach; the rest of the oracle's gain needs skipping steps (exact replay only)
        "oracle_drafting_vs_best_static": (
            R.oracle_bound(data, profile, 1, skip=False) / statics[best][METRIC]
            if data.mode == "exact" else None),
        "learned_drafted_per_token": learned["drafted_tokens"] / max(learned["tokens"], 1),
        "replay": {"learned": learned} | peers | statics,
    }


def check_domains(run_dirs: Sequence[Path], stopper, summary: dict, profile: CostProfile) -> dict:
    """`check_domain` for each run folder (keyed by its name), with the deploy static, the tuned
    heuristic and the decision cost of the training summary (metrics.json)."""
    decision_s = summary["headline"]["replay_decision_us"] * 1e-6
    return {Path(d).name: check_domain(d, stopper, summary["deploy_static"],
                                       summary["peers"]["heuristic"], profile, decision_s,
                                       summary["peers"].get("switch"),
                                       summary["headline"].get("best_peer"))
            for d in run_dirs}


def _drafting(d: dict) -> str:
    bound = d.get("oracle_drafting_vs_best_static")
    return "" if bound is None else f", {bound:.3f}x drafting every step"


def format_domains(domains: dict) -> str:
    """One line per domain for the training log, the worst (against the deploy static) first."""
    lines = []
    worst_first = sorted(domains.items(), key=lambda kv: kv[1]["learned_vs_deploy"])
    for name, d in worst_first:
        switch = (f", vs {d['switch']} {d['learned_vs_switch']:.3f}x" if d.get("switch")
                  else "")
        if d.get("peer"):
            switch += f", vs best peer {d['peer']} {d['learned_vs_peer']:.3f}x"
        lines.append(
            f"domain {name}: ROC-AUC {d['metrics'].get('roc_auc', float('nan')):.3f} ECE "
            f"{d['ece']:.3f}; replayed learned vs deploy {d['deploy']} "
            f"{d['learned_vs_deploy']:.3f}x, vs best static {d['best_static']} "
            f"{d['learned_vs_best_static']:.3f}x, vs {d['heuristic']} "
            f"{d['learned_vs_heuristic']:.3f}x{switch}, vs AR {d['learned_vs_ar']:.3f}x; "
            f"oracle's gain captured {d['oracle_gain_captured']:.0%} (oracle "
            f"{d['oracle_vs_best_static']:.3f}x best static{_drafting(d)})")
    return "\n".join(lines)
