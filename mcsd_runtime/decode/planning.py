"""The planner a step engine consults (`planner_for`): the decoder's own `Planner` (a
verification budget) at the engine's batch size, or else `RowPlanner`, the one adapter through
which per-row stoppers plan a step; and `drive`, the one loop that runs a planner over a step's
depths, for the engine (which drafts them) and for replay (which reads them from a collection).

`RowPlanner` applies the batch's depth policy (`DecodeConfig.batch_depth`). A row drafts at all
where its own stopper's `should_draft` says so. After each depth, the rows that may still go
deeper are asked; in max mode (the default) the batch's stopper decides for all of them first
(`batch_continue`), else any row's own stopper that says so takes them all one depth deeper;
in row mode each row stops where its own stopper does. A batch of one asks the decoder's stopper
itself. Every row verifies what it drafted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from mcsd_runtime.decisions.contract import Frontier, Planner, StepStart, Stopper

if TYPE_CHECKING:
    from mcsd_runtime.decode.step_state import RowState


def planner_for(planner: Planner | None, stopper: Stopper, batch_size: int,
                batch_depth: str) -> Planner:
    """The planner of an engine at `batch_size`: the decoder's `planner` (its own in a batch of
    one, else `for_batch`), or else `RowPlanner` over `stopper` (the batch's: `for_batch`)."""
    if planner is not None:
        return planner if batch_size == 1 else planner.for_batch(batch_size)
    return RowPlanner(stopper, batch_size > 1 and batch_depth == "max", batch_depth == "row")


class RowPlanner(Planner):
    """Per-row stoppers (each `RowState.stopper`) planning a step; `stopper` the batch's, asked
    first for one decision where `batch_decides`; `by_row`: each row stops on its own."""

    def __init__(self, stopper: Stopper, batch_decides: bool, by_row: bool) -> None:
        self.stopper, self.batch_decides, self.by_row = stopper, batch_decides, by_row
        self.rows: list[RowState] = []
        self.caps: list[int] = []

    def plan(self, starts: Sequence[StepStart]) -> list[bool]:
        self.rows = [cast("RowState", s.row) for s in starts]
        self.caps = [s.cap for s in starts]
        return [s.cap > 0 and r.stopper.should_draft(s)
                for s, r in zip(starts, self.rows, strict=True)]

    def extend(self, frontiers: Sequence[Frontier | None]) -> list[bool]:
        """The rows below their cap are asked; the others stop."""
        ask = [i for i, f in enumerate(frontiers) if f is not None and f.depth < self.caps[i]]
        go = [False] * len(frontiers)
        if not ask:
            return go
        shown = [cast(Frontier, frontiers[i]) for i in ask]
        if self.batch_decides and (whole := self.batch_vote(shown)) is not None:
            votes = [bool(whole)] * len(ask)
        else:
            votes = self.row_votes(ask, shown)
            if not self.by_row:
                votes = [any(votes)] * len(ask)
        for i, vote in zip(ask, votes, strict=True):
            go[i] = vote
        return go

    def batch_vote(self, shown: list[Frontier]) -> bool | None:
        """The batch's stopper on the asked rows' frontiers (None: each row decides)."""
        return self.stopper.batch_continue(shown)

    def row_votes(self, ask: list[int], shown: list[Frontier]) -> list[bool]:
        """Each asked row's own stopper on its frontier, every one of them asked."""
        return [self.rows[i].stopper.should_continue(f) for i, f in zip(ask, shown, strict=True)]

    def outcome(self, row: object, drafted: int, accepted: int) -> None:
        cast("RowState", row).stopper.update(drafted, accepted)


@dataclass
class Drive:
    """What `drive` leaves of a step: per row the depth it drafted (`reach`) and the depths it
    verifies (`verify`), and the depths drafted in all (`depth`)."""

    reach: list[int]
    verify: list[int]
    depth: int


def drive(planner: Planner, caps: list[int],
          frontiers: Callable[[int, list[bool]], Sequence[Frontier | None]],
          draft_next: Callable[[int, list[bool], list[int]], None]) -> Drive:
    """Run `planner` over one step's depths, depth 1 drafted for every row with a cap. After each
    depth the planner sees `frontiers(depth, drew)` (the frontier of each row that drew it, None
    elsewhere); rows it stops, or at their cap, close there. While any row goes on,
    `draft_next(depth, drafting, own)` drafts depth + 1 for the rows `drafting` (`own`: each
    row's last depth of its own, its cap while it is open). Then the planner says what each row
    verifies."""
    n = len(caps)
    depths, open_rows, depth = [0] * n, [c > 0 for c in caps], 1
    while any(drew := [open_rows[i] and caps[i] >= depth for i in range(n)]):
        votes = planner.extend(frontiers(depth, drew))
        for i in range(n):
            if drew[i] and (not votes[i] or depth >= caps[i]):
                open_rows[i], depths[i] = False, depth
        drafting = [open_rows[i] and depth < caps[i] for i in range(n)]
        if not any(drafting):
            break
        draft_next(depth, drafting, [caps[i] if open_rows[i] else depths[i] for i in range(n)])
        depth += 1
    reach = [max(0, min(depths[i], caps[i])) for i in range(n)]
    return Drive(reach, planner.verify(reach), depth)
