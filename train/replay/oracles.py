"""Replay's hindsight stoppers and bounds, which know each step's accepted length.

- `optimal_plan` (`PlanStopper` follows it): the stop depth at every step that maximises
  replayed tokens/s at batch size 1, the true upper bound on speed there (the spec `oracle`);
- `AcceptedOracle`: stops at the accepted length, the bound on accepted tokens per target call
  (the spec `oracle-accepted`);
- `StepLookahead`: above batch size 1, each batch step's depth chosen in hindsight for that step
  alone, a schedule and so a lower bound on the optimum (its rate is fitted by
  `train.replay.engine.lookahead_schedule`, the spec `oracle` there);
- `oracle_bound`: an upper bound on every schedule at a batch size.
"""

from __future__ import annotations

import math

from mcsd_runtime import metrics
from mcsd_runtime.costmodel.profile import CostProfile
from mcsd_runtime.costmodel.step_model import (
    FIRST_PENDING,
    PENDING_STATES,
    StepOutcome,
    step_outcome,
)
from mcsd_runtime.decode.tree import Tree
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.stop.contract import StopperBase
from train.replay.data import Prompt, ReplayData, _Frontier


class AcceptedOracle(StopperBase):
    """Stops at exactly the step's accepted length (at least depth 1, as the decoder drafts it):
    the bound no stopper can beat on accepted tokens per target call, but NOT on tokens/s (it
    drafts deep whenever a deep path will be accepted, even where that costs more time than it
    saves). Replay only; the speed bound is `oracle` (`optimal_plan`)."""

    def should_continue(self, frontier: _Frontier) -> bool:
        return frontier.depth < frontier.oracle_accepted


class PlanStopper(StopperBase):
    """Follows a stop plan {(prompt key, position): depth}, e.g. `optimal_plan`'s."""

    def __init__(self, plan: dict[tuple[str, int], int]) -> None:
        self.plan = plan

    def should_continue(self, frontier: _Frontier) -> bool:
        return frontier.depth < self.plan[frontier.key[:2]]


def optimal_plan(data: ReplayData, profile: CostProfile, tol: float = 1e-9,
                 ) -> dict[tuple[str, int], int]:
    """The stop depth at every step that maximises replayed tokens per second, knowing every
    step's accepted length: the true upper bound on speed for free decisions.

    Throughput is a ratio, so this is Dinkelbach's method: for a rate `lam`, a dynamic program
    over (position, draft-pending tokens) maximises tokens - lam * seconds; `lam` is then set
    to the plan's throughput, until it no longer rises (a few rounds)."""
    tree = data.tree
    costs = {(s, pend): profile.step_seconds(tree, s, pend)
             for s in range(data.depth + 1) for pend in PENDING_STATES}
    lam, plan = 0.0, {}
    for _ in range(100):
        plan, tokens, seconds = {}, 0.0, 0.0
        for p in data.prompts.values():
            tk, sec = _plan_prompt(p, data.mode == "exact", costs, lam, plan)
            tokens, seconds = tokens + tk, seconds + sec
        new = metrics.throughput(tokens, seconds)
        if new <= lam * (1 + tol):
            break
        lam = new
    return plan


def _plan_prompt(p: Prompt, exact: bool, costs: dict, lam: float,
                 plan: dict) -> tuple[float, float]:
    """Best plan of one prompt at rate `lam` (into `plan`); returns its tokens and seconds."""
    steps = ([p.by_position.get(t) for t in range(p.new_tokens)] if exact else p.steps)
    n = len(steps)

    def outcome(i: int, s: int, pend: int) -> tuple[StepOutcome, int]:
        """Step i stopped at depth s, and the index of the step after it."""
        step = steps[i]
        out = step_outcome(step.accepted if step else 0, s, pend,
                           p.new_tokens - step.position if exact and step else None)
        return out, (min(i + out.committed, n) if exact else i + 1)

    best = [dict.fromkeys(PENDING_STATES, (0.0, 0.0, 0.0, 0)) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):  # best[i][pending]: value, tokens, seconds, depth
        depths = range(1, steps[i].cap + 1) if steps[i] else (0,)  # None: nothing drafted
        for pend in PENDING_STATES:
            options = []
            for s in depths:
                out, nxt = outcome(i, s, pend)
                after = best[nxt][out.pending] if s else (0.0, 0.0, 0.0, 0)  # 0: the last step
                sec = costs[(s, pend)]
                options.append((out.committed - lam * sec + after[0], out.committed + after[1],
                                sec + after[2], s))
            best[i][pend] = max(options, key=lambda o: o[0])
    i, pend = 0, FIRST_PENDING
    while i < n and steps[i] is not None:
        s = best[i][pend][3]
        plan[(p.key, steps[i].position)] = s
        out, i = outcome(i, s, pend)
        pend = out.pending
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

    def should_continue(self, frontier: _Frontier) -> bool:
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


def oracle_bound(data: ReplayData, profile: CostProfile, batch_size: int) -> float:
    """An upper bound on the replayed tokens/s of any schedule at `batch_size` (exact replay).

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
    costs = {(s, pend): min(profile.step_seconds(data.tree, s, pend, a) / a
                            for a in range(1, batch_size + 1))
             for s in range(data.depth + 1) for pend in PENDING_STATES}
    tokens = seconds = 0.0
    for p in data.prompts.values():
        tk, sec = _plan_prompt(p, True, costs, 1.0, {})
        tokens, seconds = tokens + tk, seconds + sec
    return metrics.throughput(tokens, seconds)
