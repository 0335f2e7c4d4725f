"""The replay engine: what any stopper would have done, from full-depth collected rows.

A step drafted to full depth D with accepted length L accepts `min(L, s)` when stopped at depth
s. Stoppers are the runtime's own objects (static, heuristics, learned, the oracles), consulted
through a frontier that serves the stored node features plus trajectory features recomputed
along the replayed trajectory (as `Trajectory.update` does in the decoder).

- **exact** (dense greedy collection: one full-depth step at every position t of the AR output):
  after stopping at depth s at position t the walk continues at t + min(L_t, s) + 1, so tokens,
  target calls and forwards are those the decoder would produce.
- **estimate** (any other collection): each recorded step is replayed in order; throughput is
  expected tokens per step over expected cost per step. Labelled `estimate` in every result.

What a step stopped at depth s accepts, commits and leaves pending, and which forwards it runs,
are the rules of `mcsd_runtime.pricing.step_model`; the profile prices those forwards
(`CostProfile.step_seconds`), and learned stoppers add a per-decision latency.

Batches (`replay(..., batch_size=B)`) follow `MCSDDecoder.generate_batch`: B rows, prompts
admitted in order into free slots, each batch step's forwards over all active rows (the first
draft forward padded to the most pending tokens of any row, the target's to the deepest tree),
one decision per drafted depth for the rows whose cap is deeper (`batch_continue`, or where it
returns None, ANY row's own stopper), every row drafted to the batch's depth within its cap.
The decisions are asked as the decoder asks them: through a `RowPlanner` that
`mcsd_runtime.decode.planning.drive` runs over the step's depths (here read from the collection
instead of drafted), counting what the replay prices.
Batch size 1 is the replay of one sequence at a time. Before each step every row's stopper is
asked whether it drafts at all (`should_draft`); a row that does not commits the target's one
token and keeps its pending draft tokens, unless other rows of the batch draft (then it is fed
with them, as in the decoder). The optimum over schedules is not computed
there; the spec `oracle` above batch size 1 is `StepLookahead`, a hindsight heuristic (each
batch step's depth chosen for that step alone: a schedule, below the optimum, a lower bound on
it), and `oracle_bound` is an upper bound on every schedule; the best schedule lies between them.
"""

from __future__ import annotations

import copy
from typing import cast

from mcsd_runtime.decisions.builtin import make_stopper
from mcsd_runtime.decisions.contract import Frontier, Stopper, StopperBase
from mcsd_runtime.decisions.features import Trajectory
from mcsd_runtime.decode.planning import RowPlanner, drive
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.pricing.step_model import (
    FIRST_PENDING,
    StepOutcome,
    step_forwards,
    step_outcome,
)
from mcsd_runtime.tree import Tree
from replay.data import Prompt, ReplayData, Step, _Frontier, _Start
from replay.oracles import AcceptedOracle, PlanStopper, StepLookahead, optimal_plan
from replay.result import ReplayResult


