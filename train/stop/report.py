"""Metrics (scikit-learn) and plots (matplotlib, PNG) of a trained stopper, and the layout of
its replayed headline (`HEADLINE`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mcsd_runtime.decisions.features import DECISION_FEATURES
from mcsd_runtime.decisions.skip import DEFAULT_PROBE
from replay.result import ABSENT, Column, Comparison, Report, nan_if_none, pct


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


def lightgbm_importance(booster, x: np.ndarray, names=DECISION_FEATURES) -> dict:
    """Total gain per feature and mean |SHAP| (LightGBM's `pred_contrib`) on `x` (columns
    `names`)."""
    gain = booster.feature_importance("gain", iteration=booster.best_iteration or None)
    contrib = booster.predict(x, pred_contrib=True, num_iteration=booster.best_iteration or None)
    shap = np.abs(contrib[:, :-1]).mean(0)
    return {"gain": dict(zip(names, map(float, gain), strict=True)),
            "mean_abs_shap": dict(zip(names, map(float, shap), strict=True))}


def permutation_importance(model, x: np.ndarray, y_hard: np.ndarray, names=DECISION_FEATURES,
                           seed: int = 0, max_rows: int = 20_000) -> dict | None:
    """How much held-out ROC-AUC drops when one feature's column is shuffled (scikit-learn's
    permutation importance), for models without importances of their own (the MLPs)."""
    from sklearn.inspection import permutation_importance as permute
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y_hard).astype(int)
    if not 0 < y.sum() < len(y):
        return None
    class Fitted:  # scikit-learn wants an estimator: one that is already fitted
        def fit(self, *_):
            return self

    rows = np.random.default_rng(seed).permutation(len(y))[:max_rows]
    res = permute(Fitted(), np.asarray(x)[rows], y[rows], n_repeats=3, random_state=seed,
                  scoring=lambda _, xs, ys: roc_auc_score(ys, model.predict(xs)))
    return {"roc_auc_drop": dict(zip(names, map(float, res.importances_mean),
                                     strict=True))}


# ------------------------------------------------------------------ the replayed headline
DRAFTING = "oracle-bound(drafting)"  # the optimum over schedules that draft at every step


def _chosen(key: str, *default):
    """A column of the chosen setting's `key` (`facts["chosen"]`)."""
    return lambda c: c.facts["chosen"].get(key, *default) if default else c.facts["chosen"][key]


def _batch(value):
    """A column recorded at batch sizes above 1 only (`facts["batch_size"]`)."""
    return lambda c: value(c) if "batch_size" in c.facts else ABSENT


def _drafting(c: Comparison, share: bool = False):
    """Where replayed (exact test replay), the optimum of depth decisions alone and the share of
    its gain over the best static the learned stopper takes: the rest of the oracle's gain needs
    skipping steps."""
    if c.speeds.get(DRAFTING) is None:
        return ABSENT
    return nan_if_none(c.share(oracle=DRAFTING)) if share else c.speeds[DRAFTING]


def _vs_peer(c: Comparison) -> float | None:
    return c.ratio(over=c.peer) if c.peer else None


def _g4(v: float) -> str:
    return f"{v:.4g}"


