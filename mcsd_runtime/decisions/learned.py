"""Learned stoppers at inference: load an artifact folder, score the frontier's nodes, aggregate
the node scores into one continue-probability, compare it with the artifact's threshold.

An artifact folder holds `stopper.json` (`mcsd_runtime.decisions.artifact.ArtifactSpec`: kind,
feature schema, aggregation, threshold, pair fingerprint, the k-config it was trained on,
metrics) and the model: `model.txt` (LightGBM) or `model.safetensors` plus `config.json`
(MLP). `train` writes them; this module only reads them, so the runtime never imports `train`.
The MLP module is defined here and `train` imports it.

Node score: the model's estimate that the node is on the accepted path *and* the accepted path
continues past it (the label `train` fits); `decisions.aggregation` turns the frontier's node
scores into one. An artifact with `depth_thresholds` decides by the expected-throughput rule
(`decisions.expected_rate`): node scores mapped through its `calibration`, summed (P(L > depth)),
against the threshold of the depth just drafted.

In a batch, `for_batch(B)` gives the stopper the setting `stopper.json` holds for B rows (its
`batch` table), and `batch_continue(frontiers)` decides for the whole batch: the nodes of every
asked row's frontier scored in one model call, each frontier's node scores aggregated as alone,
then the rows' scores aggregated (`ROW_AGGREGATIONS`) against the threshold.

LightGBM models are scored through LightGBM's C library alone (`NativeBooster`): decoding with a
trained stopper imports neither the `lightgbm` Python package nor scipy.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from mcsd_runtime.decisions.aggregation import AGGREGATIONS, aggregate, batch_decision, reachable
from mcsd_runtime.decisions.artifact import (
    ArtifactSpec,
    BatchSetting,
    artifact_folder,
    decision_subset,
)
from mcsd_runtime.decisions.contract import Frontier, StopperBase
from mcsd_runtime.decisions.features import DECISION_FEATURES, TRAJECTORY_FEATURES
from mcsd_runtime.decisions.lightgbm_native import LightGBMError, NativeBooster
from mcsd_runtime.decisions.online import OnlineCalibration
from mcsd_runtime.decisions.skip import SkipGate, SkipsDrafts
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.tree import k_text, parse_k_config

__all__ = ["AGGREGATIONS", "DecisionMLP", "LearnedStopper", "NativeBooster", "aggregate",
           "check_pair", "drafts_without_deciding", "load_lightgbm", "load_mlp", "load_stopper",
           "stopper_from", "training_temperatures"]

_RECENT_RATE = TRAJECTORY_FEATURES.index("accept_rate_recent")


def drafts_without_deciding(frontier: Frontier, min_depth: int, gate: float) -> bool:
    """Whether a learned stopper drafts on from `frontier` without asking its model: below
    `min_depth`, while the sequence's recent acceptance rate is at least `gate` (0: always).
    A decision that nearly always says "continue" only costs time; the gate hands the shallow
    depths back to the model when acceptance drops (another domain, a shift in the text)."""
    if frontier.depth >= min_depth:
        return False
    return gate <= 0 or frontier.trajectory()[_RECENT_RATE] >= gate


# ------------------------------------------------------------------ the MLP (train and inference)
class DecisionMLP(nn.Module):
    """in -> hidden... -> 1 logit, ReLU. Inputs are standardized by stored mean/std buffers.

    `DecisionMLP(len(FEATURE_NAMES), (64, 64))` is the scalar-feature model;
    `DecisionMLP(H, (512, 256))` is the paper's model on the draft's last hidden state.
    """

    mean: torch.Tensor  # the buffers of the inputs' standardization
    std: torch.Tensor

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


# ------------------------------------------------------------------ loading the model files
def load_lightgbm(path: Path) -> NativeBooster:
    """The model of `model.txt`; MCSDError if the file is missing or corrupt."""
    if not path.is_file():
        raise MCSDError(f"stopper artifact is missing its model file {path}")
    try:
        return NativeBooster(path)
    except LightGBMError as err:
        raise MCSDError(f"cannot read LightGBM model {path}: {err}; retrain or restore the "
                        f"artifact") from None


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
class LearnedStopper(SkipsDrafts, StopperBase):
    """Continue while the aggregated node score of the frontier is >= `threshold`."""

    decision: ClassVar[str] = "stop"  # a `mcsd_runtime.decisions.manifest.Decision`

    def __init__(self, spec: ArtifactSpec, model: Any) -> None:
        self.spec, self.kind, self.model = spec, spec.kind, model
        self.threshold, self.aggregation = spec.threshold, spec.aggregation
        # the expected-throughput rule: a threshold per depth, on calibrated scores
        self.depth_thresholds, self.calibration = spec.depth_thresholds, spec.calibration
        # depths below min_depth are drafted without a decision while the recent acceptance
        # rate is at least min_depth_gate (replay chooses both; see drafts_without_deciding)
        self.min_depth, self.min_depth_gate = spec.min_depth, spec.min_depth_gate
        # steps without a draft while the recent acceptance rate is below skip_rate (SkipGate)
        self.skip = SkipGate(spec.skip_rate, spec.skip_probe)
        # scores scaled per sequence by the acceptances seen (0: off; decisions.online)
        self.online_strength = spec.online_strength
        self.online = OnlineCalibration(self.online_strength)
        self.row_aggregation = "max"  # how a batch decision combines rows (for_batch sets it)
        self.pair_fingerprint: dict | None = spec.pair_fingerprint
        self.k_config: tuple[int, ...] = spec.k_config
        self.needs_hidden = spec.kind == "mlp-hidden"
        # trained on DECISION_FEATURES or some of them: read the frontier's cheap host features
        # (rows of every DECISION_FEATURES column) and give the model its `columns`
        cheap = self.reads_decision_features = (not self.needs_hidden
                                                and decision_subset(spec.feature_names))
        self.columns = (None if not cheap or spec.feature_names == DECISION_FEATURES
                        else np.array([DECISION_FEATURES.index(n) for n in spec.feature_names]))

    @classmethod
    def load(cls, folder: str | Path) -> LearnedStopper:
        """The stopper `mcsd train --decision stop` wrote to `folder` (`load_stopper`)."""
        return load_stopper(folder)

    @property
    def temperature(self) -> float:
        """The hottest temperature of the collections it was trained on (0: greedy)."""
        return max(training_temperatures(self.spec), default=0.0)

    def check_tree(self, k_config: tuple[int, ...]) -> None:
        """Refuse a decoder tree other than the one this stopper was trained on."""
        k_config = parse_k_config(k_config)
        if self.k_config != k_config:
            raise MCSDError(
                f"this stopper was trained on k-config {k_text(self.k_config)} trees, but the "
                f"decoder drafts k-config {k_text(k_config)}; decode with --k-config "
                f"{k_text(self.k_config)} or train a stopper on a collection made with "
                f"--k-config {k_text(k_config)}")

    @torch.inference_mode()
    def node_scores(self, x: np.ndarray | torch.Tensor) -> np.ndarray:
        """Node scores in [0, 1] for feature rows (or hidden-state rows for `mlp-hidden`): rows of
        the model's own features, or of every DECISION_FEATURES column."""
        x = self._model_columns(x)
        if self.kind == "lightgbm":
            if isinstance(x, torch.Tensor):
                x = x.detach().cpu().numpy()
            return self.model.predict(x)
        if not isinstance(x, torch.Tensor):
            x = torch.from_numpy(np.asarray(x, dtype=np.float32))
        return torch.sigmoid(self.model(x.cpu())).numpy().astype(np.float64)

    def _model_columns(self, x: Any) -> Any:
        """`x` cut to the columns the model reads, where it holds all DECISION_FEATURES."""
        if self.columns is not None and x.shape[-1] == len(DECISION_FEATURES):
            return x[:, self.columns]
        return x

    def _inputs(self, frontier: Frontier) -> tuple[Any, np.ndarray]:
        """The model's input rows for `frontier`'s nodes and the features the aggregation reads
        (the same array unless the model reads hidden states)."""
        if self.reads_decision_features:
            feats = frontier.decision_features()
        else:
            node = frontier.features()
            # once: the model and aggregation share it
            feats = node.detach().cpu().numpy() if isinstance(node, torch.Tensor) else node
        return (frontier.hidden() if self.needs_hidden else feats), feats

    def node_scores_of(self, frontiers: Sequence[Frontier]
                       ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each frontier's node scores and the features its aggregation reads; the nodes of all
        of them go through the model in one call. The one source of scores the decisions read
        (`frontier_scores`): a subclass may serve them otherwise (replay's `MemoStopper` serves
        cached ones), and decides as this stopper does."""
        inputs = [self._inputs(f) for f in frontiers]
        if len(inputs) == 1:
            x = inputs[0][0]
        elif self.needs_hidden:
            x = torch.cat([torch.as_tensor(x) for x, _ in inputs])
        else:
            x = np.concatenate([x for x, _ in inputs])
        if self.reads_decision_features and self.kind == "lightgbm":
            scores = self.model.predict(self._model_columns(x))
        else:
            scores = self.node_scores(x)
        cuts = np.cumsum([len(f) for _, f in inputs])[:-1]
        return [(s, f) for s, (_, f) in zip(np.split(scores, cuts), inputs, strict=True)]

    def calibrated_scores(self, frontiers: Sequence[Frontier]
                          ) -> list[tuple[np.ndarray, np.ndarray]]:
        """`node_scores_of`, the scores mapped through `calibration` where the stopper has one."""
        cal = self.calibration
        return [(s if cal is None else cal(s), f) for s, f in self.node_scores_of(frontiers)]

    def frontier_scores(self, frontiers: Sequence[Frontier]) -> list[float]:
        """Each frontier's aggregated (`aggregation`) calibrated node score."""
        agg = AGGREGATIONS[self.aggregation]
        return [agg(s, f) for s, f in self.calibrated_scores(frontiers)]

    def threshold_at(self, depth: int) -> float:
        """The threshold after drafting `depth`: `depth_thresholds`' entry, else `threshold`."""
        per_depth = self.depth_thresholds
        return per_depth[min(depth, len(per_depth)) - 1] if per_depth else self.threshold

    def frontier_score(self, frontier: Frontier) -> float:
        return self.frontier_scores([frontier])[0]

    def reset(self) -> None:
        super().reset()
        self.online = OnlineCalibration(self.online_strength)

    def update(self, drafted: int, accepted: int) -> None:
        super().update(drafted, accepted)
        self.online.update(drafted, accepted)

    def should_continue(self, frontier: Frontier) -> bool:
        if drafts_without_deciding(frontier, self.min_depth, self.min_depth_gate):
            return True
        threshold = self.threshold_at(frontier.depth)
        if not reachable("max", threshold, 1):
            return False
        if not self.online_strength:
            return self.frontier_score(frontier) >= threshold
        (scores, feats), = self.calibrated_scores([frontier])
        score = AGGREGATIONS[self.aggregation](scores, feats)
        go = score * self.online.factor() >= threshold
        if go:
            self.online.drafted_past(frontier.depth, min(1.0, float(np.sum(scores))))
        return go

    def for_batch(self, batch_size: int) -> LearnedStopper:
        """This stopper set up for `batch_size` rows from stopper.json's `batch` table (the entry
        of the largest size <= batch_size); itself where the artifact has no table."""
        if not self.spec.batch:
            return self
        setting = self.spec.for_batch(batch_size)
        out = copy.copy(self)
        out.threshold, out.aggregation = setting.threshold, setting.aggregation
        out.row_aggregation = setting.row_aggregation
        out.min_depth, out.min_depth_gate = setting.min_depth, setting.min_depth_gate
        if batch_size >= min(self.spec.batch):  # a table entry: its single threshold, raw scores
            out.depth_thresholds = out.calibration = None
            out.online_strength = 0.0
        return out

    def batch_continue(self, frontiers: Sequence[Frontier]) -> bool | None:
        """One decision for the batch, given the frontiers of the rows that may draft deeper:
        draft on if one of them lies in its no-decision zone (`drafts_without_deciding`), else
        if the row aggregation of their frontier scores (one model call) is >= the threshold.
        With `max` this decides as asking each row alone and continuing if ANY says yes.
        None (each row's own copy decides) when the stopper recalibrates online: its scale is
        each sequence's own."""
        if self.online_strength:
            return None
        if any(drafts_without_deciding(f, self.min_depth, self.min_depth_gate)
               for f in frontiers):
            return True
        threshold = self.threshold_at(frontiers[0].depth)  # a batch drafts one depth at a time
        if not reachable(self.row_aggregation, threshold, len(frontiers)):
            return False  # no scores could say yes: a static depth, nothing to compute
        return batch_decision(self.row_aggregation, self.frontier_scores(frontiers), threshold)

    def __repr__(self) -> str:
        return (f"LearnedStopper(kind={self.kind!r}, aggregation={self.aggregation!r}, "
                f"threshold={self.threshold:.3f}, min_depth={self.min_depth}, "
                f"min_depth_gate={self.min_depth_gate:g}, skip_rate={self.skip.rate:g}, "
                f"skip_probe={self.skip.probe}, row_aggregation={self.row_aggregation!r}, "
                f"online_strength={self.online_strength:g}"
                + (f", depth_thresholds={[round(t, 3) for t in self.depth_thresholds]}, "
                   f"calibrated={self.calibration is not None}" if self.depth_thresholds else "")
                + ")")


def load_stopper(path: str | Path, threshold: float | None = None,
                 aggregation: str | None = None, min_depth: int | None = None,
                 min_depth_gate: float | None = None,
                 skip_rate: float | None = None) -> LearnedStopper:
    """A stopper from an artifact folder (or its stopper.json); `threshold`, `aggregation`,
    `min_depth`, `min_depth_gate` and `skip_rate` override the artifact's choices (at every
    batch size: an override drops stopper.json's `batch` table; a threshold or aggregation
    drops the expected-throughput rule's per-depth thresholds and calibration)."""
    folder = artifact_folder(path)
    spec = ArtifactSpec.read(folder)
    overrides = {"threshold": threshold, "aggregation": aggregation, "min_depth": min_depth,
                 "min_depth_gate": min_depth_gate, "skip_rate": skip_rate}
    return stopper_from(spec, folder, **{k: v for k, v in overrides.items() if v is not None})


def stopper_from(spec: ArtifactSpec, folder: str | Path, **overrides: Any) -> LearnedStopper:
    """The stopper `spec` describes, its model read from `folder` (where `spec` need not be
    written yet); `overrides`: fields of `spec` to change (threshold, aggregation, min_depth,
    min_depth_gate, skip_rate, skip_probe, online_strength, batch); overriding a setting the
    `batch` table holds per batch size drops the table unless `batch` is given too."""
    folder = Path(folder)
    per_batch = {f.name for f in fields(BatchSetting)}
    if per_batch & set(overrides) and "batch" not in overrides:
        overrides = overrides | {"batch": None}
    if {"threshold", "aggregation"} & set(overrides) and "depth_thresholds" not in overrides:
        overrides = overrides | {"depth_thresholds": None, "calibration": None}  # one threshold
    spec = replace(spec, **overrides)
    if spec.kind == "lightgbm":
        model: Any = load_lightgbm(folder / "model.txt")
        if model.feature_names != list(spec.feature_names):
            raise MCSDError(f"{folder / 'model.txt'}: its features differ from stopper.json's "
                            f"{len(spec.feature_names)}; retrain it")
    else:
        model = load_mlp(folder)
        want = len(spec.feature_names) if spec.kind == "mlp" else spec.hidden_size
        if want is not None and model.in_features != want:
            raise MCSDError(f"{folder}: the MLP takes {model.in_features} inputs, expected {want}")
    return LearnedStopper(spec, model)


def training_temperatures(spec: ArtifactSpec | None) -> list[float]:
    """The sampling temperatures of the collections `spec`'s stopper was trained on (0:
    greedy), sorted; empty where the artifact does not record its collections."""
    runs = ((spec.training_data or {}).get("runs") if spec is not None else None) or []
    return sorted({float(r.get("temperature") or 0.0) for r in runs if isinstance(r, dict)})


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
