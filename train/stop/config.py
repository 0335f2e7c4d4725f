"""`TrainConfig`: the options of one `train_stopper` run, their defaults and their checks.

Torch-free (like `mcsd_runtime.constants`), so that the CLI reads its defaults from here when it
builds its parser."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mcsd_runtime.constants import STOPPER_KINDS
from mcsd_runtime.decisions.features import parse_feature_set
from mcsd_runtime.errors import MCSDError
from replay.data import REPLAY_MODES

LABEL_DOC = {
    "hard": "on_accepted_path and accepted_length > depth (the node is accepted and so is one of "
            "its children)",
    "soft": "product of min(1, p/q) along the path to the node times the best child's min(1, p/q)",
}
# the models' hyper-parameters (train.stop.models, train.stop.lightning_module)
LGBM_PARAMS = dict(learning_rate=0.1, num_leaves=31, max_depth=6, min_data_in_leaf=40,
                   feature_fraction=0.9, bagging_fraction=0.9, bagging_freq=1, lambda_l2=1.0,
                   verbose=-1, num_threads=2)
LGBM_ROUNDS, LGBM_PATIENCE = 300, 30
MLP_HIDDEN, HIDDEN_MLP_HIDDEN = (64, 64), (512, 256)  # the latter: the paper's decision model
MLP_EPOCHS, MLP_PATIENCE, MLP_BATCH, MLP_LR, MLP_WEIGHT_DECAY = 40, 4, 512, 1e-3, 1e-4
TRAJECTORIES = ("walk", "stored")  # see train.stop.labels.walk_trajectory


def default_label(model: str) -> str:
    """The CLI's label when none is given: soft for mlp-hidden (as in the paper), else hard."""
    return "soft" if model == "mlp-hidden" else TrainConfig.label


@dataclass(frozen=True)
class TrainConfig:
    """Options of `train.stop.pipeline.train_stopper`; checked on construction (MCSDError)."""

    model: str = "lightgbm"  # one of STOPPER_KINDS
    label: str = "hard"  # a key of LABEL_DOC
    seed: int = 0  # split and model seed
    val_frac: float = 0.2  # share of prompts for validation (choosing threshold, aggregation)
    test_frac: float = 0.2  # share of prompts for the held-out report
    aggregations: tuple[str, ...] | None = None  # None: all of stop.learned.AGGREGATIONS
    replay_mode: str = "auto"  # one of REPLAY_MODES
    max_epochs: int | None = None  # MLP epochs cap; None: MLP_EPOCHS
    trajectory: str = "walk"  # one of TRAJECTORIES
    decision_us: float | None = None  # µs charged per decision; None: benchmarked
    check_prompts: int = 0  # test prompts decoded end to end (replay.check); 0 skips
    # batch sizes to choose settings for (stopper.json's `batch` table): 1 is the top level,
    # each size above 1 an entry chosen by batched replay (needs a profile measured there)
    batch_sizes: tuple[int, ...] = (1,)
    progress: bool = True  # fit and replay sweep progress on stderr
    # also try per-sequence recalibration (stop.online) by replay; off by default: on the real
    # pair it replayed 0.6% faster and measured at parity end to end (README)
    online: bool = False
    # what the model reads: a name of stop.features.FEATURE_SETS or comma-separated
    # DECISION_FEATURES (stop.features.parse_feature_set)
    features: str = "all"
    # the `mcsd train` options that only some decisions take and --decision stop takes: these
    # fields (`replay` is replay_mode, `batch_size` batch_sizes, `label` defaults by the
    # model: `default_label`), and the run folders (`runs`), other domains (`domains`) and the
    # latency benchmark (`bench_latency`) of the command
    OPTIONS: ClassVar[tuple[str, ...]] = (
        "runs", "model", "label", "val_frac", "test_frac", "aggregations", "replay",
        "trajectory", "features", "decision_us", "batch_size", "online", "max_epochs",
        "domains", "bench_latency")

    def __post_init__(self) -> None:
        if self.model not in STOPPER_KINDS:
            raise MCSDError(f"unknown model {self.model!r}: use one of "
                            f"{', '.join(STOPPER_KINDS)}")
        if self.label not in LABEL_DOC:
            raise MCSDError(f"unknown label {self.label!r}: use {' or '.join(LABEL_DOC)}")
        if not (0 < self.val_frac < 1 and 0 < self.test_frac < 1
                and self.val_frac + self.test_frac < 1):
            raise MCSDError(f"val_frac {self.val_frac:g} and test_frac {self.test_frac:g} must "
                            f"each lie between 0 and 1 and leave prompts to train on (sum < 1)")
        if self.replay_mode not in REPLAY_MODES:
            raise MCSDError(f"unknown replay mode {self.replay_mode!r}: use "
                            f"{', '.join(REPLAY_MODES)}")
        if self.trajectory not in TRAJECTORIES:
            raise MCSDError(f"unknown trajectory {self.trajectory!r}: use "
                            f"{' or '.join(TRAJECTORIES)}")
        if self.features != "all" and self.hidden:
            raise MCSDError("--features chooses scalar features; mlp-hidden reads hidden states")
        parse_feature_set(self.features)  # checks the names
        if self.max_epochs is not None and self.max_epochs < 1:
            raise MCSDError(f"max_epochs must be at least 1, got {self.max_epochs}")
        if self.check_prompts < 0:
            raise MCSDError(f"check_prompts must be 0 (skip) or more, got {self.check_prompts}")
        if self.decision_us is not None and self.decision_us < 0:
            raise MCSDError(f"decision_us must not be negative, got {self.decision_us:g}")
        sizes = tuple(self.batch_sizes)
        if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                            for b in sizes):
            raise MCSDError(f"batch sizes must be positive integers, got {self.batch_sizes!r}")
        object.__setattr__(self, "batch_sizes", tuple(sorted({1, *sizes})))
        if self.aggregations is not None:
            # imports torch: only when given
            from mcsd_runtime.decisions.aggregation import AGGREGATIONS

            aggs = tuple(self.aggregations)
            bad = [a for a in aggs if a not in AGGREGATIONS]
            if bad or not aggs:
                raise MCSDError(f"{f'unknown aggregation(s) {bad}' if bad else 'no aggregation'}:"
                                f" use one or more of {', '.join(AGGREGATIONS)}")
            object.__setattr__(self, "aggregations", aggs)  # a list given: stored as a tuple

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The scalar features the model reads (and stopper.json records)."""
        return parse_feature_set(self.features)

    @property
    def hidden(self) -> bool:
        """Whether the model reads the draft's hidden states instead of the scalar features."""
        return self.model == "mlp-hidden"
