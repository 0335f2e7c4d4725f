"""What every trainer of a node model shares (the depth stopper's, `train.stop`, and the
verification budget's, `train.budget`): preparing collected rows into labelled, grouped splits
(`prepare`), fitting the model on them (`fit`), the provisional artifact spec of the fit
(`provisional_spec`), and the calibration of node scores for the expected-throughput rule: an
isotonic map fitted on validation rows (`fit_calibration`), the expected calibration error
(`expected_calibration_error`, the one definition the per-category report also reads) and the
ECE by depth before and after the map (`ece_by_depth`), which metrics.json reports on test rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from mcsd_runtime.decisions.artifact import ArtifactSpec
from mcsd_runtime.decisions.expected_rate import Calibration
from mcsd_runtime.decisions.features import SCHEMA_VERSION
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import atomic_write_text
from mcsd_runtime.tree import KConfig
from replay.runs import check_rows, collected_k_config, prompt_groups, split_prompts
from train.stop import labels as L
from train.stop import report
from train.stop.config import LABEL_DOC, TrainConfig

if TYPE_CHECKING:
    from train.stop.models import LightGBMModel, MLPModel

SPLITS = ("train", "val", "test")
Log = Callable[[str], object]


def _xy(df: pd.DataFrame, config: TrainConfig) -> tuple[np.ndarray, np.ndarray]:
    x = (np.stack(df["hidden"].tolist()).astype(np.float32) if config.hidden
         else df[list(config.feature_names)].to_numpy(np.float32))
    return x, df[f"label_{config.label}"].to_numpy(np.float32)


def write_json(path: Path, obj: dict) -> None:
    """`obj` as indented JSON (numpy scalars as floats), through a temporary file."""
    atomic_write_text(path, json.dumps(obj, indent=1, default=float) + "\n")


# ------------------------------------------------------------------ prepare
@dataclass
class Prepared:
    """Labelled rows, their grouped split, and each split's decision rows as model arrays."""

    df: pd.DataFrame  # every row, labelled, with the trajectory features trained on
    masks: dict[str, np.ndarray]  # split -> boolean row mask over df
    n_prompts: dict[str, int]  # split -> prompts in it
    parts: dict[str, pd.DataFrame]  # split -> its decision rows
    x: dict[str, np.ndarray]  # split -> model inputs of parts[split]
    y: dict[str, np.ndarray]  # split -> the configured label of parts[split]
    k_config: KConfig | None  # the collected tree (None: not recorded)

    @property
    def n_inputs(self) -> int:
        return int(self.x["train"].shape[1])


def prepare(df: pd.DataFrame, manifests: list[dict], config: TrainConfig,
            log: Log = print) -> Prepared:
    """Label the rows, recompute dense trajectories (config.trajectory), split prompts."""
    check_rows(df, config.hidden)
    k_config = collected_k_config(manifests)
    df = L.add_labels(df)
    if config.trajectory == "walk":  # dense runs: the stored prev_accepted leaks L
        df = L.walk_trajectory(df)
    groups, fallback = prompt_groups(df)
    if fallback:
        log(f"warning: {fallback} prompt(s) have rows without prompt_hash (collected before row "
            f"schema 2), so they are split by run and prompt id: the same prompt in two runs "
            f"can land in two splits; recollect them to split by the prompt itself")
    masks = split_prompts(groups, config.val_frac, config.test_frac, config.seed)
    n_prompts = {k: int(groups[m].nunique()) for k, m in masks.items()}
    dec = df["decision"].to_numpy()
    parts = {k: df[m & dec] for k, m in masks.items()}
    if any(len(p) == 0 for p in parts.values()) or parts["train"]["label_hard"].nunique() < 2:
        raise MCSDError("too little data: each split needs decision rows with both outcomes; "
                        "collect more prompts")
    xy = {k: _xy(parts[k], config) for k in SPLITS}
    log(f"rows: {len(df)} ({int(dec.sum())} decision rows); prompts train/val/test "
        f"{list(n_prompts.values())}; model {config.model}, label {config.label}"
        + ("" if config.features == "all" else f", features {config.features}"))
    return Prepared(df, masks, n_prompts, parts, {k: v[0] for k, v in xy.items()},
                    {k: v[1] for k, v in xy.items()}, k_config)