class WalkRow:
    """One sequence of a replayed batch (here and in `replay.ragged`): its prompt, where the walk
    stands, its own stopper copy and trajectory."""

    __slots__ = ("prompt", "stopper", "traj", "pending", "t", "steps", "step", "skip")

    def __init__(self, prompt: Prompt, stopper) -> None:
        self.prompt, self.stopper, self.traj = prompt, copy.copy(stopper), Trajectory()
        self.stopper.reset()
        self.pending, self.t, self.steps = FIRST_PENDING, 0, iter(prompt.steps)
        self.step: Step | None = None
        self.skip = False  # the stopper drafts nothing at this step (`should_draft`)

    def advance(self, exact: bool) -> bool:
        """Move to the next step; False when the sequence is done. `step` is None for the last
        token of a budget-capped output, which drafts nothing."""
        p = self.prompt
        if not exact:
            self.step = next(self.steps, None)
            return self.step is not None
        if self.t >= p.new_tokens:
            return False
        self.step = p.by_position.get(self.t)
        if self.step is None and self.t != p.new_tokens - 1:
            raise MCSDError(f"{p.key}: no recorded step at position {self.t}")
        return True

    def take_prefill_token(self, exact: bool, res: ReplayResult) -> None:
        """Commit the first token from the prefill's logits, counted as a step (as `ARDecoder`
        counts it) but with no forward of its own to pay for (the MCSD decoder's prefill leaves
        the prompt's last token pending instead); nothing for an empty output."""
        if not (self.prompt.new_tokens if exact else self.prompt.steps):
            return
        res.tokens += 1
        res.steps += 1
        if exact:
            self.t = 1
        else:
            next(self.steps, None)

    def start(self, max_depth: int) -> _Start:
        """What the planner sees of the row before its step (`StepStart`, with what replay's
        own stoppers read: the step's key and accepted length); cap 0 where it may not draft."""
        step, key = self.step, (self.prompt.key, self.step.position if self.step else self.t, 0)
        return _Start(max_depth, self.traj.values(), step.cap if step else 0, self,
                      self.pending, step.accepted if step else 0, key)

    @property
    def cap(self) -> int:
        return self.step.cap if self.step and not self.skip else 0

    def frontier(self, depth: int, max_depth: int) -> _Frontier:
        """What a stopper sees of this row's step at `depth` (drafted, so recorded)."""
        step = self.step
        assert step is not None, "a row asked about a depth is at a recorded step"
        return _Frontier(depth, max_depth, step.nodes[depth - 1], self.traj.values(),
                         step.hidden[depth - 1] if step.hidden else None, step.accepted,
                         (self.prompt.key, step.position, depth))

    def commit(self, s: int, tree: Tree, exact: bool, res: ReplayResult,
               fed: bool = False) -> None:
        """The row's step drafted to depth `s` (`fed`: its pending tokens went through the
        draft, as in a batch step where other rows draft): count it in `res`, move the walk
        on."""
        step, p = self.step, self.prompt
        out = step_outcome(step.accepted if step else 0, s, self.pending,
                           p.new_tokens - self.t if exact else None, fed=fed or bool(s))
        self.settle(out, s, s, tree, res)

    def commit_planned(self, drafted: int, verified: int, tree: Tree,
                       res: ReplayResult) -> None:
        """The row's step drafted `drafted` depths and verified `verified` of them (a ragged
        step's plan, exact replay): count it in `res`, move the walk on."""
        step, p = self.step, self.prompt
        if not 0 <= verified <= drafted <= self.cap:
            raise MCSDError(f"a ragged plan ({drafted}, {verified}) outside 0 <= verified <= "
                            f"drafted <= cap {self.cap}")
        full = min(step.accepted if step else 0, verified)
        self.settle(step_outcome(full, drafted, self.pending, p.new_tokens - self.t), drafted,
                    verified, tree, res)

    def settle(self, out: StepOutcome, drafted: int, verified: int, tree: Tree,
               res: ReplayResult) -> None:
        """Count a step that drafted `drafted` depths and verified `verified` of them, with
        outcome `out`, in `res`; the trajectory and the stopper learn what was verified (as in
        the decoder: a depth drafted and then not verified tells nothing of acceptance)."""
        res.count(out, drafted, tree.cum[drafted], 1 + tree.cum[verified])
        self.traj.update(out.accepted, out.committed, verified)
        self.stopper.update(verified, out.accepted)
        self.t += out.committed
        self.pending = out.pending


class NeverDraft(StopperBase):
    """Autoregressive decoding as a stopper: no step drafts (the baseline `ar`), and the first
    token comes from the prefill's logits, as `ARDecoder` takes it."""

    def should_draft(self, start) -> bool:
        return False

    def should_continue(self, frontier) -> bool:
        return False


def replay(data: ReplayData, stopper, profile: CostProfile | None = None, name: str | None = None,
           decision_s: float = 0.0, batch_size: int = 1,
           decision_row_s: float = 0.0) -> ReplayResult:
    """Replay `stopper` (a spec string, a stopper object, or 'oracle': the throughput oracle at
    batch size 1, the step lookahead above it) over every prompt, `batch_size` sequences at a
    time as `MCSDDecoder.generate_batch` decodes them: prompts admitted in order into free
    slots, every step's forwards over all active rows, the batch drafting one more depth while
    `stopper.batch_continue(frontiers)` says so (one decision for the batch) or, where it
    returns None, while ANY row's own copy of it says so; every row drafted to the batch's depth
    within its own cap (the stopper is `stopper.for_batch(batch_size)`). Batch size 1 is the
    decoder's `generate`. A decision costs `decision_s`, plus `decision_row_s` per row beyond
    the first that one batched call reads."""
    profile = profile or CostProfile.relative()
    if batch_size < 1:
        raise MCSDError(f"batch size must be at least 1, got {batch_size}")
    stopper, name = _resolve(data, stopper, profile, name, batch_size)
    stopper = stopper.for_batch(batch_size)
    lookahead = stopper if isinstance(stopper, StepLookahead) else None
    res = ReplayResult(stopper=name, mode=data.mode, batch_size=batch_size)
    planner = _CountingPlanner(stopper, res)
    tree, exact = data.tree, data.mode == "exact"
    queue = iter(data.prompts.values())
    rows: list[WalkRow] = []
    step_prices: dict[tuple[int, int, int], tuple[float, int]] = {}  # (depth, pending, rows)
    while True:
        while len(rows) < batch_size and (p := next(queue, None)) is not None:
            row = WalkRow(p, stopper)
            if isinstance(stopper, NeverDraft):
                row.take_prefill_token(exact, res)
            if row.advance(exact):
                rows.append(row)
        if not rows:
            break
        drafts = planner.plan([row.start(data.depth) for row in rows])
        for row, draft in zip(rows, drafts, strict=True):
            row.skip = not draft
        depth = (lookahead.depth(rows, tree, profile) if lookahead
                 else _batch_depth(planner, rows, data.depth))
        pending = max(r.pending for r in rows)  # the first draft forward pads to it
        key = (depth, pending, len(rows))  # a step's price and draft forwards, once per shape
        if (price := step_prices.get(key)) is None:
            price = step_prices[key] = (profile.step_seconds(tree, depth, pending, len(rows)),
                                        len(step_forwards(tree, depth, pending).draft))
        res.cost_s += price[0]
        res.draft_forwards += price[1]
        res.batch_steps += 1
        for row in list(rows):
            row.commit(min(depth, row.cap), tree, exact, res, fed=depth > 0)
            if not row.advance(exact):
                rows.remove(row)
    res.cost_s += decision_s * res.decisions
    res.cost_s += decision_row_s * (res.decision_rows - res.decisions)
    return res


