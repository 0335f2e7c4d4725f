"""What lets a learned stopper adapt to the run: acceptance rates that mean the same under any
stopper, and a min_depth that hands shallow depths back to the model when acceptance drops."""

from __future__ import annotations

import pytest

from mcsd_runtime.decisions.features import (
    ACCEPT_PRIOR,
    RECENT_DECAY,
    TRAJECTORY_FEATURES,
    Trajectory,
)
from mcsd_runtime.decisions.learned import drafts_without_deciding

RATE, RECENT = (TRAJECTORY_FEATURES.index(n) for n in ("accept_rate", "accept_rate_recent"))
A0, N0 = ACCEPT_PRIOR


def test_a_shallow_fully_accepted_step_is_not_read_as_low_acceptance():
    """Stopping at depth 2 with both accepted judged 2 tokens, both good: the rate rises, as it
    does for a deep step that accepted everything."""
    shallow, deep = Trajectory(), Trajectory()
    shallow.update(2, 3, drafted=2)
    deep.update(8, 9, drafted=8)
    assert shallow.values()[RATE] == pytest.approx((2 + A0) / (2 + N0))
    assert shallow.values()[RATE] > A0 / N0 and deep.values()[RATE] > shallow.values()[RATE]


def test_a_rejection_counts_one_judged_token_more():
    traj = Trajectory()
    traj.update(1, 2, drafted=4)  # one accepted, the second rejected: 1 of 2
    traj.update(0, 1, drafted=1)  # the first rejected: 0 of 1
    assert traj.values()[RATE] == pytest.approx((1 + A0) / (3 + N0))
    assert traj.tokens_generated == 3 and traj.prev_accepted == 0 and traj.steps == 2


def test_the_recent_rate_forgets_old_steps():
    traj = Trajectory()
    for _ in range(10):
        traj.update(4, 5, drafted=4)  # a long run of full acceptance
    for _ in range(8):
        traj.update(0, 1, drafted=2)  # then every first token rejected
    values = traj.values()
    assert values[RECENT] < 0.5 < values[RATE]
    hits = 4 * RECENT_DECAY ** 8 * sum(RECENT_DECAY ** i for i in range(10))
    tries = hits + sum(RECENT_DECAY ** i for i in range(8))
    assert values[RECENT] == pytest.approx((hits + A0) / (tries + N0))


class _Frontier:
    def __init__(self, depth: int, recent: float) -> None:
        self.depth = depth
        self._traj = [0.0] * len(TRAJECTORY_FEATURES)
        self._traj[RECENT] = recent

    def trajectory(self) -> list[float]:
        return self._traj


@pytest.mark.parametrize(("depth", "recent", "gate", "skips"), [
    (1, 0.9, 0.0, True),  # below min_depth, no gate: always drafted
    (1, 0.1, 0.0, True),
    (1, 0.7, 0.6, True),  # acceptance high: drafted without a decision
    (1, 0.5, 0.6, False),  # acceptance dropped: the model decides from depth 1
    (3, 0.9, 0.6, False),  # at min_depth: always decided
])
def test_the_gate_hands_shallow_depths_back_to_the_model(depth, recent, gate, skips):
    assert drafts_without_deciding(_Frontier(depth, recent), 3, gate) is skips


def test_decision_cost_is_measured_on_the_collections_own_small_pair(toy_tiny, tmp_path):
    """Replay charges a decision what it costs between the pair's own forwards (their caches
    evicted), as a median; a pair that is not a local folder falls back to a random one."""
    from mcsd_runtime.benchmarks.decision_cost import small_local_pair, stopper_latency
    from mcsd_runtime.decisions.builtin import make_stopper

    fp = {"target": str(toy_tiny / "target"), "draft": str(toy_tiny / "draft")}
    assert small_local_pair(fp) is not None
    assert small_local_pair({"target": str(tmp_path / "no"), "draft": str(tmp_path)}) is None
    assert small_local_pair(None) is None
    latency = stopper_latency(make_stopper("confidence:0.4"), None, fp, (1, 1, 1))
    assert latency["in_decoder_pair"] == "collection"
    assert latency["in_decoder_us"] == latency["in_decoder"]["median_us"]
    assert latency["in_decoder"]["decisions"] > 0
