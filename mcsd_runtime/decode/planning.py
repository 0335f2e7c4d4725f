"""The planner a step engine consults, `StepPlanner`: every decision of a step in one object.
It copies by prompt lookup's rule (`CopyRule`, a learned copy length where the decoder has one),
cuts the first depth to a learned width where the decoder has one, and asks `planner_for`'s
planner the rest: the decoder's own `Planner` (a verification budget) at the engine's batch
size, or else `RowPlanner`, the one adapter through which per-row stoppers plan a step.
`open_step` takes a step's first decisions (the copies, then which rows draft and how deep they
may) and `drive` runs a planner over the step's depths, for the engine (which drafts them) and
for every replay (which reads them from a collection or from the target's outputs).

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
from typing import TYPE_CHECKING, Any, Protocol, cast

from mcsd_runtime.decisions.contract import Frontier, Planner, StepStart, Stopper
from mcsd_runtime.lookup import propose as propose_chain

if TYPE_CHECKING:
    from mcsd_runtime.decisions.copy_length import CopyLength
    from mcsd_runtime.decode.records import DecodeConfig
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


class Copying(Protocol):
    """A step's copy decision for one row (`StepPlanner.copy` asks it row by row): the decoder's
    `CopyRule`, or a replay's own rule."""

    def copy(self, st: Any, cap: int) -> list[int]:
        """The tokens the row copies this step (at most `cap`), or []."""
        ...


class Chooser(Protocol):
    """A width decision (`decisions.width.WidthPolicy`): a width from the draft's k largest
    probabilities at a row's root."""

    def choose(self, top: list[float]) -> int: ...


class CopyRule:
    """Prompt lookup's copy length (`DecodeConfig.lookup`): where a row's context repeats
    itself, the tokens that followed, up to `lookup` of them, or as many as a learned copy
    length (`policy`) chooses; `beside_draft`: the policy weighs copying against the drafted
    step it was trained beside."""

    def __init__(self, config: DecodeConfig, policy: CopyLength | None,
                 beside_draft: bool) -> None:
        self.cfg, self.policy, self.beside_draft = config, policy, beside_draft

    def copy(self, st: RowState, cap: int) -> list[int]:
        """The tokens the row copies this step (at most `cap`), or []."""
        cfg, policy = self.cfg, self.policy
        if not cfg.lookup or cap <= 0:
            return []
        if policy is None:
            return propose_chain(st.committed, min(cfg.lookup, cap), cfg.lookup_min_ngram,
                                 cfg.lookup_max_ngram)
        return policy.copy(st.committed, cap, st.n_prompt, st.copy_history,
                           len(st.d_pending) if self.beside_draft else None)


class StepPlanner(Planner):
    """The engine's one planner: `inner` (the decoder's planner, or `RowPlanner` over its
    stoppers) chooses which rows draft, extend and verify and learns their outcomes; `copying`
    each row's copy; `width_policy` (a learned `WidthPolicy`, or None: all) the first depth's
    width."""

    def __init__(self, inner: Planner, copying: Copying,
                 width_policy: Chooser | None) -> None:
        self.inner, self.copying, self.width_policy = inner, copying, width_policy

    def copy(self, rows: Sequence[object], caps: list[int]) -> list[list[int]]:
        return [self.copying.copy(cast("RowState", r), c) for r, c in zip(rows, caps, strict=True)]

    def plan(self, starts: Sequence[StepStart]) -> list[bool]:
        return self.inner.plan(starts)

    def extend(self, frontiers: Sequence[Frontier | None]) -> list[bool]:
        return self.inner.extend(frontiers)

    def width(self, tops: Sequence[list[float]]) -> list[int]:
        if self.width_policy is None:
            return super().width(tops)
        return [self.width_policy.choose(top) for top in tops]

    def verify(self, drafted: list[int]) -> list[int]:
        return self.inner.verify(drafted)

    def outcome(self, row: object, drafted: int, accepted: int) -> None:
        self.inner.outcome(row, drafted, accepted)


def open_step(planner: Planner, rows: Sequence[object], left: list[int], depth: int,
              starts: Callable[[list[int]], Sequence[StepStart]]
              ) -> tuple[list[list[int]], list[int]]:
    """A step's first decisions, as the engine and the output replays take them: the tokens each
    row copies (`Planner.copy`, never its last token left: the target adds one), then the depth
    each row may draft. A step commits up to s + 1 tokens, so a row may draft at most `depth` and
    its tokens left (`left`) less one; 0 where it copies, or where the planner's `plan` (shown
    `starts(caps)`) leaves it undrafted."""
    copied = planner.copy(rows, [m - 1 for m in left])
    caps = [0 if look else max(0, min(depth, m - 1)) for m, look in zip(left, copied, strict=True)]
    votes = planner.plan(starts(caps))
    return copied, [c if v else 0 for c, v in zip(caps, votes, strict=True)]


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
