"""Online recalibration of a learned stopper, per sequence (as HF assisted generation re-fits
its confidence threshold from the acceptances it sees).

Each time the stopper drafts past depth d it predicted P(L > d), the frontier's summed node
scores; the step's verification then says whether the target accepted past d. A sequence whose
acceptances fall short of its predictions (a category the stopper was not trained on, say) gets
its continue-scores scaled down by `factor`, one that beats them scaled up:

    factor = (accepted + strength) / (predicted + strength)

`strength` is the prior in tokens: the factor starts at 1 and moves as evidence outweighs it.
Only the depths it drafted past are seen, so a stopper that stops too early learns nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OnlineCalibration:
    """One sequence's predicted and accepted counts at the depths its stopper drafted past."""

    strength: float
    predicted: float = 0.0
    accepted: float = 0.0
    pending: list[tuple[int, float]] = field(default_factory=list)  # this step's (depth, P)

    def factor(self) -> float:
        return (self.accepted + self.strength) / (self.predicted + self.strength)

    def drafted_past(self, depth: int, p_longer: float) -> None:
        """The stopper continued after `depth`, predicting the path is accepted past it with
        probability `p_longer`."""
        self.pending.append((depth, p_longer))

    def update(self, drafted: int, accepted: int) -> None:
        """The step drafted `drafted` depths and the target accepted `accepted` of them."""
        for depth, p in self.pending:
            if depth < drafted:  # the next depth went to the target
                self.predicted += p
                self.accepted += accepted > depth
        self.pending = []
