"""Drafting nothing: the rule by which a stopper skips the draft for a step and decodes one token
with the target alone (`Stopper.should_draft`), and the acceptance rate below which drafting
cannot pay under a cost profile.

`SkipGate(rate, probe)` drafts while the sequence's recent acceptance rate (the trajectory
feature `accept_rate_recent`) is at least `rate`; below it, it drafts nothing, except once after
`probe` steps in a row without a draft, so that the rate is measured again and drafting comes
back when acceptance does (a step without a draft leaves the rate as it was). `rate` 0 drafts
every step. TensorRT-LLM and vLLM switch speculation off below an acceptance rate in the same
way.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from mcsd_runtime.decisions.features import TRAJECTORY_FEATURES
from mcsd_runtime.errors import MCSDError

_RECENT_RATE = TRAJECTORY_FEATURES.index("accept_rate_recent")
DEFAULT_PROBE = 8


@dataclass
class SkipGate:
    """Draft nothing while the recent acceptance rate is below `rate`, probing every `probe`
    steps. Per-sequence state: the steps since the last draft."""

    rate: float = 0.0
    probe: int = DEFAULT_PROBE
    idle: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise MCSDError(f"skip rate {self.rate!r}: an acceptance rate in [0, 1]")
        if self.probe != int(self.probe) or self.probe < 1:
            raise MCSDError(f"skip probe {self.probe!r}: a whole number of steps >= 1")
        self.probe = int(self.probe)

    def reset(self) -> None:
        self.idle = 0

    def should_draft(self, trajectory: list[float]) -> bool:
        if self.rate <= 0 or self.idle >= self.probe:
            return True
        return trajectory[_RECENT_RATE] >= self.rate

    def update(self, drafted: int) -> None:
        self.idle = 0 if drafted else self.idle + 1


class SkipsDrafts:
    """Stopper members for a stopper that holds a `SkipGate` in `self.skip`: a fresh gate per
    sequence (rows of a batch share nothing), `should_draft` from it, `update` feeding it."""

    skip: SkipGate

    def reset(self) -> None:
        self.skip = copy.copy(self.skip)
        self.skip.reset()

    def should_draft(self, start) -> bool:
        return self.skip.should_draft(start.trajectory())

    def update(self, drafted: int, accepted: int) -> None:
        self.skip.update(drafted)


def break_even_rate(profile, tree, pending: int = 2) -> float:
    """The per-token acceptance rate below which no static depth of `tree`'s chain of first
    children beats decoding with the target alone under `profile` (`CostProfile`): the smallest
    a with max over s of E[tokens of depth s] / seconds(s) >= 1 / seconds(0), where a step
    drafted to depth s commits 1 + a + ... + a^s tokens when each drafted token is accepted
    with probability a. 1.0 when no rate pays."""
    ar = profile.step_seconds(tree, 0, 1)

    def pays(a: float) -> bool:
        return any(sum(a**i for i in range(s + 1)) / profile.step_seconds(tree, s, pending)
                   >= 1.0 / ar for s in range(1, tree.depth + 1))

    if not pays(1.0):
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if pays(mid) else (mid, hi)
    return hi
