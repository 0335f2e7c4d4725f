"""The rules of one decoder step, as offline replay (`replay`: depth, copy length and width),
the oracle's dynamic program, `train.stop.labels.walk_trajectory` and the cost model count it.
`MCSDDecoder` runs these rules on real caches; the exact-replay tests check that both agree
token for token.

A step stopped at depth `s` of the tree (`s = 0`: it drafts nothing, as for the last token of an
output capped by `max_new_tokens`, or where the stopper's `should_draft` says so):

- **forwards**: one draft forward over the tokens the draft has not seen yet (its *pending*
  ones), one per depth 1..s-1 (the stopper decides before a depth is forwarded, so depth s never
  is), and one target forward over its pending bonus token and the `cum[s]` drafted nodes;
- **accepted**: `min(L, s)`, L being what the same step accepts when drafted to full depth;
- **committed**: the accepted tokens plus the target's bonus (or residual) token, clipped at the
  tokens left in the output (`room`);
- **pending after**: the bonus token, plus the deepest accepted node when it lies at the
  never-forwarded depth s; a step that drafts nothing leaves the earlier pending tokens pending.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the rules need no torch
    from mcsd_runtime.tree import Tree

__all__ = ["FIRST_PENDING", "PENDING_STATES", "StepForwards", "StepOutcome", "step_forwards",
           "step_outcome", "copy_outcome"]

FIRST_PENDING = 1  # a sequence starts with the prompt's last token pending (prefill takes the rest)
# what a step can start with when every step drafts: the first, or after any drafting step (steps
# that draft nothing add one pending token each)
PENDING_STATES = (1, 2)

# A batch forward is packed (ragged: only each row's own tokens go through the model) only when
# its real tokens fill at most this share of the padded grid: packing costs a few index copies
# per layer, and on a small model whose forward is bound by fixed costs it saves little (the toy
# pair's target at B=8: 1.08x the padded forward for rows of 3 and 4 tokens, 25 of 32; 0.90x for
# 12 of 40; SmolLM2's shape: 0.89x for 24 of 40, 0.75x for 12 of 40; `mcsd ragged-bench`,
# docs/results-batches.md). The engine (`decode.ragged.Ragged.needed`) and the prices
# (`CostProfile.ragged_step_seconds`) both follow `packs`.
RAGGED_FILL = 0.75


def packs(counts: list[int], width: int, fill: float = RAGGED_FILL) -> bool:
    """Whether a forward of rows carrying `counts` tokens on a grid `width` wide is packed:
    more than one row, and real tokens filling at most `fill` of the grid."""
    return len(counts) > 1 and sum(counts) <= fill * len(counts) * width


@dataclass(frozen=True)
class StepForwards:
    """Token counts of one step's forwards."""

    draft: tuple[int, ...]  # the draft's forwards in order; the first over the pending tokens
    target: int  # the target's one forward


@dataclass(frozen=True)
class StepOutcome:
    """What a step stopped at `depth` does to the sequence."""

    depth: int  # s: depths drafted
    accepted: int  # drafted tokens accepted
    committed: int  # tokens committed
    pending: int  # draft-pending tokens after the step


def step_forwards(tree: Tree, depth: int, pending: int) -> StepForwards:
    """The forwards of a step stopped at `depth` with `pending` draft-pending tokens."""
    draft = (pending, *(tree.sizes[d - 1] for d in range(1, depth))) if depth else ()
    return StepForwards(draft, 1 + tree.cum[depth])


def step_outcome(full_accepted: int, depth: int, pending: int = FIRST_PENDING,
                 room: int | None = None, fed: bool | None = None) -> StepOutcome:
    """The step stopped at `depth` whose full-depth twin accepted `full_accepted` tokens, with
    `pending` draft-pending tokens before it and `room` tokens left in the output (None: no
    limit). `fed`: whether the pending tokens went through the draft (default: when it drafts;
    in a batch, a row that drafts nothing is fed with the rows that draft)."""
    accepted = min(full_accepted, depth)
    committed = accepted + 1 if room is None else min(accepted + 1, room)
    fed = bool(depth) if fed is None else fed
    after = (0 if fed else pending) + 1 + (1 if depth and accepted >= depth else 0)
    return StepOutcome(depth, accepted, committed, after)


def copy_outcome(full_accepted: int, copied: int, pending: int,
                 room: int | None = None) -> StepOutcome:
    """A step that drafts nothing and verifies `copied` tokens of a prompt-lookup chain whose
    first `full_accepted` tokens the target would accept (`copied` 0: the target decodes one
    token alone): it accepts `min(full_accepted, copied)`, commits those and the target's bonus
    token (clipped at `room`), and the draft, fed nothing, has every committed token pending
    besides the ones it had."""
    accepted = min(full_accepted, copied)
    committed = accepted + 1 if room is None else min(accepted + 1, room)
    return StepOutcome(0, accepted, committed, pending + committed)