class _CountingPlanner(RowPlanner):
    """The planner replay drives: the batch's stopper asked first at every batch size (a batch
    of one too, with its one frontier), else any row's own stopper that says so takes the batch
    one depth deeper (`RowPlanner` in max mode). It counts in `res` the decisions that looked at
    a frontier and the rows they read: a `batch_continue` that answers is one decision, whatever
    rows it read; where it returns None, every asked row's own copy decides, one decision each
    (what the batched call itself read is not counted)."""

    def __init__(self, stopper: Stopper, res: ReplayResult) -> None:
        super().__init__(stopper, batch_decides=True, by_row=False)
        self.res = res

    def batch_vote(self, shown: list[Frontier]) -> bool | None:
        go = super().batch_vote(shown)
        if go is not None:
            read = sum(cast(_Frontier, f).read for f in shown)
            self.res.decisions += read > 0  # a decision costs time only if it looked
            self.res.decision_rows += read
        return go

    def row_votes(self, ask: list[int], shown: list[Frontier]) -> list[bool]:
        for f in shown:
            cast(_Frontier, f).read = False
        votes = super().row_votes(ask, shown)
        read = sum(cast(_Frontier, f).read for f in shown)
        self.res.decisions += read
        self.res.decision_rows += read
        return votes


def _batch_depth(planner: RowPlanner, rows: list[WalkRow], max_depth: int) -> int:
    """The depth the batch drafts to (`planning.drive`): 1 (0 when no row may draft), then one
    more while some row's cap is deeper and the planner says so."""
    caps = [r.cap for r in rows]

    def frontiers(depth: int, drew: list[bool]) -> list[Frontier | None]:
        return [r.frontier(depth, max_depth) if d and depth < cap else None
                for r, d, cap in zip(rows, drew, caps, strict=True)]

    def nothing_to_draft(depth: int, drafting: list[bool], own: list[int]) -> None:
        """Replay reads each depth from the collection."""

    return max(drive(planner, caps, frontiers, nothing_to_draft).reach, default=0)


def _resolve(data: ReplayData, stopper, profile: CostProfile, name: str | None,
             batch_size: int) -> tuple[Stopper, str]:
    """The stopper object a spec names (oracles included) and the result's name."""
    if not isinstance(stopper, str):
        return stopper, name or repr(stopper)
    obj: Stopper
    if stopper == "oracle":
        obj = (PlanStopper(optimal_plan(data, profile)) if batch_size == 1
               else lookahead_schedule(data, profile, batch_size))
    elif stopper == "oracle-accepted":
        obj = AcceptedOracle()
    else:
        obj = make_stopper(stopper)
    return obj, name or stopper


def lookahead_schedule(data: ReplayData, profile: CostProfile, batch_size: int,
                       rounds: int = 50) -> StepLookahead:
    """The `StepLookahead` whose rate `lam` gives the best replayed tokens/s among those tried:
    Dinkelbach's iteration (lam set to the schedule's throughput until it no longer rises).
    What the spec `oracle` replays above batch size 1; a heuristic, below the optimum."""
    if data.mode != "exact":
        raise MCSDError("the step lookahead needs exact replay (a dense greedy collection)")
    lam, best = 0.0, (0.0, StepLookahead(0.0))
    for _ in range(rounds):
        lookahead = StepLookahead(lam)
        tps = replay(data, lookahead, profile, batch_size=batch_size).throughput
        if tps <= best[0] * (1 + 1e-9):
            break
        best, lam = (tps, lookahead), tps
    return best[1]
