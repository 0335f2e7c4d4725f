"""Recipes of extra drafts distilled from a built toy target (torch-free).

A draft preset names the toy preset whose target it is distilled from; the target is read from
the cache and never retrained. A built draft is cached by a hash of its recipe and of the
target's recipe (`toy-draft-<name>-<hash12>`), as pairs are.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.toy.corpus import stdlib_version
from mcsd_runtime.toy.recipe import TOY_CODE_VERSION, ModelShape

# Bump when a code change alters what a draft recipe builds.
DRAFT_CODE_VERSION = 1
INITS = ("target-layers", "random")


@dataclass(frozen=True)
class DraftRecipe:
    """Everything that determines an extra draft's weights, given its target.

    `init="target-layers"` starts the draft from the target's embeddings, final norm and
    `shape.layers` of its layers, evenly spaced from the first to the last (the draft then needs
    the target's width); `random` starts from scratch. Then `steps` optimizer steps distil it
    from the frozen target: KL to the target's distribution plus `ce_weight` times its own
    next-token cross-entropy, on the target's training split.
    """

    name: str
    target_preset: str
    shape: ModelShape
    init: str
    steps: int
    lr: float
    ce_weight: float
    seq_len: int
    batch_size: int
    warmup_frac: float
    seed: int = 0
    precision: str = "auto"

    def resolved(self, target_precision: str) -> DraftRecipe:
        """The recipe with `precision` fixed: by default the target pair's training precision
        (as resolved in its recipe: "bf16-mixed" or "32-true")."""
        return self if self.precision != "auto" else replace(self, precision=target_precision)

    def to_dict(self) -> dict:
        return asdict(self)

    def hash12(self, target_hash: str, target_precision: str) -> str:
        """A hash of this recipe (resolved), the target pair's recipe hash, the code and the
        stdlib version."""
        blob = json.dumps({"draft": self.resolved(target_precision).to_dict(),
                           "target": target_hash, "code_version": TOY_CODE_VERSION,
                           "draft_code_version": DRAFT_CODE_VERSION, "stdlib": stdlib_version()},
                          sort_keys=True).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:12]


DRAFT_PRESETS: dict[str, DraftRecipe] = {
    # For tests: one layer of the tiny target, a few steps (seconds).
    "tiny-l1": DraftRecipe(
        name="tiny-l1", target_preset="tiny",
        shape=ModelShape(layers=1, hidden=64, heads=2, intermediate=128),
        init="target-layers", steps=12, lr=3e-3, ce_weight=0.1, seq_len=64, batch_size=8,
        warmup_frac=0.1),
    # Two and four of the default target's 16 layers (d=128): dearer than the pair's own
    # one-layer draft (a decode step 8x / 5x cheaper than the target's, against 12x), closer to
    # it (greedy agreement 75% / 82%, against 58%); about 2 minutes each on one thread. From
    # the target's layers, 100 steps gave l2 64% agreement; from random weights, 31%.
    "l2": DraftRecipe(
        name="l2", target_preset="default",
        shape=ModelShape(layers=2, hidden=128, heads=4, intermediate=384),
        init="target-layers", steps=300, lr=2e-3, ce_weight=0.1, seq_len=256, batch_size=8,
        warmup_frac=0.05),
    "l4": DraftRecipe(
        name="l4", target_preset="default",
        shape=ModelShape(layers=4, hidden=128, heads=4, intermediate=384),
        init="target-layers", steps=300, lr=2e-3, ce_weight=0.1, seq_len=256, batch_size=8,
        warmup_frac=0.05),
}


def get_draft_recipe(name: str, **overrides: object) -> DraftRecipe:
    """The draft preset `name` (with any field overrides, for experiments and tests)."""
    if name not in DRAFT_PRESETS:
        raise MCSDError(f"unknown toy draft {name!r}; use one of {', '.join(DRAFT_PRESETS)} "
                        f"(`mcsd toy draft --list`)")
    try:
        recipe = replace(DRAFT_PRESETS[name], **overrides)
    except TypeError as err:
        raise MCSDError(f"bad draft recipe override: {err}") from None
    if recipe.init not in INITS:
        raise MCSDError(f"draft init must be one of {', '.join(INITS)}, got {recipe.init!r}")
    return recipe
