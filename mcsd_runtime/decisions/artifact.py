"""`stopper.json`, the description of a trained stopper's artifact folder, as one typed contract.

`ArtifactSpec` is read by the runtime (`mcsd_runtime.decisions.learned`) and written by `train`; the
reader owns the format. Fields, in file order:

    format            "mcsd-stopper"
    kind              the model: one of STOPPER_KINDS (its files: MODEL_FILES[kind])
    schema_version    the feature schema it was trained on (mcsd_runtime.decisions.features)
    feature_names     FEATURE_NAMES, or DECISION_FEATURES or a subset of them, in that order
    inputs            "features" or "hidden" (the draft's last hidden state)
    hidden_size       width of the hidden state (inputs "hidden"), else null
    aggregation       how node scores become one frontier score (mcsd_runtime.decisions.aggregation)
    threshold         continue while the frontier score is >= it
    label, label_definition   what the model was fitted to (train.stop.config.LABEL_DOC)
    pair_fingerprint  the model pair of the training collection (mcsd_runtime.models.pair)
    k_config          the tree it was trained on
    prompt_format     how its training prompts reached the model (mcsd_runtime.prompts.chat):
                      {"format": "chat" | "text" | "mixed", "template_hash"}; absent or null
                      in artifacts older than the field, which read as text
    min_depth         depths below it are drafted without asking the model (absent: 1)...
    min_depth_gate    ...while the recent acceptance rate is at least this (absent: 0, always)
    skip_rate         draft nothing for a step while the recent acceptance rate is below it
                      (mcsd_runtime.decisions.skip.SkipGate; absent: 0, a draft at every step)...
    skip_probe        ...drafting again after this many steps without a draft (absent: 8);
                      both hold at every batch size
    online_strength   per-sequence recalibration of the continue-scores from the acceptances
                      seen (mcsd_runtime.decisions.online; the prior in tokens; absent: 0, off)
    depth_thresholds  the expected-throughput rule (mcsd_runtime.decisions.expected_rate): one
                      threshold per depth 1 .. depth-1, in place of `threshold` (absent: the
                      single threshold), compared with the `sum` of...
    calibration       ...node scores mapped to probabilities through these isotonic knots
                      {"x": [...], "y": [...]} (absent: the model's scores as they are); both
                      at batch size 1 and wherever no `batch` entry applies
    batch             settings by batch size, chosen by batched replay (absent: the top-level
                      ones at every batch size): {"8": {"threshold", "aggregation",
                      "row_aggregation", "min_depth", "min_depth_gate"}}; a stopper decoding
                      B rows takes the entry of the largest size <= B (`BatchSetting`)
    metrics, training_data, created   the training run's record (null until `train` writes it)

Unknown keys are ignored, so a newer writer's additions do not stop an older reader.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

from mcsd_runtime.constants import STOPPER_KINDS
from mcsd_runtime.decisions.aggregation import check_aggregation, check_row_aggregation
from mcsd_runtime.decisions.expected_rate import Calibration
from mcsd_runtime.decisions.features import DECISION_FEATURES, FEATURE_NAMES, SCHEMA_VERSION
from mcsd_runtime.decisions.skip import DEFAULT_PROBE, SkipGate
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts.chat import recorded_format
from mcsd_runtime.tree import KConfig, parse_k_config

FORMAT = "mcsd-stopper"
FILE = "stopper.json"
MODEL_FILES = {"lightgbm": ("model.txt",), "mlp": ("model.safetensors", "config.json"),
               "mlp-hidden": ("model.safetensors", "config.json")}
INPUTS = ("features", "hidden")


@dataclass(frozen=True, kw_only=True)
class BatchSetting:
    """How a learned stopper decides at one batch size: the node `aggregation` and `threshold`,
    the `row_aggregation` of the asked rows' frontier scores
    (mcsd_runtime.decisions.aggregation), and `min_depth` / `min_depth_gate` as at the top
    level. Checked on construction."""

    threshold: float
    aggregation: str
    row_aggregation: str = "max"
    min_depth: int = 1
    min_depth_gate: float = 0.0

    def __post_init__(self) -> None:
        check_aggregation(self.aggregation)
        check_row_aggregation(self.row_aggregation)
        _check_decision(self)


@dataclass(frozen=True, kw_only=True)
class ArtifactSpec:
    """The contents of `stopper.json`, checked on construction (MCSDError naming the field)."""

    kind: str
    schema_version: int
    feature_names: tuple[str, ...]
    inputs: str = "features"
    hidden_size: int | None = None
    aggregation: str
    threshold: float
    label: str | None = None
    label_definition: str | None = None
    pair_fingerprint: dict | None = None
    k_config: KConfig  # any k-config `parse_k_config` reads (a list in the file), then a KConfig
    prompt_format: dict | None = None
    min_depth: int = 1
    min_depth_gate: float = 0.0
    skip_rate: float = 0.0
    skip_probe: int = DEFAULT_PROBE
    online_strength: float = 0.0
    depth_thresholds: tuple[float, ...] | None = None
    calibration: Calibration | None = None
    batch: dict[int, BatchSetting] | None = None
    metrics: dict | None = None
    training_data: dict | None = None
    created: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in STOPPER_KINDS:
            raise MCSDError(f"unknown stopper kind {self.kind!r} (known: "
                            f"{', '.join(STOPPER_KINDS)})")
        if self.schema_version != SCHEMA_VERSION:
            raise MCSDError(f"trained on feature schema version {self.schema_version!r}, this "
                            f"runtime computes version {SCHEMA_VERSION}; retrain it on a "
                            f"collection made with this version")
        names = tuple(self.feature_names or ())
        if names != FEATURE_NAMES and not decision_subset(names):
            extra = sorted(set(names) - set(FEATURE_NAMES))
            raise MCSDError(f"its feature list differs from the runtime's (unknown: "
                            f"{extra or 'none'}, or another order); retrain it on a collection "
                            f"made with this version")
        object.__setattr__(self, "feature_names", names)
        if self.inputs not in INPUTS:
            raise MCSDError(f"inputs {self.inputs!r}: use {' or '.join(INPUTS)}")
        check_aggregation(self.aggregation)
        _check_decision(self)
        _set_number(self, "skip_rate", float, "skip_rate must be a number in [0, 1]")
        _set_number(self, "skip_probe", int, "skip_probe must be a positive integer")
        SkipGate(self.skip_rate, self.skip_probe)  # checks both ranges
        _set_number(self, "online_strength", float, "online_strength must be a number >= 0")
        if not self.online_strength >= 0:
            raise MCSDError(f"online_strength must be a number >= 0, got {self.online_strength}")
        if self.depth_thresholds is not None:
            try:
                depths = tuple(float(t) for t in self.depth_thresholds)
            except (TypeError, ValueError):
                depths = ()
            if not depths or any(not t >= 0 for t in depths):
                raise MCSDError(f"depth_thresholds must be a list of numbers >= 0, one per "
                                f"depth, got {self.depth_thresholds!r}")
            object.__setattr__(self, "depth_thresholds", depths)
        if self.calibration is not None:
            object.__setattr__(self, "calibration", Calibration.from_json(self.calibration))
        if self.batch is not None:
            object.__setattr__(self, "batch", self._batch_table(self.batch))
        if self.hidden_size is not None:
            _set_number(self, "hidden_size", int, "hidden_size must be an integer or null")
        if self.prompt_format is not None:
            object.__setattr__(self, "prompt_format", recorded_format(self.prompt_format))
        try:
            k_config = parse_k_config(self.k_config)
            if not k_config:
                raise ValueError
            object.__setattr__(self, "k_config", k_config)
        except (MCSDError, TypeError, ValueError):
            raise MCSDError(f"k_config {self.k_config!r} is not a k-config (a list of positive "
                            f"integers); retrain or restore the artifact") from None

    def _batch_table(self, table: Any) -> dict[int, BatchSetting]:
        """`batch` checked, keyed by int, sorted; an entry's missing fields are the top-level
        ones (row_aggregation: max)."""
        if not isinstance(table, dict):
            raise MCSDError(f"batch must map batch sizes to settings, got {table!r}")
        out = {}
        for key, entry in table.items():
            try:
                size = int(key)
                if size < 1 or str(size) != str(key).strip():
                    raise ValueError
            except (TypeError, ValueError):
                raise MCSDError(f"batch: {key!r} is not a batch size (a positive "
                                f"integer)") from None
            if not isinstance(entry, BatchSetting):
                if not isinstance(entry, dict) or "threshold" not in entry:
                    raise MCSDError(f"batch[{size}] must be an object with a threshold, got "
                                    f"{entry!r}")
                known = {f.name for f in fields(BatchSetting)}
                inherited = {k: getattr(self, k) for k in ("aggregation", "min_depth",
                                                           "min_depth_gate")}
                try:
                    entry = BatchSetting(**(inherited | {k: v for k, v in entry.items()
                                                         if k in known}))
                except MCSDError as err:
                    raise MCSDError(f"batch[{size}]: {err}") from None
            out[size] = entry
        return dict(sorted(out.items()))

    def for_batch(self, batch_size: int) -> BatchSetting:
        """The setting for `batch_size` rows: the table's entry of the largest size <= it, else
        the top-level one (row aggregation max, which decides as each row alone would)."""
        table = self.batch or {}
        sizes = [b for b in table if b <= batch_size]
        if sizes:
            return table[sizes[-1]]
        return BatchSetting(threshold=self.threshold, aggregation=self.aggregation,
                            min_depth=self.min_depth, min_depth_gate=self.min_depth_gate)

    def to_json(self) -> dict:
        """The `stopper.json` object, keys in file order (`batch` only when there is a
        table, `prompt_format` only when recorded, the skip fields only with a skip rate,
        `online_strength` only when on)."""
        out = {"format": FORMAT} | asdict(self)
        if self.prompt_format is None:
            del out["prompt_format"]
        if not self.skip_rate:  # a draft at every step, as in artifacts older than the fields
            del out["skip_rate"], out["skip_probe"]
        if not self.online_strength:  # off, as in artifacts older than the field
            del out["online_strength"]
        rule = {"depth_thresholds": list(self.depth_thresholds or ()),  # only when in use
                "calibration": self.calibration.to_json() if self.calibration else None}
        for name, value in rule.items():
            if getattr(self, name) is None:
                del out[name]
            else:
                out[name] = value
        out["feature_names"] = list(self.feature_names)
        out["k_config"] = self.k_config.json()
        if self.batch is None:
            del out["batch"]
        else:
            out["batch"] = {str(b): asdict(s) for b, s in self.batch.items()}
        return out

    @classmethod
    def from_json(cls, data: Any, source: str = FILE) -> ArtifactSpec:
        """From a parsed `stopper.json` (read from `source`); MCSDError naming the bad field."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise MCSDError(f"{source} is not a stopper description (format {FORMAT!r})")
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in data]
        known = {f.name for f in fields(cls)}
        try:
            if missing:
                raise MCSDError(f"missing field(s) {', '.join(missing)}; retrain or restore the "
                                f"artifact")
            return cls(**{k: v for k, v in data.items() if k in known})
        except MCSDError as err:
            raise MCSDError(f"{source}: {err}") from None
        except (TypeError, ValueError) as err:  # a wrongly typed field
            raise MCSDError(f"{source}: malformed field ({err}); retrain or restore the "
                            f"artifact") from None

    def write(self, folder: str | Path) -> Path:
        """Write `folder/stopper.json`; returns its path."""
        path = Path(folder) / FILE
        path.write_text(json.dumps(self.to_json(), indent=1, default=float) + "\n")
        return path

    @classmethod
    def read(cls, folder: str | Path) -> ArtifactSpec:
        """The checked `stopper.json` of an artifact folder; MCSDError naming the file and the
        problem."""
        path = description_file(folder)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise MCSDError(f"cannot read {path}: {err}") from None
        return cls.from_json(data, str(path))


