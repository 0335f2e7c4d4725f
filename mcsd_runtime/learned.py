"""Learned stoppers at inference: load an artifact folder, score the frontier's nodes, aggregate
the node scores into one continue-probability, compare it with the artifact's threshold.

An artifact folder holds `stopper.json` (kind, feature schema, aggregation, threshold, pair
fingerprint, the k-config it was trained on, metrics, training-data manifest) and the model:
`model.txt` (LightGBM) or `model.safetensors` plus `config.json` (MLP). `train` writes them;
this module only reads them, so the runtime never imports `train`. The MLP module is defined
here and `train` imports it.

Node score: the model's estimate that the node is on the accepted path *and* the accepted path
continues past it (the label `train` fits). Aggregations over the frontier:

- `max`: the paper's rule, continue while any node scores above the threshold;
- `sum`: the sum of node scores, clipped at 1. At most one frontier node lies on the accepted
  path, so the node events are exclusive and their probabilities add up to P(L > depth);
- `mean`: the plain mean;
- `path`: the mean weighted by each node's draft path probability.

LightGBM predictions go straight to its C API with prepared arguments (`FastLightGBM`): the
same outputs as `Booster.predict`, without most of its per-call overhead.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from mcsd_runtime.constants import STOPPER_KINDS as KINDS
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.features import (
    DECISION_FEATURES,
    FEATURE_NAMES,
    SCHEMA_VERSION,
    TRAJECTORY_FEATURES,
    column,
)
from mcsd_runtime.stoppers import Frontier, StopperBase
from mcsd_runtime.tree import parse_k_config

FORMAT = "mcsd-stopper"
MODEL_FILES = {"lightgbm": ("model.txt",), "mlp": ("model.safetensors", "config.json"),
               "mlp-hidden": ("model.safetensors", "config.json")}

_LOG_PATH = column("log_path_prob")
_RECENT_RATE = TRAJECTORY_FEATURES.index("accept_rate_recent")


def drafts_without_deciding(frontier: Frontier, min_depth: int, gate: float) -> bool:
    """Whether a learned stopper drafts on from `frontier` without asking its model: below
    `min_depth`, while the sequence's recent acceptance rate is at least `gate` (0: always).
    A decision that nearly always says "continue" only costs time; the gate hands the shallow
    depths back to the model when acceptance drops (another domain, a shift in the text)."""
    if frontier.depth >= min_depth:
        return False
    return gate <= 0 or frontier.trajectory()[_RECENT_RATE] >= gate


# ------------------------------------------------------------------ aggregation over the frontier
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


def aggregate(name: str, scores: np.ndarray, feats: np.ndarray) -> float:
    """The frontier's continue-score from its node scores (`feats`: the frontier's features)."""
    if name not in AGGREGATIONS:
        raise MCSDError(f"unknown aggregation {name!r}: use one of {', '.join(AGGREGATIONS)}")
    return AGGREGATIONS[name](np.asarray(scores, dtype=np.float64), np.asarray(feats))


# ------------------------------------------------------------------ the MLP (train and inference)
class DecisionMLP(nn.Module):
    """in -> hidden... -> 1 logit, ReLU. Inputs are standardized by stored mean/std buffers.

    `DecisionMLP(len(FEATURE_NAMES), (64, 64))` is the scalar-feature model;
    `DecisionMLP(H, (512, 256))` is the paper's model on the draft's last hidden state.
    """

    def __init__(self, in_features: int, hidden: tuple[int, ...] = (64, 64),
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.in_features, self.hidden, self.dropout = in_features, tuple(hidden), dropout
        layers: list[nn.Module] = []
        width = in_features
        for h in self.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)
        self.register_buffer("mean", torch.zeros(in_features))
        self.register_buffer("std", torch.ones(in_features))

    def config(self) -> dict:
        return {"in_features": self.in_features, "hidden": list(self.hidden),
                "dropout": self.dropout}

    def set_normalization(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean.copy_(mean)
        self.std.copy_(std.clamp_min(1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x.float() - self.mean) / self.std).squeeze(-1)


# ------------------------------------------------------------------ LightGBM, without overhead
class FastLightGBM:
    """`Booster.predict` for small batches: one direct call into LightGBM's C API with the
    arguments prepared once (single-threaded), the same outputs without the Python-side checks
    that dominate a 16-row prediction. Falls back to `Booster.predict` if the private API moves."""

    def __init__(self, booster) -> None:
        self.booster = booster
        self.num_feature = booster.num_feature()
        try:
            import ctypes

            from lightgbm import basic

            self._lib, self._safe_call, self._ct = basic._LIB, basic._safe_call, ctypes
            self._params = basic._c_str("num_threads=1")
            self._handle = booster._handle
            # A single row (a chain's frontier) goes through the single-row fast path, set up
            # once: several times cheaper than a batch call.
            self._row_config = ctypes.c_void_p()
            self._safe_call(self._lib.LGBM_BoosterPredictForMatSingleRowFastInit(
                self._handle, ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(-1),
                ctypes.c_int(1), ctypes.c_int32(self.num_feature), self._params,
                ctypes.byref(self._row_config)))
            self._fast = True
        except (AttributeError, ImportError):
            self._fast = False

    def __del__(self) -> None:
        config = getattr(self, "_row_config", None)
        if config is not None and config.value:
            self._lib.LGBM_FastConfigFree(config)

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.num_feature:
            raise MCSDError(f"LightGBM stopper expects {self.num_feature} features per row, "
                            f"got shape {tuple(x.shape)}")
        if not self._fast:
            return self.booster.predict(x, num_threads=1)
        ct = self._ct
        out = np.empty(x.shape[0], dtype=np.float64)
        n_out = ct.c_int64(0)
        if x.shape[0] == 1:
            self._safe_call(self._lib.LGBM_BoosterPredictForMatSingleRowFast(
                self._row_config, x.ctypes.data_as(ct.c_void_p), ct.byref(n_out),
                out.ctypes.data_as(ct.POINTER(ct.c_double))))
            return out
        self._safe_call(self._lib.LGBM_BoosterPredictForMat(
            self._handle, x.ctypes.data_as(ct.c_void_p), ct.c_int(1),  # C_API_DTYPE_FLOAT64
            ct.c_int32(x.shape[0]), ct.c_int32(x.shape[1]), ct.c_int(1),  # row-major
            ct.c_int(0), ct.c_int(0), ct.c_int(-1),  # normal prediction, all iterations
            self._params, ct.byref(n_out), out.ctypes.data_as(ct.POINTER(ct.c_double))))
        return out


def load_lightgbm(path: Path) -> FastLightGBM:
    """The model of `model.txt`; MCSDError if the file is missing or corrupt."""
    import lightgbm as lgb

    if not path.is_file():
        raise MCSDError(f"stopper artifact is missing its model file {path}")
    try:
        booster = lgb.Booster(model_file=str(path))
    except Exception as err:  # LightGBM raises its own error type for unreadable files
        raise MCSDError(f"cannot read LightGBM model {path}: {err}; retrain or restore the "
                        f"artifact") from None
    return FastLightGBM(booster)


def load_mlp(folder: Path) -> DecisionMLP:
    from safetensors.torch import load_file

    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    for p in (cfg_path, weights):
        if not p.is_file():
            raise MCSDError(f"stopper artifact is missing its model file {p}")
    try:
        cfg = json.loads(cfg_path.read_text())
        model = DecisionMLP(int(cfg["in_features"]), tuple(int(h) for h in cfg["hidden"]),
                            float(cfg.get("dropout", 0.0)))
        model.load_state_dict(load_file(str(weights)), strict=True)
    except MCSDError:
        raise
    except Exception as err:
        raise MCSDError(f"cannot read MLP model in {folder}: {err}; retrain or restore the "
                        f"artifact") from None
    return model.eval()


# ------------------------------------------------------------------ the stopper
class LearnedStopper(StopperBase):
    """Continue while the aggregated node score of the frontier is >= `threshold`."""

    def __init__(self, kind: str, spec: dict, model: Any, threshold: float,
                 aggregation: str) -> None:
        self.kind, self.spec, self.model = kind, spec, model
        self.threshold, self.aggregation = float(threshold), aggregation
        self._agg = AGGREGATIONS[aggregation]
        # depths below min_depth are drafted without a decision while the recent acceptance
        # rate is at least min_depth_gate (replay chooses both; see drafts_without_deciding)
        self.min_depth = int(spec.get("min_depth", 1))
        self.min_depth_gate = float(spec.get("min_depth_gate", 0.0))
        self.pair_fingerprint: dict | None = spec.get("pair_fingerprint")
        self.k_config: tuple[int, ...] | None = (parse_k_config(spec["k_config"])
                                                 if spec.get("k_config") else None)
        self.needs_hidden = kind == "mlp-hidden"
        # trained on DECISION_FEATURES: read the frontier's cheap host features
        self.decision = (not self.needs_hidden
                         and tuple(spec.get("feature_names", ())) == DECISION_FEATURES)

    def check_tree(self, k_config: tuple[int, ...]) -> None:
        """Refuse a decoder tree other than the one this stopper was trained on. An artifact
        that does not record its tree (written before stopper.json had `k_config`) is accepted
        with a warning."""
        k_config = tuple(k_config)
        if self.k_config is None:
            warnings.warn(f"this stopper does not record the k-config it was trained on, so it "
                          f"cannot be checked against the decoder's {_k_text(k_config)}; retrain "
                          f"it to record it", UserWarning, stacklevel=2)
            return
        if self.k_config != k_config:
            raise MCSDError(
                f"this stopper was trained on k-config {_k_text(self.k_config)} trees, but the "
                f"decoder drafts k-config {_k_text(k_config)}; decode with --k-config "
                f"{_k_text(self.k_config)} or train a stopper on a collection made with "
                f"--k-config {_k_text(k_config)}")

    @torch.inference_mode()
    def node_scores(self, x: np.ndarray | torch.Tensor) -> np.ndarray:
        """Node scores in [0, 1] for feature rows (or hidden-state rows for `mlp-hidden`)."""
        if self.kind == "lightgbm":
            if isinstance(x, torch.Tensor):
                x = x.detach().cpu().numpy()
            return self.model.predict(x)
        if not isinstance(x, torch.Tensor):
            x = torch.from_numpy(np.asarray(x, dtype=np.float32))
        return torch.sigmoid(self.model(x.cpu())).numpy().astype(np.float64)

    def frontier_score(self, frontier: Frontier) -> float:
        if self.decision:
            feats = frontier.decision_features()
            return self._agg(self.model.predict(feats) if self.kind == "lightgbm"
                             else self.node_scores(feats), feats)
        feats = frontier.features()
        if isinstance(feats, torch.Tensor):
            feats = feats.detach().cpu().numpy()  # once: the model and the aggregation share it
        scores = self.node_scores(frontier.hidden() if self.needs_hidden else feats)
        return self._agg(scores, feats)

    def should_continue(self, frontier: Frontier) -> bool:
        if drafts_without_deciding(frontier, self.min_depth, self.min_depth_gate):
            return True
        return self.frontier_score(frontier) >= self.threshold

    def __repr__(self) -> str:
        return (f"LearnedStopper(kind={self.kind!r}, aggregation={self.aggregation!r}, "
                f"threshold={self.threshold:.3f}, min_depth={self.min_depth}, "
                f"min_depth_gate={self.min_depth_gate:g})")


def _k_text(k_config: tuple[int, ...]) -> str:
    return ",".join(map(str, k_config)) or "() (autoregressive)"


def read_spec(path: str | Path) -> tuple[Path, dict]:
    """The artifact folder and its validated `stopper.json`."""
    path = Path(path)
    folder = path.parent if path.name == "stopper.json" else path
    spec_path = folder / "stopper.json"
    if not spec_path.is_file():
        raise MCSDError(f"{folder} is not a stopper artifact: no stopper.json")
    try:
        spec = json.loads(spec_path.read_text())
    except (OSError, ValueError) as err:
        raise MCSDError(f"cannot read {spec_path}: {err}") from None
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        raise MCSDError(f"{spec_path} is not a stopper description (format {FORMAT!r})")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise MCSDError(f"{spec_path}: unknown stopper kind {kind!r} (known: {', '.join(KINDS)})")
    if spec.get("schema_version") != SCHEMA_VERSION:
        raise MCSDError(f"{spec_path} was trained on feature schema version "
                        f"{spec.get('schema_version')!r}, this runtime computes version "
                        f"{SCHEMA_VERSION}; retrain it on a collection made with this version")
    names = spec.get("feature_names")
    if names not in (list(FEATURE_NAMES), list(DECISION_FEATURES)):
        extra = sorted(set(names or []) - set(FEATURE_NAMES))
        missing = sorted(set(DECISION_FEATURES) - set(names or []))
        raise MCSDError(f"{spec_path}: its feature list differs from the runtime's "
                        f"(unknown: {extra or 'none'}, missing: {missing or 'none'}, or another "
                        f"order); retrain it on a collection made with this version")
    if spec.get("aggregation") not in AGGREGATIONS:
        raise MCSDError(f"{spec_path}: unknown aggregation {spec.get('aggregation')!r}")
    try:
        float(spec["threshold"])
    except (KeyError, TypeError, ValueError):
        raise MCSDError(f"{spec_path}: missing or non-numeric threshold") from None
    if spec.get("k_config") is not None:
        try:
            parse_k_config(spec["k_config"])
        except (MCSDError, TypeError):
            raise MCSDError(f"{spec_path}: k_config {spec['k_config']!r} is not a k-config (a "
                            f"list of positive integers); retrain or restore the artifact"
                            ) from None
    return folder, spec


def load_stopper(path: str | Path, threshold: float | None = None,
                 aggregation: str | None = None, min_depth: int | None = None,
                 min_depth_gate: float | None = None) -> LearnedStopper:
    """A stopper from an artifact folder (or its stopper.json); `threshold`, `aggregation`,
    `min_depth` and `min_depth_gate` override the artifact's choices."""
    folder, spec = read_spec(path)
    kind = spec["kind"]
    if kind == "lightgbm":
        model: Any = load_lightgbm(folder / "model.txt")
        if model.booster.feature_name() != spec["feature_names"]:
            raise MCSDError(f"{folder / 'model.txt'}: its features differ from stopper.json's "
                            f"{len(spec['feature_names'])}; retrain it")
    else:
        model = load_mlp(folder)
        want = len(spec["feature_names"]) if kind == "mlp" else spec.get("hidden_size")
        if want is not None and model.in_features != want:
            raise MCSDError(f"{folder}: the MLP takes {model.in_features} inputs, expected {want}")
    agg = aggregation or spec["aggregation"]
    if agg not in AGGREGATIONS:
        raise MCSDError(f"unknown aggregation {agg!r}: use one of {', '.join(AGGREGATIONS)}")
    stopper = LearnedStopper(kind, spec, model,
                             spec["threshold"] if threshold is None else threshold, agg)
    if min_depth is not None:
        stopper.min_depth = int(min_depth)
    if min_depth_gate is not None:
        stopper.min_depth_gate = float(min_depth_gate)
    return stopper


def check_pair(stopper: Any, pair: Any) -> None:
    """Refuse a learned stopper trained on collections of another model pair."""
    want = getattr(stopper, "pair_fingerprint", None)
    if not want:
        return
    have = pair.fingerprint if hasattr(pair, "fingerprint") else dict(pair)
    keys = [k for k in ("target_config", "draft_config", "tokenizer")
            if want.get(k) is not None and have.get(k) is not None]
    diff = [k for k in keys if want[k] != have[k]]
    if diff:
        raise MCSDError(
            f"this stopper was trained for the pair {want.get('target')!r} / "
            f"{want.get('draft')!r}, not {have.get('target')!r} / {have.get('draft')!r} "
            f"(differs in: {', '.join(diff)}); "
            f"train one on a collection from this pair")
