"""`train_stopper`: rows -> labels -> grouped split -> model -> metrics -> replay-chosen threshold
and aggregation -> artifact folder. The CLI (`mcsd train`) is a thin layer over this."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from mcsd_runtime.constants import STOPPER_KINDS
from mcsd_runtime.cost import CostProfile
from mcsd_runtime.decision_cost import bench_latency
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.features import DECISION_FEATURES, SCHEMA_VERSION
from mcsd_runtime.learned import AGGREGATIONS, FORMAT, load_stopper
from train import labels as L
from train import replay as R
from train import report
from train.data import (
    check_rows,
    collected_k_config,
    pair_fingerprint,
    prompt_groups,
    sequence_ids,
    split_prompts,
)

LABEL_DOC = {
    "hard": "on_accepted_path and accepted_length > depth (the node is accepted and so is one of "
            "its children)",
    "soft": "product of min(1, p/q) along the path to the node times the best child's min(1, p/q)",
}
PEER_GRID = {"confidence": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
             "cumprod": (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99),
             "entropy": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
             "heuristic": (1, 2, 3, 4, 6, 8)}  # its initial depth budget


def _xy(df: pd.DataFrame, hidden: bool, label: str) -> tuple[np.ndarray, np.ndarray]:
    x = (np.stack(df["hidden"].to_numpy()).astype(np.float32) if hidden
         else df[list(DECISION_FEATURES)].to_numpy(np.float32))
    return x, df[f"label_{label}"].to_numpy(np.float32)


def _vocab_size(fp: dict | None) -> int | None:
    """The target's vocabulary size from its config.json, when the pair is a local folder."""
    try:
        cfg = json.loads((Path(fp["target"]) / "config.json").read_text())
        return int(cfg["vocab_size"])
    except (TypeError, KeyError, OSError, ValueError):
        return None


def _write_spec(out: Path, spec: dict) -> None:
    (out / "stopper.json").write_text(json.dumps(spec, indent=1, default=float) + "\n")


def _slim_manifest(m: dict) -> dict:
    return {k: v for k, v in m.items() if not isinstance(v, (list, dict)) or k in
            ("pair", "pair_fingerprint", "k_config", "counts")}


