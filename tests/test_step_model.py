"""The step rules every consumer shares (`pricing.step_model`); that they are the decoder's
is checked by the exact-replay tests (test_train), which replay collected runs token for token."""

from __future__ import annotations

from mcsd_runtime.pricing.step_model import (
    FIRST_PENDING,
    PENDING_STATES,
    step_forwards,
    step_outcome,
)
from mcsd_runtime.tree import Tree


def test_a_step_accepts_at_most_its_depth_and_commits_one_more():
    out = step_outcome(full_accepted=3, depth=2, pending=2)
    assert (out.depth, out.accepted, out.committed) == (2, 2, 3)
    assert out.pending == 2  # the bonus token and the never-forwarded accepted node at depth 2
    out = step_outcome(full_accepted=1, depth=3, pending=1)
    assert (out.accepted, out.committed, out.pending) == (1, 2, 1)
    assert step_outcome(3, 3, room=2).committed == 2  # clipped at the output's end


def test_a_step_that_drafts_nothing_keeps_its_pending_tokens():
    out = step_outcome(full_accepted=0, depth=0, pending=2)
    assert (out.accepted, out.committed, out.pending) == (0, 1, 3)


def test_forwards_of_a_step():
    tree = Tree((2, 2, 1))  # 2, 4, 4 nodes per depth
    f = step_forwards(tree, 3, pending=2)
    assert f.draft == (2, 2, 4) and f.target == 1 + 10
    assert step_forwards(tree, 1, 1).draft == (1,)
    assert step_forwards(tree, 0, 3).draft == () and step_forwards(tree, 0, 3).target == 1


def test_pending_states_are_closed_under_drafting_steps():
    assert FIRST_PENDING in PENDING_STATES
    for pending in PENDING_STATES:
        for depth in (1, 2, 3):
            for full in range(4):
                assert step_outcome(full, depth, pending).pending in PENDING_STATES
