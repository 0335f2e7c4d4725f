"""Offline replay: what any stopper would have done, from full-depth collected rows.

A step drafted to full depth D with accepted length L accepts `min(L, s)` when stopped at depth
s. Stoppers are the runtime's own objects (static, heuristics, learned, the oracle), consulted
through a frontier that serves the stored node features plus trajectory features recomputed
along the replayed trajectory (as `Trajectory.update` does in the decoder).

- **exact** (dense greedy collection: one full-depth step at every position t of the AR output):
  after stopping at depth s at position t the walk continues at t + min(L_t, s) + 1, so tokens,
  target calls and forwards are those the decoder would produce.
- **estimate** (any other collection): each recorded step is replayed in order; throughput is
  expected tokens per step over expected cost per step. Labelled `estimate` in every result.

What a step stopped at depth s accepts, commits and leaves pending, and which forwards it runs,
are the rules of `mcsd_runtime.costmodel.step_model`; the profile prices those forwards
(`CostProfile.step_seconds`), and learned stoppers add a per-decision latency.

Batches (`replay(..., batch_size=B)`) follow `MCSDDecoder.generate_batch`: B rows, prompts
admitted in order into free slots, each batch step's forwards over all active rows (the first
draft forward padded to the most pending tokens of any row, the target's to the deepest tree),
one decision per drafted depth for the rows whose cap is deeper (`batch_continue`, else ANY
row's own stopper), every row drafted to the batch's depth within its cap. Batch size 1 is the
replay of one sequence at a time. The optimum over schedules is not computed there; the spec
`oracle` above batch size 1 is `StepLookahead`, a hindsight heuristic (each batch step's depth
chosen for that step alone: a schedule, below the optimum, a lower bound on it), and
`oracle_bound` is an upper bound on every schedule; the best schedule lies between them.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
import torch

from mcsd_runtime import metrics
from mcsd_runtime.costmodel.profile import CostProfile
from mcsd_runtime.costmodel.step_model import (
    FIRST_PENDING,
    PENDING_STATES,
    StepOutcome,
    step_forwards,
    step_outcome,
)
from mcsd_runtime.decode.tree import Tree
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.stop.builtin import StopperBase, make_stopper
from mcsd_runtime.stop.features import DECISION_FEATURES, NODE_FEATURES, Trajectory, with_trajectory
from train.config import REPLAY_MODES
from train.data import SEQUENCE_KEY, sequence_ids

NODE_COLS = list(NODE_FEATURES)
_DECISION_NODE_COLS = [NODE_COLS.index(n) for n in DECISION_FEATURES if n in NODE_FEATURES]
_N_DECISION_NODE = len(_DECISION_NODE_COLS)


@dataclass
class Step:
    position: int
    accepted: int  # L of the full-depth step
    cap: int  # depths the decoder could draft at this position (drafted_depth of the row)
    nodes: list[np.ndarray]  # node features per depth 1..cap, [n_d, len(NODE_FEATURES)]
    hidden: list[np.ndarray] | None = None


@dataclass
class Prompt:
    key: str
    steps: list[Step]  # in recorded order
    by_position: dict[int, Step] = field(default_factory=dict)
    new_tokens: int = 0  # length of the AR output (dense collections)


@dataclass
class ReplayResult:
    stopper: str
    mode: str  # "exact" or "estimate"
    tokens: int = 0  # committed tokens (exact) / expected tokens (estimate)
    steps: int = 0  # target calls (at B > 1: steps of rows, one per row per batch step)
    accepted: int = 0
    drafted_depth: int = 0  # sum over steps of s
    drafted_tokens: int = 0  # tree nodes drafted
    target_tokens: int = 0  # tokens through the target
    draft_forwards: int = 0
    decisions: int = 0  # stopper consultations
    cost_s: float = 0.0
    acceptance_sum: float = 0.0
    drafting_steps: int = 0  # steps that drafted at least one depth
    batch_size: int = 1
    batch_steps: int = 0  # steps of the batch (forwards of the target); `steps` counts rows'
    decision_rows: int = 0  # frontiers the decisions read (a batched call reads several)

    @property
    def tau(self) -> float:
        return metrics.tau(self.tokens, self.steps)

    @property
    def throughput(self) -> float:
        return metrics.throughput(self.tokens, self.cost_s)

    @property
    def acceptance_rate(self) -> float:
        return metrics.acceptance_rate(self.acceptance_sum, self.drafting_steps)

    def as_dict(self) -> dict:
        return asdict(self) | {"tau": self.tau, "throughput": self.throughput,
                               "acceptance_rate": self.acceptance_rate}


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


class _Frontier:
    """`stoppers.Frontier` served from collected rows. Replay's own stoppers also read `key`
    (prompt, position, depth) and `oracle_accepted` (the step's accepted length); `read` records
    whether the stopper looked at the nodes (a decision costs time only then)."""

    __slots__ = ("depth", "max_depth", "oracle_accepted", "read", "_nodes", "_traj", "_hidden",
                 "key")

    def __init__(self, depth: int, max_depth: int, nodes: np.ndarray, traj: list[float],
                 hidden: np.ndarray | None, accepted: int, key: tuple[str, int, int]) -> None:
        self.depth, self.max_depth, self._nodes, self._traj = depth, max_depth, nodes, traj
        self._hidden, self.oracle_accepted, self.read, self.key = hidden, accepted, False, key

    def trajectory(self) -> list[float]:
        return self._traj

    def features(self) -> torch.Tensor:
        self.read = True
        return with_trajectory(torch.tensor(self._nodes), self._traj)

    def decision_features(self) -> np.ndarray:
        self.read = True
        n = self._nodes.shape[0]
        out = np.empty((n, len(DECISION_FEATURES)))
        out[:, :_N_DECISION_NODE] = self._nodes[:, _DECISION_NODE_COLS]
        out[:, _N_DECISION_NODE:] = self._traj
        return out

    def hidden(self) -> torch.Tensor:
        if self._hidden is None:
            raise MCSDError("this replay has no hidden states: load the rows with hidden=True")
        self.read = True
        return torch.from_numpy(self._hidden)


class ReplayData:
    """Full-depth rows arranged by prompt and step, ready to replay.

    `new_tokens`: sequence id -> the decoder's output length (`train.data.output_lengths`).
    A sequence missing from it gets a guess from its last step, which cannot tell an output
    ending in EOS one token before the budget from one the budget ended."""

    def __init__(self, df: pd.DataFrame, k_config: tuple[int, ...] | None = None,
                 mode: str = "auto", hidden: bool = False,
                 new_tokens: dict[str, int] | None = None) -> None:
        if df.empty:
            raise MCSDError("nothing to replay: no rows")
        if "init" in df.columns and (df["init"] != "draft").any():
            raise MCSDError("replay models draft-initialized steps; these rows include "
                            "init='target' steps")
        self.tree = Tree(tuple(k_config) if k_config else _infer_k_config(df))
        self.depth = self.tree.depth
        df = df.sort_values([*SEQUENCE_KEY, "step", "node"], kind="stable")
        keys = sequence_ids(df).to_numpy()
        step = df["step"].to_numpy()
        feats = df[NODE_COLS].to_numpy(dtype=np.float32)
        depth = df["depth"].to_numpy().astype(np.int64)
        pos = df["position"].to_numpy()
        acc = df["accepted_length"].to_numpy()
        cap = df["drafted_depth"].to_numpy()
        hid = np.stack(df["hidden"].to_numpy()).astype(np.float32) if hidden else None
        bounds = np.nonzero((keys[1:] != keys[:-1]) | (step[1:] != step[:-1]))[0] + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [len(df)]])
        self.prompts: dict[str, Prompt] = {}
        for a, b in zip(starts, ends, strict=True):
            d = depth[a:b]
            cuts = np.searchsorted(d, np.arange(1, int(cap[a]) + 2))
            nodes = [feats[a + cuts[i]: a + cuts[i + 1]] for i in range(int(cap[a]))]
            hs = [hid[a + cuts[i]: a + cuts[i + 1]] for i in range(int(cap[a]))] if hidden else None
            if any(len(n) == 0 for n in nodes):
                raise MCSDError(f"step {step[a]} of {keys[a]} lacks rows of some depth: replay "
                                f"needs full-depth collections (static stopper)")
            p = self.prompts.setdefault(keys[a], Prompt(keys[a], []))
            p.steps.append(Step(int(pos[a]), int(acc[a]), int(cap[a]), nodes, hs))
        dense = True
        for p in self.prompts.values():
            p.by_position = {s.position: s for s in p.steps}
            positions = [s.position for s in p.steps]
            dense &= positions == list(range(len(positions)))
            last = p.steps[-1]
            extra = 1 if (last.cap == 1 and self.depth > 1) else 0  # budget hit: a 0-depth step
            p.new_tokens = (new_tokens or {}).get(p.key, last.position + 1 + extra)
        if mode not in REPLAY_MODES:
            raise MCSDError(f"unknown replay mode {mode!r}: exact, estimate or auto")
        if mode == "auto":
            mode = "exact" if dense else "estimate"
        if mode == "exact" and not dense:
            raise MCSDError("exact replay needs a dense greedy collection (one step at every "
                            "position); use mode='estimate'")
        self.mode = mode

    def subset(self, keys) -> ReplayData:
        out = object.__new__(ReplayData)
        out.__dict__ = dict(self.__dict__)
        keys = set(keys)
        out.prompts = {k: v for k, v in self.prompts.items() if k in keys}
        return out

    @property
    def n_steps(self) -> int:
        return sum(len(p.steps) for p in self.prompts.values())


def _infer_k_config(df: pd.DataFrame) -> tuple[int, ...]:
    """k-config from the widest step: nodes per depth and the frontier size column."""
    sizes = df.groupby("depth")["frontier_size"].max().sort_index().astype(int).tolist()
    k = [sizes[0]] + [sizes[i] // sizes[i - 1] for i in range(1, len(sizes))]
    return tuple(k)


def _resolve(data: ReplayData, stopper, profile: CostProfile, name: str | None,
             batch_size: int) -> tuple[object, str]:
    """The stopper object a spec names (oracles included) and the result's name."""
    if not isinstance(stopper, str):
        return stopper, name or repr(stopper)
    if stopper == "oracle":
        obj = (PlanStopper(optimal_plan(data, profile)) if batch_size == 1
               else lookahead_schedule(data, profile, batch_size))
    elif stopper == "oracle-accepted":
        obj = AcceptedOracle()
    else:
        obj = make_stopper(stopper)
    return obj, name or stopper


class _Row:
    """One sequence in the batch: its prompt, where the walk stands, its own stopper copy and
    trajectory."""

    __slots__ = ("prompt", "stopper", "traj", "pending", "t", "steps", "step")

    def __init__(self, prompt: Prompt, stopper) -> None:
        self.prompt, self.stopper, self.traj = prompt, copy.copy(stopper), Trajectory()
        self.stopper.reset()
        self.pending, self.t, self.steps = FIRST_PENDING, 0, iter(prompt.steps)
        self.step: Step | None = None

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

    @property
    def cap(self) -> int:
        return self.step.cap if self.step else 0


def replay(data: ReplayData, stopper, profile: CostProfile | None = None, name: str | None = None,
           decision_s: float = 0.0, batch_size: int = 1,
           decision_row_s: float = 0.0) -> ReplayResult:
    """Replay `stopper` (a spec string, a stopper object, or 'oracle': the throughput oracle at
    batch size 1, the step lookahead above it) over every prompt, `batch_size` sequences at a
    time as `MCSDDecoder.generate_batch` decodes them: prompts admitted in order into free
    slots, every step's forwards over all active rows, the batch
    drafting one more depth while `stopper.batch_continue(frontiers)` says so (one decision for
    the batch) or, for a stopper without it, while ANY row's own copy of it says so; every row
    drafted to the batch's depth within its own cap (`stopper.for_batch(batch_size)` first,
    where it has it). Batch size 1 is the decoder's `generate`. A decision costs `decision_s`,
    plus `decision_row_s` per row beyond the first that one batched call reads."""
    profile = profile or CostProfile.relative()
    if batch_size < 1:
        raise MCSDError(f"batch size must be at least 1, got {batch_size}")
    stopper, name = _resolve(data, stopper, profile, name, batch_size)
    if hasattr(stopper, "for_batch"):
        stopper = stopper.for_batch(batch_size)
    lookahead = stopper if isinstance(stopper, StepLookahead) else None
    res = ReplayResult(stopper=name, mode=data.mode, batch_size=batch_size)
    tree, exact = data.tree, data.mode == "exact"
    queue = iter(data.prompts.values())
    rows: list[_Row] = []
    while True:
        while len(rows) < batch_size and (p := next(queue, None)) is not None:
            row = _Row(p, stopper)
            if row.advance(exact):
                rows.append(row)
        if not rows:
            break
        depth = (lookahead.depth(rows, tree, profile) if lookahead
                 else _batch_depth(stopper, rows, data.depth, res))
        pending = max(r.pending for r in rows)  # the first draft forward pads to it
        forwards = step_forwards(tree, depth, pending)
        res.cost_s += profile.step_seconds(tree, depth, pending, len(rows))
        res.draft_forwards += len(forwards.draft)
        res.batch_steps += 1
        for row in list(rows):
            s = min(depth, row.cap)
            step, p = row.step, row.prompt
            out = step_outcome(step.accepted if step else 0, s, row.pending,
                               p.new_tokens - row.t if exact else None)
            res.tokens += out.committed
            res.steps += 1
            res.accepted += out.accepted
            res.drafted_depth += s
            res.drafted_tokens += tree.cum[s]
            res.target_tokens += 1 + tree.cum[s]
            if s:
                res.acceptance_sum += out.accepted / s
                res.drafting_steps += 1
            row.traj.update(out.accepted, out.committed, s)
            row.stopper.update(s, out.accepted)
            row.t += out.committed
            row.pending = out.pending
            if not row.advance(exact):
                rows.remove(row)
    res.cost_s += decision_s * res.decisions
    res.cost_s += decision_row_s * (res.decision_rows - res.decisions)
    return res


def _batch_depth(stopper, rows: list[_Row], max_depth: int, res: ReplayResult) -> int:
    """The depth the batch drafts to: 1 (0 when no row may draft), then one more while some
    row's cap is deeper and the stopper says so; counts the decisions that looked at a frontier
    (and the rows they read) in `res`."""
    batch = getattr(stopper, "batch_continue", None)
    s = 1 if any(r.cap for r in rows) else 0
    while s:
        asked = [r for r in rows if s < r.cap]
        if not asked:
            break
        frontiers = [_frontier(r, s, max_depth) for r in asked]
        if batch is not None:
            go = batch(frontiers)
            read = sum(f.read for f in frontiers)
            res.decisions += read > 0  # a decision costs time only if it looked
            res.decision_rows += read
        else:  # every asked row's own stopper decides; the batch drafts on if ANY says so
            votes = [r.stopper.should_continue(f) for r, f in zip(asked, frontiers, strict=True)]
            go = any(votes)
            read = sum(f.read for f in frontiers)
            res.decisions += read
            res.decision_rows += read
        if not go:
            break
        s += 1
    return s


def _frontier(row: _Row, depth: int, max_depth: int) -> _Frontier:
    step = row.step
    return _Frontier(depth, max_depth, step.nodes[depth - 1], row.traj.values(),
                     step.hidden[depth - 1] if step.hidden else None, step.accepted,
                     (row.prompt.key, step.position, depth))


class MemoStopper(StopperBase):
    """A learned stopper whose node scores are cached by (prompt, position, depth, trajectory),
    so that sweeping thresholds and aggregations costs one model call per distinct frontier.
    Decides as `LearnedStopper` does, alone and for a batch (`row_aggregation`)."""

    def __init__(self, learned, cache: dict | None = None) -> None:
        self.learned = learned
        self.cache = {} if cache is None else cache
        self.threshold, self.aggregation = learned.threshold, learned.aggregation
        self.min_depth, self.min_depth_gate = learned.min_depth, learned.min_depth_gate
        self.row_aggregation = learned.row_aggregation
        self.needs_hidden = learned.needs_hidden

    def reset(self) -> None:
        self.learned.reset()

    def update(self, drafted: int, accepted: int) -> None:
        self.learned.update(drafted, accepted)

    def _score(self, frontier: _Frontier) -> float:
        from mcsd_runtime.stop.aggregation import AGGREGATIONS

        key = (*frontier.key, *frontier.trajectory())
        hit = self.cache.get(key)
        if hit is None:
            if self.learned.decision:
                feats = frontier.decision_features()
            else:
                feats = frontier.features().numpy()
            x = frontier.hidden() if self.needs_hidden else feats
            hit = (self.learned.node_scores(x), feats)
            self.cache[key] = hit
        frontier.read = True
        return AGGREGATIONS[self.aggregation](*hit)

    def _skips(self, frontier: _Frontier) -> bool:
        from mcsd_runtime.stop.learned import drafts_without_deciding

        return drafts_without_deciding(frontier, self.min_depth, self.min_depth_gate)

    def should_continue(self, frontier: _Frontier) -> bool:
        from mcsd_runtime.stop.aggregation import reachable

        if self._skips(frontier):
            return True
        return reachable("max", self.threshold, 1) and self._score(frontier) >= self.threshold

    def batch_continue(self, frontiers: list[_Frontier]) -> bool:
        from mcsd_runtime.stop.aggregation import batch_decision, reachable

        if any(self._skips(f) for f in frontiers):
            return True
        if not reachable(self.row_aggregation, self.threshold, len(frontiers)):
            return False
        return batch_decision(self.row_aggregation, [self._score(f) for f in frontiers],
                              self.threshold)


THRESHOLDS = np.round(np.concatenate([np.linspace(0.02, 0.2, 10), np.linspace(0.25, 0.95, 15)]),
                      3)


MIN_DEPTHS = (1, 2, 3)
# min_depth_gate values tried for the chosen setting (0: depths below min_depth always drafted)
GATES = (0.0, 0.4, 0.5, 0.6, 0.7)


def row_thresholds(row_aggregation: str, batch_size: int, thresholds=THRESHOLDS) -> np.ndarray:
    """The thresholds swept for a row aggregation: a `sum` over rows ranges up to the batch
    size, so its grid is scaled by it."""
    return np.asarray(thresholds) * (batch_size if row_aggregation == "sum" else 1)


def _setting_name(s: dict) -> str:
    rows = f"/{s['row_aggregation']}" if s.get("row_aggregation", "max") != "max" else ""
    gate = f"/{s['min_depth_gate']:g}" if "min_depth_gate" in s else ""
    return f"learned:{s['aggregation']}{rows}@{s['threshold']:g}/{s['min_depth']}{gate}"


def replay_setting(data: ReplayData, learned, profile: CostProfile | None, cache: dict,
                   setting: dict, batch_size: int = 1, decision_s: float = 0.0,
                   decision_row_s: float = 0.0) -> dict:
    """The learned stopper replayed with `setting`'s fields (threshold, aggregations,
    min_depth, gate; node scores cached in `cache`): the setting and the ReplayResult."""
    memo = MemoStopper(learned, cache)
    for k, v in setting.items():
        setattr(memo, k, v)
    r = replay(data, memo, profile, name=_setting_name(setting), decision_s=decision_s,
               batch_size=batch_size, decision_row_s=decision_row_s)
    return setting | r.as_dict()


def sweep(data: ReplayData, learned, profile: CostProfile | None, aggregations,
          thresholds=THRESHOLDS, decision_s: float = 0.0, progress: bool = False,
          min_depths=MIN_DEPTHS, batch_size: int = 1, row_aggregations=("max",),
          decision_row_s: float = 0.0) -> list[dict]:
    """Replay the learned stopper at every (aggregation, row aggregation, threshold, min_depth)
    at `batch_size` (`progress`: on stderr); decisions are charged `decision_s` each, where the
    stopper looked, plus `decision_row_s` per further row a batched decision read."""
    from mcsd_runtime.progress import progress as progress_bar

    cache: dict = {}
    grid = [{"aggregation": agg, "row_aggregation": rows, "threshold": float(thr),
             "min_depth": m}
            for agg in aggregations for rows in row_aggregations
            for thr in row_thresholds(rows, batch_size, thresholds)
            for m in min_depths if m < data.depth or m == 1]
    return [replay_setting(data, learned, profile, cache, s, batch_size, decision_s,
                            decision_row_s)
            for s in progress_bar(grid, desc="replay sweep", unit="setting",
                                  disable=not progress)]


def sweep_gates(data: ReplayData, learned, profile: CostProfile | None, chosen: dict,
                gates=GATES, decision_s: float = 0.0, min_depths=MIN_DEPTHS,
                batch_size: int = 1, decision_row_s: float = 0.0) -> list[dict]:
    """Replay the chosen aggregations and threshold at every (min_depth, min_depth_gate); gates
    apply below a min_depth above 1 only."""
    cache: dict = {}
    keep = {k: chosen[k] for k in ("aggregation", "row_aggregation", "threshold")
            if k in chosen}
    return [replay_setting(data, learned, profile, cache,
                            keep | {"min_depth": m, "min_depth_gate": float(gate)}, batch_size,
                            decision_s, decision_row_s)
            for m in min_depths if 1 < m < data.depth for gate in gates]


def baselines(data: ReplayData, profile: CostProfile | None,
              batch_size: int = 1) -> dict[str, ReplayResult]:
    """Static depths 1..D, the built-in heuristics at their defaults, the throughput oracle and
    the accepted-length oracle, at `batch_size` (above 1 `oracle` is `lookahead_schedule`'s, a
    heuristic below the optimum)."""
    out = {f"static:{d}": replay(data, f"static:{d}", profile, batch_size=batch_size)
           for d in range(1, data.depth + 1)}
    for spec in ("heuristic", "confidence", "entropy", "cumprod", "oracle", "oracle-accepted"):
        out[spec] = replay(data, spec, profile, batch_size=batch_size)
    return out
