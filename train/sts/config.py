"""`StsConfig`: the options of `mcsd train --decision sts` and their checks (the command line,
`train.cli`, builds it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from mcsd_runtime.errors import MCSDError


@dataclass(frozen=True)
class StsConfig:
    """The folder written, what the table is fitted on (collections or DSpark's shards), the
    positions fitted and the held-out split; checked on construction (MCSDError)."""

    out: Path
    runs: tuple[Path, ...] = ()  # collections of `mcsd collect` (one row per drafted node)
    from_shards: str | None = None  # a glob of DSpark's captured .pt shards
    gamma: int | None = None  # draft positions fitted; None: the deepest the data drafted
    test_frac: float = 0.3  # held-out prompts (shards: samples) the report is on
    seed: int = 0  # the split's seed
    offsets: bool = False  # fit a per-position offset beside each temperature (ours only)
    # its `mcsd train` options that only some decisions take
    OPTIONS: ClassVar[tuple[str, ...]] = ("runs", "from_shards", "gamma", "test_frac",
                                          "offsets")

    def __post_init__(self) -> None:
        if bool(self.runs) == bool(self.from_shards):
            raise MCSDError("--decision sts fits on --runs RUN_DIR (collections of `mcsd "
                            "collect --dense`) or on --from-shards GLOB (SGLang's or "
                            "TensorRT-LLM's captured .pt shards): pass one of them")
        object.__setattr__(self, "runs", tuple(Path(r) for r in self.runs))
        if self.gamma is not None and self.gamma < 1:
            raise MCSDError(f"--gamma {self.gamma}: the draft positions fitted must be >= 1")
        if self.offsets and self.from_shards:
            raise MCSDError("--offsets fits what the engines do not read: a table of an "
                            "engine's shards must hold temperatures only (leave --offsets out)")
        if not 0 < self.test_frac < 1:
            raise MCSDError(f"--test-frac {self.test_frac}: the held-out share must lie "
                            f"between 0 and 1")
