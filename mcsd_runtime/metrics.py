"""The one definition of each reported metric, shared by the decoder, replay and evaluation."""

from __future__ import annotations


def tau(tokens: int, target_calls: int) -> float:
    """Mean accepted length τ: committed tokens per target call (1.0 for AR)."""
    return tokens / target_calls if target_calls else 0.0


def acceptance_rate(acceptance_sum: float, drafting_steps: int) -> float:
    """The paper's acceptance rate: per drafting step, accepted / drafted depth, averaged."""
    return acceptance_sum / drafting_steps if drafting_steps else 0.0


def throughput(tokens: int, seconds: float) -> float:
    """Tokens per second."""
    return tokens / seconds if seconds else 0.0
