"""The engine's one planner (`mcsd_runtime.decode.planning`): `StepPlanner` copies by prompt
lookup's rule (`CopyRule`), cuts to a learned width where there is one, and hands every other
question and each outcome to its inner planner unchanged; `planner_for` gives a decoder's own
planner at a batch of one and `for_batch` above it, else the stoppers' adapter."""

from __future__ import annotations

from types import SimpleNamespace

from mcsd_runtime.decisions.builtin import StaticStopper
from mcsd_runtime.decisions.contract import Planner, StepStart
from mcsd_runtime.decode.planning import CopyRule, RowPlanner, StepPlanner, open_step, planner_for
from mcsd_runtime.decode.records import DecodeConfig

REPEAT = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4]  # its last 4 tokens occurred before, then 5, 6, 7


def row(committed: list[int]) -> SimpleNamespace:
    return SimpleNamespace(committed=committed, n_prompt=2, copy_history=None, d_pending=[0])


class Recording(Planner):
    """A planner that notes every question it is asked and answers with fixed values."""

    def __init__(self, batch_size: int = 1) -> None:
        self.batch_size, self.asked = batch_size, []

    def for_batch(self, batch_size: int) -> Recording:
        return Recording(batch_size)

    def plan(self, starts):
        self.asked.append(("plan", len(starts)))
        return [True] * len(starts)

    def extend(self, frontiers):
        self.asked.append(("extend", len(frontiers)))
        return [False] * len(frontiers)

    def verify(self, drafted):
        self.asked.append(("verify", drafted))
        return [max(0, d - 1) for d in drafted]

    def outcome(self, row, drafted, accepted):
        self.asked.append(("outcome", drafted, accepted))


def test_a_planner_copies_nothing_and_verifies_every_candidate_by_default():
    base = Recording()
    assert base.copy([object(), object()], [3, 3]) == [[], []]
    assert base.width([[0.5, 0.3, 0.1], [0.9, 0.05]]) == [3, 2]


def test_the_copy_rule_copies_what_followed_up_to_the_cap_and_lookup():
    rule = CopyRule(DecodeConfig(lookup=3), None, beside_draft=False)
    assert rule.copy(row(REPEAT), 5) == [5, 6, 7]  # lookup caps it at 3
    assert rule.copy(row(REPEAT), 2) == [5, 6]  # the row's tokens left cap it
    assert rule.copy(row(REPEAT), 0) == []
    assert rule.copy(row([1, 2, 3, 4, 5, 6]), 3) == []  # nothing repeats
    assert CopyRule(DecodeConfig(), None, False).copy(row(REPEAT), 5) == []  # lookup off


def test_the_step_planner_asks_its_parts_and_hands_the_rest_on():
    inner = Recording()
    chosen = []

    def choose(top: list[float]) -> int:
        chosen.append(top)
        return 1

    step = StepPlanner(inner, CopyRule(DecodeConfig(lookup=2), None, False),
                       SimpleNamespace(choose=choose))
    assert step.copy([row(REPEAT), row([9, 8])], [4, 4]) == [[5, 6], []]
    starts = [StepStart(4, [0.0], row=r) for r in "ab"]
    assert step.plan(starts) == [True, True]
    assert step.extend([None, None]) == [False, False]
    assert step.width([[0.6, 0.3], [0.8, 0.1]]) == [1, 1] and len(chosen) == 2
    assert step.verify([2, 3]) == [1, 2]
    step.outcome("a", 2, 1)
    assert inner.asked == [("plan", 2), ("extend", 2), ("verify", [2, 3]), ("outcome", 2, 1)]
    plain = StepPlanner(inner, CopyRule(DecodeConfig(), None, False), None)
    assert plain.width([[0.6, 0.3, 0.1]]) == [3]  # no learned width: every candidate


def test_planner_for_gives_the_decoders_planner_or_the_stoppers_adapter():
    own = Recording()
    assert planner_for(own, StaticStopper(), 1, "max") is own
    batch = planner_for(own, StaticStopper(), 4, "max")
    assert isinstance(batch, Recording) and batch is not own and batch.batch_size == 4
    rows = planner_for(None, StaticStopper(), 4, "max")
    assert isinstance(rows, RowPlanner) and rows.batch_decides and not rows.by_row
    alone = planner_for(None, StaticStopper(), 1, "max")
    assert isinstance(alone, RowPlanner) and not alone.batch_decides
    assert planner_for(None, StaticStopper(), 4, "row").by_row


def test_open_step_copies_first_then_caps_and_asks_the_plan_of_the_rest():
    """A row never copies or drafts its last token left; a row that copies drafts nothing; the
    plan sees each row's cap (at most the tree's depth) and its no zeroes a cap."""

    class Votes(Recording):
        def plan(self, starts):
            self.caps = [s.cap for s in starts]
            return [True, False, True, True]

    step = StepPlanner(Votes(), CopyRule(DecodeConfig(lookup=8), None, False), None)
    rows = [row(REPEAT), row([9, 8, 7]), row([9, 8, 7]), row([9, 8, 7])]
    copied, caps = open_step(step, rows, [3, 10, 2, 1], 4,
                             lambda caps: [StepStart(4, [0.0], c, row=r)
                                           for c, r in zip(caps, rows, strict=True)])
    assert copied == [[5, 6], [], [], []]  # 3 tokens left: 2 copied, the target adds one
    assert step.inner.caps == [0, 4, 1, 0]  # the copier, the tree's depth, tokens left less one
    assert caps == [0, 0, 1, 0]  # the plan's no
