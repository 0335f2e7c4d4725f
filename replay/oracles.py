"""Replay's hindsight stoppers and bounds, which know each step's accepted length.

- `optimal_plan` (`PlanStopper` follows it): the stop depth at every step, 0 (no draft)
  included, that maximises replayed tokens/s at batch size 1, the true upper bound on speed
  there (the spec `oracle`);
- `AcceptedOracle`: stops at the accepted length, the bound on accepted tokens per target call
  (the spec `oracle-accepted`);
- `StepLookahead`: above batch size 1, each batch step's depth (1 or more) chosen in hindsight
  for that step alone, a schedule and so a lower bound on the optimum (its rate is fitted by
  `replay.depth.lookahead_schedule`, the spec `oracle` there);
- `oracle_bound`: an upper bound on every schedule at a batch size.
"""

from __future__ import annotations

import math

from mcsd_runtime import metrics
from mcsd_runtime.decisions.contract import Frontier, StopperBase
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.pricing.step_model import (
    FIRST_PENDING,
    PENDING_STATES,
    StepOutcome,
    step_outcome,
)
from mcsd_runtime.tree import Tree
from replay.data import Prompt, ReplayData, replayed


class AcceptedOracle(StopperBase):
    """Stops at exactly the step's accepted length (at least depth 1, as the decoder drafts it):
    the bound no stopper can beat on accepted tokens per target call, but NOT on tokens/s (it
    drafts deep whenever a deep path will be accepted, even where that costs more time than it
    saves). Replay only; the speed bound is `oracle` (`optimal_plan`)."""

    def should_continue(self, frontier: Frontier) -> bool:
        return frontier.depth < replayed(frontier).oracle_accepted


class PlanStopper(StopperBase):
    """Follows a stop plan {(prompt key, position): depth}, e.g. `optimal_plan`'s; depth 0 drafts
    nothing at that step."""

    def __init__(self, plan: dict[tuple[str, int], int]) -> None:
        self.plan = plan

    def should_draft(self, start: Frontier) -> bool:
        return self.plan.get(replayed(start).key[:2], 1) > 0

    def should_continue(self, frontier: Frontier) -> bool:
        return frontier.depth < self.plan[replayed(frontier).key[:2]]


# the oracle tracks up to this many draft-pending tokens; a longer run of steps without a draft
# is priced as this many (a catch-up forward priced low: the oracle stays an upper bound)
PENDING_CAP = 32


class StepCosts(dict):
    """Seconds of one row's step at (depth, pending), priced by `profile` on first use: at one
    row, or with `batch_size`, the cheapest share of a batch step over 1..batch_size rows."""

    def __init__(self, profile: CostProfile, tree: Tree, batch_size: int = 1) -> None:
        super().__init__()
        self.profile, self.tree, self.batch_size = profile, tree, batch_size

    def __missing__(self, key: tuple[int, int]) -> float:
        s, pend = key
        self[key] = value = min(self.profile.step_seconds(self.tree, s, pend, a) / a
                                for a in range(1, self.batch_size + 1))
        return value


def optimal_plan(data: ReplayData, profile: CostProfile, tol: float = 1e-9,
                 skip: bool = True) -> dict[tuple[str, int], int]:
    """The stop depth at every step that maximises replayed tokens per second, knowing every
    step's accepted length: the true upper bound on speed for free decisions. `skip`: a step
    may also draft nothing (depth 0, the target alone), as `Stopper.should_draft` allows.

    Throughput is a ratio, so this is Dinkelbach's method: for a rate `lam`, a dynamic program
    over (position, draft-pending tokens) maximises tokens - lam * seconds; `lam` is then set
    to the plan's throughput, until it no longer rises (a few rounds)."""
    costs = StepCosts(profile, data.tree)
    lam = 0.0
    plan: dict[tuple[str, int], int] = {}
    for _ in range(100):
        plan, tokens, seconds = {}, 0.0, 0.0
        for p in data.prompts.values():
            tk, sec = _plan_prompt(p, data.mode == "exact", costs, lam, plan, skip)
            tokens, seconds = tokens + tk, seconds + sec
        new = metrics.throughput(tokens, seconds)
        if new <= lam * (1 + tol):
            break
        lam = new
    return plan


