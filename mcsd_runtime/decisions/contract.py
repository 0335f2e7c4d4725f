"""The two contracts between early-stop policies and the decoder: `Stopper` (what the decoder
asks) and `Frontier` (what a stopper sees).

The decoder consults a `Stopper` after each draft depth and tells it each step's outcome; it never
knows which kind it runs (as with transformers' candidate generators: decide, then learn from the
outcome). Subclass `StopperBase` and implement `should_continue`:

- `reset()`: a new sequence starts;
- `should_draft(start) -> bool`: draft at all this step? Asked before depth 1 with a `Frontier`
  of depth 0 that has no nodes (only `trajectory()` and `max_depth`); False decodes one token
  with the target alone (lossless: the step verifies an empty tree) and leaves the draft's
  pending tokens for the next step that drafts. The default drafts every step;
- `should_continue(frontier) -> bool`: after drafting `frontier.depth`, draft one more depth? It is
  asked before the frontier goes through the draft, so stopping saves that forward;
- `update(drafted, accepted)`: the step drafted `drafted` depths and `accepted` were accepted;
- `needs_hidden`: True when `should_continue` reads `frontier.hidden()` (the decoder then keeps the
  draft's hidden states; recorders use the same name);
- `check_tree(k_config)`: called once by the decoder with its tree; a stopper tied to one tree
  shape (a learned one) raises MCSDError for another.

In a batch (`MCSDDecoder.generate_batch`) each sequence runs its own `copy.copy` of the stopper
(then `reset()`): keep per-sequence state in plain attributes, or define `__copy__`. Two more
members let a stopper decide for the batch (`StopperBase` gives both defaults):

- `for_batch(batch_size) -> Stopper`: the stopper to run at that batch size (default: itself);
- `batch_continue(frontiers) -> bool | None`: one decision for all rows that may still go
  deeper; None (the default) leaves it to the rows: the batch continues if any row's copy says
  so.

The engine consults none of these directly: every decision inside a step goes through a
`Planner` (what each row copies, which rows draft, which extend after each depth, the first
depth's width, how much each verifies, and each row's outcome), for one row or a batch alike. A
stopper reaches it through the decoder's per-row adapter
(`mcsd_runtime.decode.planning.RowPlanner`, which also applies the batch's depth policy); a
decision that chooses every row's tree across the batch (a verification budget,
`mcsd_runtime.decisions.verify_budget`) is a `Planner` itself, given to the decoder as its
planner (`MCSDDecoder(planner=...)`), not as a stopper. `StopperOrPlanner` is either kind:
what a spec string names (`mcsd_runtime.decisions.builtin.make_decision`). The copy length and
the width join them in the engine's one planner (`mcsd_runtime.decode.planning.StepPlanner`).

A `Frontier` is what a stopper sees: the nodes of the depth just drafted. The decoder serves it
from the tensors it drafted with, offline replay from collected rows; both compute features only
when asked, so stoppers that ignore them cost nothing.

The built-in stoppers and the spec strings that name them live in
`mcsd_runtime.decisions.builtin`; learned ones in `mcsd_runtime.decisions.learned`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from mcsd_runtime.decisions.features import DECISION_FEATURES, FEATURE_NAMES
from mcsd_runtime.errors import MCSDError

MEMBERS = ("reset", "should_draft", "should_continue", "update", "check_tree", "needs_hidden",
           "for_batch", "batch_continue")


class Frontier(Protocol):
    """The nodes of the depth just drafted, before they go through the draft."""

    depth: int  # depth just drafted (1-based; 0 before drafting: `should_draft`, no nodes)
    max_depth: int  # deepest depth the decoder could still draft in this step

    def trajectory(self) -> list[float]:
        """TRAJECTORY_FEATURES of the run before this step."""
        ...

    def features(self) -> torch.Tensor:
        """[n, len(FEATURE_NAMES)] float32: node features, then the trajectory on every row."""
        ...

    def column(self, name: str) -> torch.Tensor:
        """[n] float32: one of FEATURE_NAMES for every node, equal to that column of
        `features()` but computed alone (no pass over the vocabulary unless it is q_entropy)."""
        ...

    def decision_features(self) -> np.ndarray:
        """[n, len(DECISION_FEATURES)] float64 on the host: the cheap subset learned stoppers
        read (no extra pass over the vocabulary)."""
        ...

    def hidden(self) -> torch.Tensor:
        """[n, H]: the draft's last hidden state that proposed each node (its parent's);
        MCSDError where there is none (target-initialized roots, replay without hidden)."""
        ...


class Stopper(Protocol):
    needs_hidden: bool

    def reset(self) -> None: ...

    def should_draft(self, start: Frontier) -> bool: ...

    def should_continue(self, frontier: Frontier) -> bool: ...

    def update(self, drafted: int, accepted: int) -> None: ...

    def check_tree(self, k_config: tuple[int, ...]) -> None: ...

    def for_batch(self, batch_size: int) -> Stopper: ...

    def batch_continue(self, frontiers: Sequence[Frontier]) -> bool | None: ...


class Planner:
    """Every decision the engine consults inside a step, for all rows of a batch at once (a
    batch of one included). Each step the engine asks `copy` (prompt lookup's copies), `plan`,
    then `extend` after every depth that some row drafted (the last one too, where the answers
    are not read), `width` (the first depth's, where a row drafted no deeper), then `verify`;
    each row's outcome comes back through `outcome`. A planner given to a decoder
    (`MCSDDecoder(planner=...)`, in place of per-row stoppers) is set up for each batch size
    (`for_batch`; a batch of one runs the decoder's own) and checked against the tree once
    (`check_tree`); `needs_hidden` as a stopper's."""

    needs_hidden: bool = False

    def for_batch(self, batch_size: int) -> Planner:
        """The planner of a batch of `batch_size` rows (default: itself)."""
        return self

    def check_tree(self, k_config: tuple[int, ...]) -> None:
        """Refuse (MCSDError) a tree this planner was not made for (default: any)."""
        return None

    def copy(self, rows: Sequence[object], caps: list[int]) -> list[list[int]]:
        """First in a step: the tokens prompt lookup copies for each row (its own object, as
        `StepStart.row`), at most `caps[i]` of them ([]: none; a row that copies drafts
        nothing). Default: none."""
        return [[] for _ in rows]

    def plan(self, starts: Sequence[StepStart]) -> list[bool]:
        """Which rows draft this step: each row's `StepStart` (cap 0: it may not draft, because
        it copies a chain or it has no tokens left)."""
        raise NotImplementedError

    def extend(self, frontiers: Sequence[Frontier | None]) -> list[bool]:
        """After a depth: the frontier of each row that drafted it, None elsewhere; whether each
        drafts one more (a row at its cap stops whatever the answer)."""
        raise NotImplementedError

    def width(self, tops: Sequence[list[float]]) -> list[int]:
        """After the draft, for each row that drafted its first depth only: how many of that
        depth's candidates it verifies (1..k), from the draft's k largest probabilities at its
        root (`tops[i]`, highest first). Default: all k."""
        return [len(top) for top in tops]

    def verify(self, drafted: list[int]) -> list[int]:
        """How many of its drafted depths each row verifies (at most `drafted`; default all)."""
        return list(drafted)

    def outcome(self, row: object, drafted: int, accepted: int) -> None:
        """Row `row` (its `StepStart.row`) drafted `drafted` depths this step and `accepted` of
        them were accepted (0, 0 at its first token, and for a copied chain)."""
        return None


StopperOrPlanner = Stopper | Planner  # what a spec names: per-row stoppers, or a step planner


class StopperBase:
    """Defaults for every `Stopper` member but `should_continue`: stateless, features only, a
    draft at every step, any tree, the same stopper at every batch size, rows deciding a batch's
    depth."""

    needs_hidden = False

    def reset(self) -> None:
        pass

    def should_draft(self, start: Frontier) -> bool:
        return True

    def should_continue(self, frontier: Frontier) -> bool:
        raise NotImplementedError

    def update(self, drafted: int, accepted: int) -> None:
        pass

    def check_tree(self, k_config: tuple[int, ...]) -> None:
        pass

    def for_batch(self, batch_size: int) -> Stopper:
        return self

    def batch_continue(self, frontiers: Sequence[Frontier]) -> bool | None:
        return None


class StepStart:
    """A row before its step (what `Planner.plan` sees of it, and the `Frontier` of a stopper's
    `should_draft`): depth 0, no nodes, served alike by the decoder and by replay; `cap` the
    depth the row may draft to this step (its tokens left; 0: it may not draft), `pending` the
    draft tokens it feeds first."""

    depth = 0

    def __init__(self, max_depth: int, trajectory: list[float], cap: int | None = None,
                 pending: int = 1, row: object = None) -> None:
        self.max_depth, self._trajectory = max_depth, trajectory
        self.cap = max_depth if cap is None else cap
        self.pending = pending
        self.row = row  # the row's own object, the same at each of its steps (None: unknown)

    def trajectory(self) -> list[float]:
        return self._trajectory

    def features(self) -> torch.Tensor:
        return torch.zeros(0, len(FEATURE_NAMES))

    def column(self, name: str) -> torch.Tensor:
        return torch.zeros(0)

    def decision_features(self) -> np.ndarray:
        return np.zeros((0, len(DECISION_FEATURES)))

    def hidden(self) -> torch.Tensor:
        raise MCSDError("nothing is drafted before a step starts: should_draft sees the "
                        "trajectory only")
