"""The expected-throughput rule: draft one more depth while the tokens it is expected to add pay
for the seconds it costs at a target rate.

After drafting depth d, one more depth adds P(L > d) accepted tokens in expectation (the sum of
the frontier's node probabilities of the hard label, `train.stop.labels`) and costs `marginal
seconds` Δc_d: the draft forward of depth d's nodes plus verifying depth d+1's nodes, read from
a cost profile. A stopper that drafts on while

    P(L > d) >= λ · Δc_d

maximizes expected tokens − λ · seconds in every step; at λ = the throughput it reaches
(Dinkelbach's fixed point) that maximizes throughput. So the thresholds come from costs, one per
depth (`rate_thresholds`), not from a search, and the model's scores must be probabilities:
`Calibration` maps them (isotonic, fitted on validation prompts) before they are summed. SpecDec++
and vLLM's adaptive verification decide the same way.

Numpy only: the runtime reads it without the training stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mcsd_runtime.errors import MCSDError


@dataclass(frozen=True)
class Calibration:
    """A monotone map from model scores to probabilities: linear interpolation through the knots
    (`x` increasing, `y` non-decreasing in [0, 1]), flat beyond them."""

    x: tuple[float, ...]
    y: tuple[float, ...]

    def __post_init__(self) -> None:
        x, y = np.asarray(self.x, dtype=float), np.asarray(self.y, dtype=float)
        if (x.ndim != 1 or len(x) < 2 or x.shape != y.shape or np.any(np.diff(x) <= 0)
                or np.any(np.diff(y) < 0) or np.any((y < 0) | (y > 1))):
            raise MCSDError("calibration must hold knots x (at least 2, increasing) and y (as "
                            "many, non-decreasing, in [0, 1]); retrain or restore the artifact")
        object.__setattr__(self, "x", tuple(map(float, x)))
        object.__setattr__(self, "y", tuple(map(float, y)))

    def __call__(self, p: np.ndarray) -> np.ndarray:
        return np.interp(p, self.x, self.y)

    def to_json(self) -> dict:
        return {"x": list(self.x), "y": list(self.y)}

    @classmethod
    def from_json(cls, data: Any) -> Calibration:
        if isinstance(data, Calibration):
            return data
        if not isinstance(data, dict) or not {"x", "y"} <= set(data):
            raise MCSDError(f"calibration must be an object with knots x and y, got {data!r}")
        try:
            return cls(tuple(data["x"]), tuple(data["y"]))
        except (TypeError, ValueError):
            raise MCSDError("calibration knots must be numbers; retrain or restore the "
                            "artifact") from None


def marginal_seconds(profile, tree) -> list[float]:
    """Δc_d for d = 1 .. depth−1 of `tree` under `profile` (a `CostProfile`): the seconds a step
    stopped at d+1 costs over one stopped at d (draft forward, verified nodes, per-depth
    overhead), at batch size 1."""
    return [profile.step_seconds(tree, d + 1, 1) - profile.step_seconds(tree, d, 1)
            for d in range(1, tree.depth)]


def rate_thresholds(profile, tree, rate: float) -> tuple[float, ...]:
    """The rule's threshold after each depth d = 1 .. depth−1: `rate` (tokens/s, λ) × Δc_d."""
    if not rate > 0:
        raise MCSDError(f"rate {rate!r}: a throughput in tokens per second, > 0")
    return tuple(rate * max(0.0, c) for c in marginal_seconds(profile, tree))