def _plan_prompt(p: Prompt, exact: bool, costs, lam: float, plan: dict,
                 skip: bool = True) -> tuple[float, float]:
    """Best plan of one prompt at rate `lam` (into `plan`); returns its tokens and seconds.
    `costs[(s, pending)]`: a step's seconds (`StepCosts`)."""
    steps = ([p.by_position.get(t) for t in range(p.new_tokens)] if exact else p.steps)
    n = len(steps)
    low = 0 if skip else 1

    def outcome(i: int, s: int, pend: int) -> tuple[StepOutcome, int]:
        """Step i stopped at depth s, and the index of the step after it."""
        step = steps[i]
        out = step_outcome(step.accepted if step else 0, s, pend,
                           p.new_tokens - step.position if exact and step else None)
        return out, (min(i + out.committed, n) if exact else i + 1)

    def states(i: int):  # pending tokens a walk can bring to step i
        if not skip:
            return PENDING_STATES
        return range(1, min(FIRST_PENDING + i, PENDING_CAP) + 1)

    done = (0.0, 0.0, 0.0, 0)
    best: list[dict] = [{} for _ in range(n + 1)]  # best[i][pending]: value, tokens, seconds, s
    for i in range(n - 1, -1, -1):
        step = steps[i]
        depths = range(low, step.cap + 1) if step else (0,)  # None: nothing drafted
        for pend in states(i):
            options = []
            for s in depths:
                out, nxt = outcome(i, s, pend)
                last = step is None or nxt >= n
                after = done if last else best[nxt][min(out.pending, PENDING_CAP)]
                sec = costs[(s, pend)]
                options.append((out.committed - lam * sec + after[0], out.committed + after[1],
                                sec + after[2], s))
            best[i][pend] = max(options, key=lambda o: o[0])
    i, pend = 0, FIRST_PENDING
    while i < n and (step := steps[i]) is not None:
        s = best[i][pend][3]
        plan[(p.key, step.position)] = s
        out, i = outcome(i, s, pend)
        pend = min(out.pending, PENDING_CAP)
    return best[0][FIRST_PENDING][1], best[0][FIRST_PENDING][2]


class StepLookahead(StopperBase):
    """A one-step hindsight heuristic for batches, NOT an optimum: at every step of the batch,
    the depth that maximises that step's committed tokens of the rows minus `lam` times its
    seconds, knowing every row's accepted length (replay only: the replay asks `depth`). It
    ignores where each row lands (its pending tokens, which positions the next steps draft
    from, which rows share them), so the best schedule can beat it (by up to 14% on hand-made
    walks, tests/test_oracle.py): a schedule the decoder could follow, hence a lower bound on
    the optimum. `lookahead_schedule` sets `lam`; `oracle_bound` is the upper bound."""

    def __init__(self, lam: float) -> None:
        self.lam = lam

    def should_continue(self, frontier: Frontier) -> bool:
        raise MCSDError("the step lookahead decides whole batch steps, in replay only")

    def depth(self, rows: list, tree: Tree, profile: CostProfile) -> int:
        top = max(r.cap for r in rows)
        if not top:
            return 0
        pending = max(r.pending for r in rows)
        best, best_s = -math.inf, 1
        for s in range(1, top + 1):
            tokens = sum(step_outcome(r.step.accepted if r.step else 0, min(s, r.cap), r.pending,
                                      r.prompt.new_tokens - r.t).committed for r in rows)
            value = tokens - self.lam * profile.step_seconds(tree, s, pending, len(rows))
            if value > best + 1e-12:
                best, best_s = value, s
        return best_s


def oracle_bound(data: ReplayData, profile: CostProfile, batch_size: int,
                 skip: bool = True) -> float:
    """An upper bound on the replayed tokens/s of any schedule at `batch_size` (exact replay);
    `skip=False`: of the schedules that draft at every step.

    Every schedule commits the same tokens (the outputs), so only its seconds differ. A step of
    the batch over A rows costs c(A, s, P) at batch depth s and most pending P; each row's share
    c / A is at least the cheapest share at the row's own depth and pending over 1..batch_size
    rows (costs rise with depth and pending; a row drafts at most the batch's depth). The sum of
    those shares, minimised per row over its stop plans by `_plan_prompt`, is then at most the
    schedule's seconds (decisions cost >= 0). At batch size 1 it is the throughput oracle;
    above, it cannot see the tails where fewer rows share a step nor the padding to the most
    pending tokens, and lies 19-30% above the best schedule on the hand-made walks of
    tests/test_oracle.py (found there by brute force over every schedule)."""
    if data.mode != "exact":
        raise MCSDError("the batch oracle bound needs exact replay (a dense greedy collection)")
    costs = StepCosts(profile, data.tree, batch_size)
    tokens = seconds = 0.0
    for p in data.prompts.values():
        tk, sec = _plan_prompt(p, True, costs, 1.0, {}, skip)
        tokens, seconds = tokens + tk, seconds + sec
    return metrics.throughput(tokens, seconds)
