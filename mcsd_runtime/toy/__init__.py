"""The embedded toy target/draft pair, trained offline on the Python standard library.

    build_pair(preset="tiny", out=None, seed=0, force=False, progress=True) -> Path
        the pair folder (target/, draft/, card.json), built if needed
    toy_pair_dirs(preset="default", seed=0) -> (target_dir, draft_dir), built if needed
    resolve_toy("toy" | "toy:tiny" | "toy:default[:seed]", build=False) -> (target, draft) or None
        a pair not built yet is built only if `build` or its preset builds in seconds (tiny)
    is_toy_spec(spec) -> whether a model name is such a toy spec (torch-free)
    parse_toy_spec(spec) -> (preset, seed) of a toy spec (torch-free)
    build_draft(name, target_seed=0, ...) -> Path
        an extra draft distilled from the cached toy target (`toy-draft:NAME`), built if needed
    draft_dir(name, target_seed=0) -> where that draft is cached

Names are imported lazily so that `mcsd --help` does not load torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from mcsd_runtime.toy.spec import is_toy_spec as is_toy_spec
from mcsd_runtime.toy.spec import parse_toy_spec as parse_toy_spec

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time `__getattr__` imports on use
    from mcsd_runtime.toy.build import build_pair as build_pair
    from mcsd_runtime.toy.build import pair_dir as pair_dir
    from mcsd_runtime.toy.build import read_card as read_card
    from mcsd_runtime.toy.build import resolve_toy as resolve_toy
    from mcsd_runtime.toy.build import toy_pair_dirs as toy_pair_dirs
    from mcsd_runtime.toy.build import verify_pair as verify_pair
    from mcsd_runtime.toy.draft_recipe import DRAFT_PRESETS as DRAFT_PRESETS
    from mcsd_runtime.toy.drafts import build_draft as build_draft
    from mcsd_runtime.toy.drafts import draft_dir as draft_dir
    from mcsd_runtime.toy.recipe import PRESETS as PRESETS
    from mcsd_runtime.toy.recipe import Recipe as Recipe
    from mcsd_runtime.toy.recipe import get_recipe as get_recipe

_EXPORTS = {
    "build_pair": "mcsd_runtime.toy.build",
    "pair_dir": "mcsd_runtime.toy.build",
    "read_card": "mcsd_runtime.toy.build",
    "resolve_toy": "mcsd_runtime.toy.build",
    "toy_pair_dirs": "mcsd_runtime.toy.build",
    "verify_pair": "mcsd_runtime.toy.build",
    "DRAFT_PRESETS": "mcsd_runtime.toy.draft_recipe",
    "build_draft": "mcsd_runtime.toy.drafts",
    "draft_dir": "mcsd_runtime.toy.drafts",
    "PRESETS": "mcsd_runtime.toy.recipe",
    "Recipe": "mcsd_runtime.toy.recipe",
    "get_recipe": "mcsd_runtime.toy.recipe",
}
__all__ = sorted([*_EXPORTS, "is_toy_spec", "parse_toy_spec"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
