"""`ScheduleConfig`: the options of `mcsd train --decision schedule` and their checks (the command
line, `train.cli`, builds it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from mcsd_runtime.errors import MCSDError


@dataclass(frozen=True)
class ScheduleConfig:
    """The artifact folder, the acceptance traces and the engine profile it is chosen from, the
    bands, the largest K tried and the held-out split; checked on construction (MCSDError)."""

    out: Path
    runs: tuple[Path, ...]  # engine trace folders, or dense collections of a chain
    cost_profile: Path  # an engine profile (`mcsd profile --engine ENGINE`)
    # where the bands start (each covers up to the next); None: the profile's concurrencies
    batch_sizes: tuple[int, ...] | None = None
    max_k: int | None = None  # the largest K tried; None: the largest the traces support
    test_frac: float = 0.3  # held-out prompts the report is on (the rest choose K)
    seed: int = 0  # the split's seed
    # its `mcsd train` options that only some decisions take
    OPTIONS: ClassVar[tuple[str, ...]] = ("runs", "batch_size", "max_k", "test_frac")

    def __post_init__(self) -> None:
        if not self.runs:
            raise MCSDError("--runs DIR is required: engine trace folders, or dense collections "
                            "of a chain (mcsd collect --dense --k-config 1,1,1,1,1,1)")
        if self.cost_profile is None:
            raise MCSDError("--decision schedule needs --cost-profile: an engine profile "
                            "(`mcsd profile --engine vllm`)")
        object.__setattr__(self, "runs", tuple(Path(r) for r in self.runs))
        object.__setattr__(self, "cost_profile", Path(self.cost_profile))
        if self.batch_sizes is not None:
            if not self.batch_sizes or min(self.batch_sizes) < 1:
                raise MCSDError("--batch-size takes positive batch sizes, e.g. 1,4,8,16")
            object.__setattr__(self, "batch_sizes", tuple(sorted(set(self.batch_sizes))))
        if self.max_k is not None and self.max_k < 1:
            raise MCSDError(f"--max-k {self.max_k}: the largest K tried must be >= 1 (K=0, no "
                            f"speculation, is always tried)")
        if not 0 < self.test_frac < 1:
            raise MCSDError(f"--test-frac {self.test_frac}: the held-out share of prompts must "
                            f"lie between 0 and 1")