def train_stopper(df: pd.DataFrame, manifests: list[dict], out: str | Path,
                  model: str = "lightgbm", label: str = "hard",
                  profile: CostProfile | None = None, seed: int = 0, val_frac: float = 0.2,
                  test_frac: float = 0.2, aggregations: tuple[str, ...] | None = None,
                  replay_mode: str = "auto", max_epochs: int | None = None,
                  trajectory: str = "walk", decision_us: float | None = None,
                  check_prompts: int = 0, log=print, progress: bool = True) -> dict:
    """Train one stopper and write its artifact folder; returns the summary (also metrics.json).
    `progress`: show the fit and the replay sweep on stderr (see mcsd_runtime.progress).
    `check_prompts`: decode that many test prompts end to end with every static depth and the
    trained stopper, and report the replay's error against them (`train.check`)."""
    if model not in STOPPER_KINDS:
        raise MCSDError(f"unknown model {model!r}: use one of {', '.join(STOPPER_KINDS)}")
    if label not in LABEL_DOC:
        raise MCSDError(f"unknown label {label!r}: use hard or soft")
    hidden = model == "mlp-hidden"
    check_rows(df, hidden)
    k_config = collected_k_config(manifests)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    measured = profile is not None
    profile = profile or CostProfile.relative()
    aggregations = tuple(aggregations or AGGREGATIONS)
    t_start = time.perf_counter()

    df = L.add_labels(df)
    if trajectory == "walk":  # dense runs: the stored prev_accepted leaks L (see walk_trajectory)
        df = L.walk_trajectory(df)
    elif trajectory != "stored":
        raise MCSDError(f"unknown trajectory {trajectory!r}: walk or stored")
    groups, fallback = prompt_groups(df)
    if fallback:
        log(f"warning: {fallback} prompt(s) have rows without prompt_hash (collected before row "
            f"schema 2), so they are split by run and prompt id: the same prompt in two runs "
            f"can land in two splits; recollect them to split by the prompt itself")
    masks = split_prompts(groups, val_frac, test_frac, seed)
    n_prompts = {k: int(groups[m].nunique()) for k, m in masks.items()}
    dec = df["decision"].to_numpy()
    parts = {k: df[m & dec] for k, m in masks.items()}
    if any(len(p) == 0 for p in parts.values()) or parts["train"]["label_hard"].nunique() < 2:
        raise MCSDError("too little data: each split needs decision rows with both outcomes; "
                        "collect more prompts")
    x_tr, y_tr = _xy(parts["train"], hidden, label)
    x_va, y_va = _xy(parts["val"], hidden, label)
    x_te, _ = _xy(parts["test"], hidden, label)
    log(f"rows: {len(df)} ({int(dec.sum())} decision rows); prompts train/val/test "
        f"{list(n_prompts.values())}; model {model}, label {label}")

    # 1. fit
    t0 = time.perf_counter()
    if model == "lightgbm":
        import torch

        from train.models import fit_lightgbm

        fitted = fit_lightgbm(x_tr, y_tr, x_va, y_va, soft=label == "soft", seed=seed,
                              threads=torch.get_num_threads(), progress=progress)
    else:
        from train.models import HIDDEN_MLP_HIDDEN, MLP_EPOCHS, MLP_HIDDEN, fit_mlp

        fitted = fit_mlp(x_tr, y_tr, x_va, y_va, out, hidden=HIDDEN_MLP_HIDDEN if hidden
                         else MLP_HIDDEN, normalize=not hidden, seed=seed,
                         max_epochs=max_epochs or MLP_EPOCHS, progress=progress)
    fit_s = time.perf_counter() - t0
    fitted.save(out)

    # 2. node-level metrics on held-out prompts
    p_te = fitted.predict(x_te)
    y_te_hard = parts["test"]["label_hard"].to_numpy()
    y_te_soft = parts["test"]["label_soft"].to_numpy() if label == "soft" else None
    metrics = {"test": report.classification_metrics(y_te_hard, p_te, y_te_soft),
               "val": report.classification_metrics(parts["val"]["label_hard"].to_numpy(),
                                                    fitted.predict(x_va))}
    cal = report.calibration(y_te_hard, p_te)
    importance = None
    if model == "lightgbm":
        importance = report.lightgbm_importance(fitted.booster, x_te)
    log(f"fit {fit_s:.1f}s; held-out ROC-AUC {metrics['test'].get('roc_auc', float('nan')):.3f} "
        f"PR-AUC {metrics['test'].get('pr_auc', float('nan')):.3f} "
        f"(positive rate {metrics['test']['positive_rate']:.3f})")

    # 3. a provisional artifact, loaded back through the runtime for replay
    fp = pair_fingerprint(manifests)
    data = R.ReplayData(df, k_config, mode=replay_mode, hidden=hidden)
    spec = {"format": FORMAT, "kind": model, "schema_version": SCHEMA_VERSION,
            "feature_names": list(DECISION_FEATURES),
            "inputs": "hidden" if hidden else "features",
            "hidden_size": int(x_tr.shape[1]) if hidden else None,
            "aggregation": "max", "threshold": 0.5, "label": label,
            "label_definition": LABEL_DOC[label], "pair_fingerprint": fp,
            "k_config": list(data.tree.k_config)}
    _write_spec(out, spec)
    stopper = load_stopper(out)
    latency = bench_latency(stopper, 16, repeats=1000,
                            hidden_size=int(x_tr.shape[1]) if hidden else None)
    vocab = _vocab_size(fp)
    if vocab and not hidden:  # a decision inside the decoder: the features, then the model
        from mcsd_runtime.decision_cost import decision_cost

        cost = decision_cost(stopper, vocab, k_config or (1, 1, 1, 1))
        # the fastest tenth, as the cost profile keeps medians of interleaved rounds: robust to
        # other load on a shared machine
        latency["in_decoder_us"] = cost.get("fast_us")
        latency["in_decoder"] = cost
    # decisions cost real seconds: only add them to a measured (seconds) profile
    # (`decision_us` overrides the benchmark: e.g. the per-decision cost measured inside the
    # decoder, which also computes the frontier's features)
    if decision_us is None:  # the in-decoder cost
        decision_us = latency.get("in_decoder_us") or latency["median_us"]
    decision_s = decision_us * 1e-6 if measured else 0.0

    # 4. replay: choose aggregation and threshold on validation prompts, report on test prompts
    sequences = sequence_ids(df)
    keys = {k: set(sequences[m].unique()) for k, m in masks.items()}
    val, test = data.subset(keys["val"]), data.subset(keys["test"])
    metric = "throughput"
    curve = R.sweep(val, stopper, profile, aggregations, decision_s=decision_s,
                    progress=progress)
    chosen = max(curve, key=lambda c: (c[metric], c["tau"]))
    peers = {}
    for name, grid in PEER_GRID.items():  # tuned peers: best built-in threshold on validation
        best = max(grid, key=lambda t, n=name: R.replay(val, f"{n}:{t}", profile).throughput)
        peers[name] = f"{name}:{best}"
    results = {}
    for split, part in (("val", val), ("test", test)):
        base = R.baselines(part, profile)
        base |= {f"{spec_}(tuned)": R.replay(part, spec_, profile) for spec_ in peers.values()}
        final = load_stopper(out, threshold=chosen["threshold"],
                             aggregation=chosen["aggregation"], min_depth=chosen["min_depth"])
        base["learned"] = R.replay(part, final, profile, name="learned", decision_s=decision_s)
        results[split] = {k: v.as_dict() for k, v in base.items()}
    test_res = results["test"]
    statics = {k: v for k, v in test_res.items() if k.startswith("static:")}
    best_static = max(statics, key=lambda k: statics[k][metric])
    b, o, s = (test_res[best_static][metric], test_res["oracle"][metric],
               test_res["learned"][metric])
    capture = (s - b) / (o - b) if o > b else float("nan")
    headline = {"metric": metric, "units": "tokens/s" if measured else "relative (no profile)",
                "replay_mode": data.mode, "best_static": best_static, "best_static_value": b,
                "oracle_value": o, "learned_value": s, "speedup_vs_best_static": s / b if b else 0,
                "oracle_gain_captured": capture, "aggregation": chosen["aggregation"],
                "threshold": chosen["threshold"], "min_depth": chosen["min_depth"],
                "decision_latency_us": latency["median_us"],
                "replay_decision_us": decision_s * 1e6}
    log(f"replay ({data.mode}, {headline['units']}): learned {s:.4g} vs best static "
        f"{best_static} {b:.4g}, oracle {o:.4g}: {capture:.1%} of the oracle's gain; "
        f"aggregation {chosen['aggregation']}, threshold {chosen['threshold']:g}, decisions "
        f"from depth {chosen['min_depth']}")

    # 5. plots, metrics, final artifact
    title = (f"{model}/{label} on {fp.get('target') if fp else 'pair'} / "
             f"{fp.get('draft') if fp else ''}, k={data.tree.k_config}, "
             f"{n_prompts['val']} validation prompts ({data.mode} replay)")
    lines = {k: v[metric] for k, v in results["val"].items()
             if k.startswith("static:") or k == "oracle"}
    report.plot_replay(curve, chosen, lines, metric, title, out / "replay_curve.png")
    report.plot_calibration(cal, f"calibration, {n_prompts['test']} test prompts",
                            out / "calibration.png")
    if importance:
        report.plot_importance(importance, f"feature importance: {title}", out / "importance.png")
    (out / "replay_curve.json").write_text(json.dumps(
        {"metric": metric, "mode": data.mode, "curve": curve, "chosen": chosen,
         "baselines_val": results["val"]}, indent=1, default=float) + "\n")
    summary = {"model": model, "label": label, "headline": headline, "metrics": metrics,
               "calibration": cal, "importance": importance, "replay": results,
               "peers": peers, "latency": latency, "fit_s": fit_s,
               "profile": {"measured": measured, "note": profile.note, "device": profile.device},
               "elapsed_s": time.perf_counter() - t_start}
    (out / "metrics.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    spec |= {"aggregation": chosen["aggregation"], "threshold": chosen["threshold"],
             "min_depth": chosen["min_depth"],
             "metrics": {"test": metrics["test"], "headline": headline},
             "training_data": {"runs": [_slim_manifest(m) for m in manifests],
                               "rows": int(len(df)), "seed": seed,
                               "prompts": {k: sorted(v) for k, v in keys.items()}},
             "created": datetime.now(UTC).isoformat(timespec="seconds")}
    _write_spec(out, spec)
    load_stopper(out)  # the final artifact must load
    if check_prompts and measured and not hidden:
        from train.check import end_to_end_check, format_check

        stoppers = {f"static:{d}": f"static:{d}" for d in range(1, data.depth + 1)}
        stoppers["learned"] = load_stopper(out)
        check = end_to_end_check(test, manifests, profile, stoppers, limit=check_prompts,
                                 decision_s={"learned": decision_s}, progress=progress)
        log(format_check(check))
        summary["replay_check"] = check
        (out / "metrics.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    return summary