def decision_subset(names: tuple[str, ...]) -> bool:
    """Whether `names` are some of DECISION_FEATURES (at least one), in their order."""
    return bool(names) and names == tuple(n for n in DECISION_FEATURES if n in names)


def description_file(folder: str | Path) -> Path:
    """`folder/stopper.json`; MCSDError if `folder` has none."""
    path = Path(folder) / FILE
    if not path.is_file():
        raise MCSDError(f"{folder} is not a stopper artifact: no {FILE}")
    return path


def artifact_folder(path: str | Path) -> Path:
    """An artifact folder given as the folder or as its `stopper.json`."""
    path = Path(path)
    return path.parent if path.name == FILE else path


def _check_decision(spec: ArtifactSpec | BatchSetting) -> None:
    """threshold, min_depth and min_depth_gate: numbers of their kinds and ranges."""
    _set_number(spec, "threshold", float, "missing or non-numeric threshold")
    _set_number(spec, "min_depth", int, "min_depth must be a positive integer")
    if spec.min_depth < 1:
        raise MCSDError(f"min_depth must be a positive integer, got {spec.min_depth}")
    _set_number(spec, "min_depth_gate", float, "min_depth_gate must be a number in [0, 1]")
    if not 0 <= spec.min_depth_gate <= 1:
        raise MCSDError(f"min_depth_gate must be a number in [0, 1], got "
                        f"{spec.min_depth_gate:g}")


def _set_number(spec: ArtifactSpec | BatchSetting, name: str, kind: type, message: str) -> None:
    value = getattr(spec, name)
    try:
        if isinstance(value, bool) or (kind is int and float(value) != int(value)):
            raise ValueError
        object.__setattr__(spec, name, kind(value))
    except (TypeError, ValueError):
        raise MCSDError(f"{message}, got {value!r}") from None
