"""Metrics (scikit-learn) and plots (matplotlib, PNG) of a trained stopper."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mcsd_runtime.features import DECISION_FEATURES


def classification_metrics(y_hard: np.ndarray, p: np.ndarray, y_soft: np.ndarray | None = None,
                           ) -> dict:
    from sklearn.metrics import average_precision_score, log_loss, roc_auc_score

    y_hard = np.asarray(y_hard).astype(int)
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-7, 1 - 1e-7)
    out = {"n": int(len(y_hard)), "positive_rate": float(y_hard.mean()) if len(y_hard) else 0.0}
    if 0 < y_hard.sum() < len(y_hard):
        out |= {"roc_auc": float(roc_auc_score(y_hard, p)),
                "pr_auc": float(average_precision_score(y_hard, p)),
                "log_loss": float(log_loss(y_hard, p, labels=[0, 1])),
                "log_loss_constant": float(log_loss(y_hard, np.full_like(p, y_hard.mean()),
                                                    labels=[0, 1]))}
    if y_soft is not None:
        ys = np.asarray(y_soft, dtype=np.float64)
        out["soft_bce"] = float(-(ys * np.log(p) + (1 - ys) * np.log(1 - p)).mean())
    return out


def calibration(y_hard: np.ndarray, p: np.ndarray, bins: int = 10) -> dict:
    from sklearn.calibration import calibration_curve

    frac, mean = calibration_curve(np.asarray(y_hard).astype(int), np.clip(p, 0, 1), n_bins=bins,
                                   strategy="quantile")
    return {"mean_predicted": mean.tolist(), "fraction_positive": frac.tolist()}


def lightgbm_importance(booster, x: np.ndarray) -> dict:
    """Total gain per feature and mean |SHAP| (LightGBM's `pred_contrib`) on `x`."""
    gain = booster.feature_importance("gain", iteration=booster.best_iteration or None)
    contrib = booster.predict(x, pred_contrib=True, num_iteration=booster.best_iteration or None)
    shap = np.abs(contrib[:, :-1]).mean(0)
    return {"gain": dict(zip(DECISION_FEATURES, map(float, gain), strict=True)),
            "mean_abs_shap": dict(zip(DECISION_FEATURES, map(float, shap), strict=True))}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_calibration(cal: dict, title: str, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], ls=":", c="grey", label="perfect")
    ax.plot(cal["mean_predicted"], cal["fraction_positive"], marker="o", label="stopper")
    ax.set(xlabel="predicted probability", ylabel="observed frequency", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_calibration_domains(curves: dict[str, dict], title: str, path: Path) -> None:
    """Reliability curves (label -> `calibration()` output) on one set of axes."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], ls=":", c="grey", label="perfect")
    for label, cal in curves.items():
        ax.plot(cal["mean_predicted"], cal["fraction_positive"], marker="o", label=label)
    ax.set(xlabel="predicted probability (node score)", ylabel="observed frequency",
           title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_importance(imp: dict, title: str, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(imp), figsize=(5 * len(imp), 4.5))
    axes = np.atleast_1d(axes)
    for ax, (name, values) in zip(axes, imp.items(), strict=True):
        order = sorted(values, key=values.get)
        ax.barh(order, [values[k] for k in order])
        ax.set(title=name.replace("_", " "))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_replay(curve: list[dict], chosen: dict, lines: dict[str, float], metric: str,
                title: str, path: Path) -> None:
    """Replayed `metric` against threshold per aggregation (at the chosen min_depth); static
    depths and oracle as lines."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    curve = [c for c in curve if c.get("min_depth", 1) == chosen.get("min_depth", 1)]
    for agg in sorted({c["aggregation"] for c in curve}):
        pts = [c for c in curve if c["aggregation"] == agg]
        width = 2.2 if agg == chosen["aggregation"] else 1.0
        ax.plot([c["threshold"] for c in pts], [c[metric] for c in pts], lw=width,
                label=f"learned ({agg})")
    colors = plt.cm.Greys(np.linspace(0.35, 0.85, max(len(lines), 1)))
    for (name, value), col in zip(lines.items(), colors, strict=True):
        style = "--" if name == "oracle" else ":"
        ax.axhline(value, ls=style, c="tab:red" if name == "oracle" else col, lw=1, label=name)
    ax.scatter([chosen["threshold"]], [chosen[metric]], c="k", zorder=5, label="chosen")
    ax.set(xlabel="threshold", ylabel=metric, title=title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
