"""`CopyConfig`: the options of `mcsd train --decision copy`, their defaults and their checks
(the command line, `train.cli`, builds it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from mcsd_runtime.errors import MCSDError
from train.outputs import OutputsConfig, check_held_out, check_positive


@dataclass(frozen=True)
class CopyConfig:
    """The artifact folder, the outputs to train on, the policy's options and the end-to-end
    check; checked on construction (MCSDError)."""

    out: Path
    outputs: OutputsConfig
    # learn to copy or to draft this tree's first depth (decode beside `static:1`); None: a
    # step that copies nothing is the target's alone
    k_config: str | None = None
    max_copy: int = 15  # most tokens copied in a step
    # shortest match considered; None: 1, or 2 with k_config (where a copy after a one-token
    # match rarely beats the draft)
    min_ngram: int | None = None
    temperature: float = 0.0  # that the policy will decode at: outputs sampled at it; 0 greedy
    folds: int = 5  # the training mix replayed out of fold over this many folds; 0 skips
    check_prompts: int = 0  # held-out prompts per category decoded end to end; 0 skips
    # its `mcsd train` options that only some decisions take
    OPTIONS: ClassVar[tuple[str, ...]] = (*OutputsConfig.OPTIONS, "k_config", "max_copy",
                                          "min_ngram", "temperature", "folds")

    def __post_init__(self) -> None:
        min_ngram = self.min_ngram
        if min_ngram is None:
            min_ngram = 1 if self.k_config is None else 2
            object.__setattr__(self, "min_ngram", min_ngram)
        check_positive(max_copy=self.max_copy, min_ngram=min_ngram)
        if self.temperature < 0 or self.check_prompts < 0 or self.folds < 0 or self.folds == 1:
            raise MCSDError("--temperature, --check-prompts and --folds must be >= 0 (0: greedy; "
                            "no check; no out-of-fold replay) and --folds not 1")
        check_held_out(self.check_prompts, self.outputs)
        if min_ngram > 4:
            raise MCSDError("--min-ngram: matches are of 1..4 tokens; use 4 at most")
        if self.k_config is not None:
            from mcsd_runtime.tree import parse_k_config

            parse_k_config(self.k_config)  # refuses a malformed one
