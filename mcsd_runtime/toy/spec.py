"""Toy pair names, torch-free (the CLIs check them while building their parsers)."""


def is_toy_spec(spec: str) -> bool:
    """Whether a model name names the toy pair (`toy`, `toy:PRESET`, `toy:PRESET:SEED`)."""
    return spec == "toy" or spec.startswith("toy:")
