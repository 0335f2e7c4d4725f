"""The embedded toy target/draft pair, trained offline on the Python standard library.

    build_pair(preset="tiny", out=None, seed=0, force=False, progress=True) -> Path
        the pair folder (target/, draft/, card.json), built if needed
    toy_pair_dirs(preset="default", seed=0) -> (target_dir, draft_dir), built if needed
    resolve_toy("toy" | "toy:tiny" | "toy:default[:seed]") -> (target, draft) or None
    is_toy_spec(spec) -> whether a model name is such a toy spec (torch-free)

Names are imported lazily so that `mcsd --help` does not load torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "build_pair": "mcsd_runtime.toy.build",
    "pair_dir": "mcsd_runtime.toy.build",
    "read_card": "mcsd_runtime.toy.build",
    "resolve_toy": "mcsd_runtime.toy.build",
    "toy_pair_dirs": "mcsd_runtime.toy.build",
    "verify_pair": "mcsd_runtime.toy.build",
    "PRESETS": "mcsd_runtime.toy.recipe",
    "Recipe": "mcsd_runtime.toy.recipe",
    "get_recipe": "mcsd_runtime.toy.recipe",
}
__all__ = sorted([*_EXPORTS, "is_toy_spec"])


def is_toy_spec(spec: str) -> bool:
    """Whether a model name names the toy pair (`toy`, `toy:PRESET`, `toy:PRESET:SEED`)."""
    return spec == "toy" or spec.startswith("toy:")


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
