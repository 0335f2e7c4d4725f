"""`BudgetConfig`: the options of `mcsd train --decision budget` and their checks (the command
line, `train.cli`, builds it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from mcsd_runtime.errors import MCSDError
from train.stop.config import TrainConfig


@dataclass(frozen=True)
class BudgetConfig:
    """The artifact folder, the dense collections of a chain tree it trains on, and the node
    model's training options (the stopper's `TrainConfig`, with the hard label the budget reads
    and no end-to-end check); checked on construction (MCSDError)."""

    out: Path
    runs: tuple[Path, ...]
    training: TrainConfig = field(default_factory=lambda: TrainConfig(label="hard"))
    # its `mcsd train` options that only some decisions take
    OPTIONS: ClassVar[tuple[str, ...]] = ("runs", "model", "val_frac", "test_frac", "trajectory",
                                          "features", "batch_size", "max_epochs")

    def __post_init__(self) -> None:
        if not self.runs:
            raise MCSDError("--runs RUN_DIR is required: dense collections of a chain tree "
                            "(mcsd collect --dense --k-config 1,1,1,1,1,1)")
        object.__setattr__(self, "runs", tuple(Path(r) for r in self.runs))
        if self.training.label != "hard":
            raise MCSDError("the budget reads each node's hard label (P(it and its child are "
                            "accepted)): train it with --label hard")
        if self.training.check_prompts:
            raise MCSDError("--decision budget has no --check-prompts: measure it end to end "
                            "with `mcsd eval --methods budget:PATH --batch-layout ragged "
                            "--batch-depth row --batch-size ...`")

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes it is replayed at (and decoded at: `BudgetTrainer.decode`)."""
        return self.training.batch_sizes
