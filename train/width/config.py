"""`WidthConfig`: the options of `mcsd train --decision width`, their defaults and their checks
(the command line, `train.cli`, builds it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from mcsd_runtime.errors import MCSDError
from train.outputs import OutputsConfig, check_held_out


@dataclass(frozen=True)
class WidthConfig:
    """The artifact folder, the outputs to train on, the tree whose first depth's candidates
    the width chooses among, and the end-to-end check; checked on construction (MCSDError)."""

    out: Path
    outputs: OutputsConfig
    k_config: str = "4"  # its first depth is the widest width; decode on a tree starting so
    check_prompts: int = 0  # held-out prompts per category decoded end to end; 0 skips
    # its `mcsd train` options that only some decisions take
    OPTIONS: ClassVar[tuple[str, ...]] = (*OutputsConfig.OPTIONS, "k_config")

    def __post_init__(self) -> None:
        if self.k < 2:
            raise MCSDError("the first depth of --k-config must be at least 2 (one candidate "
                            "leaves nothing to choose)")
        check_held_out(self.check_prompts, self.outputs)

    @property
    def k(self) -> int:
        """The first depth's candidates: the widest width."""
        from mcsd_runtime.tree import parse_k_config

        return parse_k_config(self.k_config)[0]
