"""The embedded toy target/draft pair, trained offline on the Python standard library.

    build_pair(preset="tiny", out=None, seed=0, force=False, progress=True) -> Path
        the pair folder (target/, draft/, card.json), built if needed
    toy_pair_dirs(preset="default", seed=0) -> (target_dir, draft_dir), built if needed
    resolve_toy("toy" | "toy:tiny" | "toy:default[:seed]") -> (target, draft) or None
    is_toy_spec(spec) -> whether a model name is such a toy spec (torch-free)
    parse_toy_spec(spec) -> (preset, seed) of a toy spec (torch-free)

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
__all__ = sorted([*_EXPORTS, "is_toy_spec", "parse_toy_spec"])


def is_toy_spec(spec: str) -> bool:
    """Whether a model name names the toy pair (`toy`, `toy:PRESET`, `toy:PRESET:SEED`)."""
    return spec == "toy" or spec.startswith("toy:")


def parse_toy_spec(spec: str) -> tuple[str, int]:
    """`toy` -> ("default", 0); `toy:tiny` -> ("tiny", 0); `toy:tiny:3` -> ("tiny", 3)."""
    from mcsd_runtime.errors import MCSDError

    parts = spec.split(":")
    if not is_toy_spec(spec) or len(parts) > 3:
        raise MCSDError(
            f"bad toy model spec {spec!r}; use toy, toy:<preset> or toy:<preset>:<seed>")
    preset = parts[1] if len(parts) > 1 and parts[1] else "default"
    try:
        seed = int(parts[2]) if len(parts) > 2 else 0
    except ValueError:
        raise MCSDError(f"bad toy model spec {spec!r}: the seed must be an integer, "
                        "e.g. toy:default:0") from None
    return preset, seed


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
