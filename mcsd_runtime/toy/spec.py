"""Toy pair names, torch-free (the CLIs check them while building their parsers)."""

from mcsd_runtime.errors import MCSDError


def is_toy_spec(spec: str) -> bool:
    """Whether a model name names the toy pair (`toy`, `toy:PRESET`, `toy:PRESET:SEED`)."""
    return spec == "toy" or spec.startswith("toy:")


def parse_toy_spec(spec: str) -> tuple[str, int]:
    """`toy` -> ("default", 0); `toy:tiny` -> ("tiny", 0); `toy:tiny:3` -> ("tiny", 3)."""
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


DRAFT_PREFIX = "toy-draft:"


def is_draft_spec(spec: str) -> bool:
    """Whether a model name names an extra toy draft (`toy-draft:NAME`, e.g. toy-draft:l2)."""
    return spec.startswith(DRAFT_PREFIX)


def parse_draft_spec(spec: str) -> str:
    """`toy-draft:l2` -> "l2" (the draft preset's name; not checked against the presets)."""
    name = spec[len(DRAFT_PREFIX):] if is_draft_spec(spec) else ""
    if not name or ":" in name:
        raise MCSDError(f"bad toy draft spec {spec!r}; use toy-draft:<name>, e.g. toy-draft:l2 "
                        f"(`mcsd toy draft --list`)")
    return name