# a split's comparison (`pipeline._comparison`): the learned stopper against the best static
# (deployed) and the oracle, the chosen setting, the rules' values, AR, the best tuned peer
# (chosen on validation prompts), the decision's cost; at batch sizes above 1 the batch setting
HEADLINE = Report(
    (Column("metric", lambda c: c.facts["metric"]), Column("units", lambda c: c.facts["units"]),
     Column("replay_mode", lambda c: c.facts["mode"]),
     Column("best_static", lambda c: c.best_static, "best static", str),
     Column("best_static_value", lambda c: c.speeds[c.best_static or c.deployed], "value",
            _g4),
     Column("oracle_value", lambda c: c.speeds[c.oracle], "oracle", _g4),
     Column("learned_value", Comparison.speed, "learned", _g4),
     Column("speedup_vs_best_static", lambda c: r if (r := c.ratio()) is not None else 0,
            "vs best static"),
     Column("oracle_gain_captured", lambda c: nan_if_none(c.share()), "share", pct),
     *(Column(k, _chosen(k)) for k in ("aggregation", "threshold", "min_depth",
                                       "min_depth_gate")),
     Column("skip_rate", _chosen("skip_rate", 0.0)),
     Column("skip_probe", _chosen("skip_probe", DEFAULT_PROBE)),
     Column("rule", _chosen("rule", "threshold")), Column("rate", _chosen("rate", None)),
     Column("online_strength", _chosen("online_strength", 0.0)),
     Column("threshold_rule_value", lambda c: c.speeds.get("learned(threshold)")),
     Column("expected_rate_rule_value", lambda c: c.speeds.get("learned(expected-rate)")),
     Column("learned_vs_ar", lambda c: c.ratio(over="ar"), "vs AR"),
     Column("best_peer", lambda c: c.peer.removesuffix("(tuned)") if c.peer else None,
            "best peer", str),
     Column("learned_vs_best_peer", _vs_peer, "vs peer"),
     Column("decision_latency_us", lambda c: c.facts["latency_us"]),
     Column("replay_decision_us", lambda c: c.facts["decision_s"] * 1e6),
     Column("drafting_bound_value", _drafting, "drafting", _g4),
     Column("drafting_gain_captured", lambda c: _drafting(c, share=True), "share*", pct),
     Column("batch_size", _batch(lambda c: c.facts["batch_size"])),
     Column("row_aggregation", _batch(_chosen("row_aggregation"))),
     Column("oracle_bound_value", _batch(lambda c: c.speeds.get("oracle-bound", ABSENT)))),
    label=Column("label", lambda c: c.group, "split"),
    printed=("best_static", "best_static_value", "learned_value", "speedup_vs_best_static",
             "oracle_value", "oracle_gain_captured", "drafting_bound_value",
             "drafting_gain_captured", "learned_vs_ar", "best_peer", "learned_vs_best_peer"))


IMPORTANCE_TITLES = {"gain": "total gain in training (LightGBM)",
                     "mean_abs_shap": "mean |SHAP| on test rows (logit)",
                     "roc_auc_drop": "ROC-AUC drop on test rows when shuffled"}


def wrap_title(title: str, width: int = 70) -> str:
    import textwrap

    return "\n".join(textwrap.fill(part, width, break_on_hyphens=False)
                     for part in title.split("\n"))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_calibration(curves: dict[str, dict], title: str, path: Path) -> None:
    """Reliability curves (label -> `calibration()` output) on one set of axes."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4.8))
    ax.plot([0, 1], [0, 1], ls=":", c="grey", label="perfect")
    for label, cal in curves.items():
        ax.plot(cal["mean_predicted"], cal["fraction_positive"], marker="o", label=label)
    ax.set(xlabel="predicted probability (node score)", ylabel="observed frequency")
    ax.set_title(wrap_title(title, 50), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_importance(imp: dict, title: str, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(imp), figsize=(6 * len(imp), 4.5))
    axes = np.atleast_1d(axes)
    for ax, (name, values) in zip(axes, imp.items(), strict=True):
        order = sorted(values, key=values.get)
        ax.barh(order, [values[k] for k in order])
        ax.set_title(IMPORTANCE_TITLES.get(name, name.replace("_", " ")), fontsize=9)
        ax.tick_params(labelsize=8)
    fig.suptitle(wrap_title(title, 60 * len(imp)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_replay(curve: list[dict], chosen: dict, lines: dict[str, float], metric: str,
                title: str, path: Path, units: str = "") -> None:
    """Replayed `metric` (in `units`) against threshold per aggregation (at the chosen
    min_depth); static depths and oracle as lines."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
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
        ax.annotate(name, (0, value), xycoords=("axes fraction", "data"), xytext=(2, 2),
                    textcoords="offset points", fontsize=7, color="dimgrey")
    ax.scatter([chosen["threshold"]], [chosen[metric]], c="k", zorder=5, label="chosen")
    ax.set_xlabel(f"threshold (decisions from depth {chosen.get('min_depth', 1)})")
    ax.set_ylabel(f"replayed {metric.replace('_', ' ')}" + (f" ({units})" if units else ""))
    ax.set_title(wrap_title(title), fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
