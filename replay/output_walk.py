"""One of the target's outputs decoded again, step by step, as the decoder decodes it: the
replay of a copy length (`replay.copy`) and of a width (`replay.width`).

A walk asks its decisions through a `Planner` exactly as the engine does: `open_step` (the row's
copy, then whether it drafts and how deep it may), `drive` over the depths it drafts, `width`
where it drafted the first depth only, and `outcome`. Where the engine drafts and verifies, the
walk reads each step's outcome from the output and prices the step (`Outcomes`): how many copied
tokens the output holds, whether a drafted first depth of w candidates holds its next token.
The outputs record the draft's first depth only, so a walk drafts one depth at most. What a step
commits and leaves pending follows `mcsd_runtime.pricing.step_model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mcsd_runtime.decisions.builtin import make_stopper
from mcsd_runtime.decisions.contract import Frontier, Planner, StepStart, Stopper
from mcsd_runtime.decisions.copy_length import CopyHistory
from mcsd_runtime.decisions.features import Trajectory
from mcsd_runtime.decode.planning import RowPlanner, drive, open_step
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.step_model import FIRST_PENDING, StepOutcome, copy_outcome, step_outcome
from replay.result import ReplayResult


class OutputRow:
    """A row walking one output, read as a planner reads the decoder's `RowState`: its
    `position` in the output (`n` tokens long; `n_prompt` before it), `copy_history` (where a
    copy rule reads one; `conf`, the target's top-1 probability of each token, feeds it),
    `d_pending` (the draft's pending tokens: only their number is read), `stopper` and
    `trajectory`; `output`, the output itself, for hindsight rules only."""

    def __init__(self, n: int, n_prompt: int = 0, stopper: Stopper | None = None,
                 history: CopyHistory | None = None, conf: Sequence[float] = (),
                 output: object = None) -> None:
        self.n, self.n_prompt, self.position, self.pending = n, n_prompt, 0, FIRST_PENDING
        self.stopper = stopper if stopper is not None else make_stopper("static:1")
        self.copy_history, self.conf, self.trajectory = history, conf, Trajectory()
        self.output = output

    @property
    def d_pending(self) -> range:
        return range(self.pending)

    def start(self, depth: int, cap: int) -> StepStart:
        """What the planner sees of the row before its step."""
        return StepStart(depth, self.trajectory.values(), cap, self.pending, self)

    def settle(self, out: StepOutcome, copied: int, drafted: int) -> None:
        """The step's outcome `out` (it copied `copied` tokens, or drafted `drafted` depths):
        the trajectory and a copy history learn it (as the decoder's accounting and
        `PromptLookup.update`), the walk moves on."""
        own = 0 if copied else out.accepted
        self.trajectory.update(own, out.committed, drafted)
        if self.copy_history is not None:
            conf = list(self.conf[self.position : self.position + out.committed])
            self.copy_history.update(copied, out.accepted if copied else 0, conf)
            if drafted:
                self.copy_history.drafted(out.committed)
        self.position += out.committed
        self.pending = out.pending


class Outcomes(Protocol):
    """Where a walk's outcomes come from, and what its steps cost."""

    def copy(self, row: OutputRow, tokens: list[int]) -> tuple[int, float]:
        """(tokens accepted, seconds) of a step copying `tokens` at the row's position."""
        ...

    def draft(self, row: OutputRow, width: int) -> tuple[int, float]:
        """(depths accepted, seconds) of a step drafting the first depth, `width` candidates."""
        ...

    def alone(self, row: OutputRow) -> float:
        """Seconds of a step of the target alone."""
        ...

    def tops(self, row: OutputRow) -> list[float] | None:
        """The draft's k largest probabilities at the row's root, where the walk asks a width
        (`Planner.width`); None: the tree's one width."""
        ...


def first_depth(stopper: str = "static:1") -> RowPlanner:
    """The planner of a walk's drafts: each row's own stopper (`OutputRow.stopper`) through
    the decoder's adapter, as a decoder of one row asks it."""
    return RowPlanner(make_stopper(stopper), batch_decides=False, by_row=False)


def walk(planner: Planner, row: OutputRow, outcomes: Outcomes, depth: int,
         name: str) -> ReplayResult:
    """The row's output decoded under `planner`, drafting at most `depth` (0 or 1) depths a
    step (the result's `choices`: each step's copy length or the width it asked, else 0)."""
    if depth not in (0, 1):
        raise MCSDError(f"an output replay drafts at most one depth, not {depth}")
    res = ReplayResult(name, "exact")
    while (left := row.n - row.position) > 0:
        (copied,), (cap,) = open_step(planner, [row], [left], depth,
                                      lambda caps: [row.start(depth, caps[0])])
        if copied:
            accepted, seconds = outcomes.copy(row, copied)
            out = copy_outcome(accepted, len(copied), row.pending, left)
            res.count(out, len(copied), len(copied), 1 + len(copied), seconds)
            choice = len(copied)
        elif cap:
            out, choice = _drafted(planner, row, outcomes, left, res)
        else:
            out = copy_outcome(0, 0, row.pending, left)
            res.count(out, 0, 0, 1, outcomes.alone(row))
            choice = 0
        res.choices.append(choice)
        drafted = int(cap > 0)  # a row that copies has no cap (`open_step`)
        planner.outcome(row, drafted, out.accepted if drafted else 0)
        row.settle(out, len(copied), drafted)
    return res


def _drafted(planner: Planner, row: OutputRow, outcomes: Outcomes, left: int,
             res: ReplayResult) -> tuple[StepOutcome, int]:
    """A step drafting the first depth (`drive`, the width the planner asks where the outcomes
    hold the draft's probabilities): counted in `res`; its outcome and recorded choice (the
    width it asked, else 0)."""
    run = drive(planner, [1], _no_frontier, _read)
    if run.verify != [1]:
        raise MCSDError("an output replay verifies the depth it drafted")
    tops = outcomes.tops(row)
    width = 1 if tops is None else planner.width([tops])[0]
    accepted, seconds = outcomes.draft(row, width)
    out = step_outcome(accepted, 1, row.pending, left)
    res.count(out, 1, width, 1 + width, seconds)
    return out, 0 if tops is None else width


def _no_frontier(depth: int, drew: list[bool]) -> list[Frontier | None]:
    """The outputs hold no drafted node's features: a row at its cap of one depth is not
    asked to go deeper."""
    return [None] * len(drew)


def _read(depth: int, drafting: list[bool], own: list[int]) -> None:
    """Never called: a walk's cap is one depth."""
