"""The target a draft is distilled from: a local model folder (written by `save_pretrained`, or
holding one `.gguf` file) or the toy pair's target (`toy`, `toy:tiny`), and its fingerprint."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import torch

from mcsd_runtime.errors import MCSDError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
TARGET_HELP = ("pass a local model folder (written by save_pretrained, or holding one .gguf "
               "file), smollm2, or toy / toy:tiny for the embedded toy target")


def resolve_target(target: str | Path, build: bool = False) -> Path:
    """The folder of `target`: a toy spec's target folder (a toy pair not built yet is built as
    `toy.build.resolve_toy` says: if `build`, or if it builds in seconds), a named real model's
    converted folder (`models.named`), or an existing local folder (MCSDError naming what is
    accepted otherwise)."""
    from mcsd_runtime.backend.named import is_named, resolve_named
    from mcsd_runtime.toy.spec import is_toy_spec

    name = str(target)
    if is_toy_spec(name):
        from mcsd_runtime.toy.build import resolve_toy

        return Path(resolve_toy(name, build=build)[0])
    if is_named(name):
        resolved = resolve_named(name)
        if not Path(resolved).is_dir():
            raise MCSDError(f"{name} resolves to the hub model {resolved}, which is not a local "
                            f"folder: install its package to distil from it, or pass a folder")
        return Path(resolved)
    path = Path(name).expanduser()
    if not path.is_dir():
        raise MCSDError(f"unknown target {name!r}: {TARGET_HELP}")
    if not (path / "config.json").is_file() and not _gguf_files(path):
        raise MCSDError(f"{path} holds no model (no config.json and no .gguf file): "
                        f"{TARGET_HELP}")
    return path


def _gguf_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.gguf"))


def _gguf_kwargs(folder: Path) -> dict:
    """`gguf_file=` for a folder holding a GGUF file and no config.json (else nothing)."""
    if (folder / "config.json").is_file():
        return {}
    ggufs = _gguf_files(folder)
    if len(ggufs) != 1:
        raise MCSDError(f"{folder} holds {len(ggufs)} .gguf files and no config.json: keep "
                        f"one, or pass a save_pretrained folder")
    return {"gguf_file": ggufs[0].name}


def load_target(folder: Path):
    """(model in float32, eval mode; tokenizer) of a target folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    kwargs = _gguf_kwargs(folder)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs)
    except (OSError, ValueError) as err:
        raise MCSDError(f"cannot load the target at {folder}: {err}") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.eval(), tokenizer


def fingerprint(folder: Path, model=None, tokenizer=None) -> dict:
    """What identifies a target: its config hash, tokenizer hash and a SHA-256 of its weight
    files (loads only the config and tokenizer when `model`/`tokenizer` are not given)."""
    from types import SimpleNamespace

    from mcsd_runtime.backend.fingerprint import config_hash, tokenizer_hash

    kwargs = _gguf_kwargs(folder)
    if model is None:
        from transformers import AutoConfig

        model = SimpleNamespace(config=AutoConfig.from_pretrained(folder, **kwargs))
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    return {"config": config_hash(model), "tokenizer": tokenizer_hash(tokenizer),
            "weights": weights_digest(folder)}


def weights_digest(folder: Path) -> str:
    """A SHA-256 over the folder's weight files (names and contents), 16 hex digits."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise MCSDError(f"{folder} holds no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    h = hashlib.sha256()
    for p in files:
        st = p.stat()
        h.update(f"{p.name}:{_file_digest(str(p.resolve()), st.st_size, st.st_mtime_ns)}"
                 .encode())
    return h.hexdigest()[:16]


@lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """A file's SHA-256, remembered per (path, size, mtime) within a process."""
    from mcsd_runtime.paths import file_sha256

    return file_sha256(Path(path))