# ------------------------------------------------------------------ fit
@dataclass
class Fit:
    """The fitted model (its files already in the artifact folder) and node-level metrics."""

    model: LightGBMModel | MLPModel
    fit_s: float
    metrics: dict  # "test"/"val" -> report.classification_metrics
    calibration: dict  # on test
    importance: dict | None  # on test rows; None for mlp-hidden (its inputs are hidden states)
    folder: Path  # where its model files are


def fit(prep: Prepared, config: TrainConfig, out: str | Path, log: Log = print) -> Fit:
    """Fit config.model on the train split (validation for early stopping), save its model
    files to `out`, and score it on held-out decision rows."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    x_tr, y_tr, x_va, y_va, x_te = (prep.x["train"], prep.y["train"], prep.x["val"],
                                    prep.y["val"], prep.x["test"])
    t0 = time.perf_counter()
    model: LightGBMModel | MLPModel
    booster = None  # LightGBM's
    if config.model == "lightgbm":
        import torch

        from train.stop.models import fit_lightgbm

        model = fit_lightgbm(x_tr, y_tr, x_va, y_va, soft=config.label == "soft",
                             seed=config.seed, threads=torch.get_num_threads(),
                             progress=config.progress, names=config.feature_names)
        booster = model.booster
    else:
        from train.stop.config import HIDDEN_MLP_HIDDEN, MLP_EPOCHS, MLP_HIDDEN
        from train.stop.models import fit_mlp

        model = fit_mlp(x_tr, y_tr, x_va, y_va, out,
                        hidden=HIDDEN_MLP_HIDDEN if config.hidden else MLP_HIDDEN,
                        normalize=not config.hidden, seed=config.seed,
                        max_epochs=config.max_epochs or MLP_EPOCHS, progress=config.progress)
    fit_s = time.perf_counter() - t0
    model.save(out)

    test = prep.parts["test"]
    p_te, y_te_hard = model.predict(x_te), test["label_hard"].to_numpy()
    y_te_soft = test["label_soft"].to_numpy() if config.label == "soft" else None
    metrics = {"test": report.classification_metrics(y_te_hard, p_te, y_te_soft),
               "val": report.classification_metrics(prep.parts["val"]["label_hard"].to_numpy(),
                                                    model.predict(x_va))}
    names = config.feature_names
    importance = (report.lightgbm_importance(booster, x_te, names)
                  if booster is not None else None if config.hidden
                  else report.permutation_importance(model, x_te, y_te_hard, names, config.seed))
    log(f"fit {fit_s:.1f}s; held-out ROC-AUC {metrics['test'].get('roc_auc', float('nan')):.3f} "
        f"PR-AUC {metrics['test'].get('pr_auc', float('nan')):.3f} "
        f"(positive rate {metrics['test']['positive_rate']:.3f})")
    return Fit(model, fit_s, metrics, report.calibration(y_te_hard, p_te), importance, out)


def provisional_spec(prep: Prepared, config: TrainConfig, fp: dict | None,
                     k_config: KConfig, prompt_format: dict | None = None
                     ) -> ArtifactSpec:
    """The stopper.json of a fitted node model before a replay chooses its setting (max
    aggregation, threshold 0.5)."""
    return ArtifactSpec(kind=config.model, schema_version=SCHEMA_VERSION,
                        feature_names=config.feature_names,
                        inputs="hidden" if config.hidden else "features",
                        hidden_size=prep.n_inputs if config.hidden else None,
                        aggregation="max", threshold=0.5, label=config.label,
                        label_definition=LABEL_DOC[config.label], pair_fingerprint=fp,
                       k_config=k_config, prompt_format=prompt_format)



# ------------------------------------------------------------------ calibrate
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
