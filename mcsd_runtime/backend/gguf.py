"""GGUF files as ordinary model folders: found, converted once, cached, checked.

transformers reads a GGUF file itself (`from_pretrained(folder, gguf_file=name)`) and
dequantizes every weight, which takes about 30 s for SmolLM2-135M's Q4_1 file on one CPU thread.
So a file is converted once into the user cache (`mcsd_runtime.paths`) as a `save_pretrained`
folder (fp32 safetensors, the tokenizer with its chat template) plus `card.json`, which says
where the file came from and records each written file's size and SHA-256; later loads read
the folder. The folder is `models_dir()/gguf-<file stem>-<sha12>`, keyed by the GGUF file's
SHA-256, so another file (another quantization, another model) gets its own folder. A
conversion writes into a temporary sibling folder renamed at the end, so an interrupted one
never looks complete.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import re
import time
from pathlib import Path

from mcsd_runtime.backend.compat import hf_progress_bars_off
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import (
    CACHE_HELP,
    build_folder,
    check_files,
    file_sha256,
    models_dir,
    read_card_file,
)

CARD_NAME = "card.json"
CARD_FORMAT = "mcsd-gguf-model"
GGUF_MAGIC = b"GGUF"

_SHA_MEMO: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256


def is_gguf_spec(name: str | Path) -> bool:
    """Whether `name` means a GGUF file: a path ending in `.gguf`, or an existing folder that
    holds `.gguf` files and no `config.json` (a `save_pretrained` folder has one)."""
    path = Path(name).expanduser()
    if path.name.lower().endswith(".gguf"):
        return True
    return path.is_dir() and not (path / "config.json").exists() and any(path.glob("*.gguf"))


def find_gguf(spec: str | Path) -> Path:
    """The GGUF file `spec` names: the file itself, or the one `.gguf` file of a folder
    (MCSDError if missing, not a GGUF file, or one of several)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        if not files:
            raise MCSDError(f"no .gguf file in {path}: pass a .gguf file, or a folder holding "
                            f"exactly one")
        if len(files) > 1:
            raise MCSDError(f"{path} holds {len(files)} .gguf files "
                            f"({', '.join(f.name for f in files)}): pass the one to use, "
                            f"e.g. {files[0]}")
        path = files[0]
    elif not path.is_file():
        raise MCSDError(f"no GGUF file at {spec}: pass an existing .gguf file (or a folder "
                        f"holding exactly one)")
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise MCSDError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    return path.resolve()


def gguf_sha256(path: Path) -> str:
    """The file's SHA-256, hashed once per process while its size and mtime stay the same."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _SHA_MEMO:
        _SHA_MEMO[key] = file_sha256(path)
    return _SHA_MEMO[key]


def converted_dir(gguf: Path, sha: str) -> Path:
    """Where the GGUF file `gguf` with SHA-256 `sha` is converted to (whether or not it is)."""
    stem = re.sub(r"[^a-z0-9._-]+", "-", gguf.stem.lower()).strip("-.")[:60] or "model"
    return models_dir() / f"gguf-{stem}-{sha[:12]}"


def gguf_model_dir(spec: str | Path, source: dict | None = None, progress: bool = True) -> Path:
    """The converted folder of the GGUF file `spec` names (`find_gguf`), converting it on first
    use; `source` is recorded in the card (default: the file's path). A folder that does not
    check out raises MCSDError saying how to rebuild it."""
    gguf = find_gguf(spec)
    sha = gguf_sha256(gguf)
    dest = converted_dir(gguf, sha)
    if dest.is_dir() and any(dest.iterdir()):
        card = verify_converted(dest)
        if card.get("gguf", {}).get("sha256") != sha:
            raise MCSDError(_broken(dest, f"its card names another GGUF file "
                                          f"({card.get('gguf', {}).get('sha256')})"))
        return dest
    convert_gguf(gguf, dest, source or {"kind": "path", "path": str(gguf)}, progress)
    return dest


def convert_gguf(gguf: Path, dest: Path, source: dict, progress: bool = True) -> dict:
    """Convert `gguf` into the folder `dest` (tmp folder, then rename); returns the card."""
    if progress:
        print(f"converting {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB) once into {dest} "
              f"(the cache: {CACHE_HELP})", flush=True)
    # transformers' per-shard bars are noise here; a conversion another process finished
    # first (its card written last) is kept
    with hf_progress_bars_off():
        card = build_folder(dest, "the converted model", "set MCSD_CACHE to a writable folder",
                            lambda tmp: _convert_into(tmp, gguf, source),
                            keep=lambda d: (d / CARD_NAME).is_file())
    if progress:
        print(f"converted in {card['conversion_seconds']:.0f} s ({card['params'] / 1e6:.0f} M "
              f"parameters, {card['architecture']}, license {card['license']})", flush=True)
    return card


def verify_converted(root: Path, full: bool = False) -> dict:
    """Check a converted folder: its card readable, every listed file present with its
    recorded size (and, if `full`, its SHA-256, which reads every byte). Returns the card."""

    card = read_card_file(root, CARD_NAME, CARD_FORMAT, "converted GGUF model", _broken)
    sizes = card.get("bytes")
    if not isinstance(sizes, dict) or not sizes or set(sizes) != set(card.get("files") or {}):
        raise MCSDError(_broken(root, "the card lists no files"))
    for rel, size in sorted(sizes.items()):
        path = root / rel
        if not path.is_file():
            raise MCSDError(_broken(root, f"{rel} is missing"))
        if path.stat().st_size != size:
            raise MCSDError(_broken(root, f"{rel} has {path.stat().st_size} bytes, not {size}"))
    if full:
        check_files(root, card, _broken)
    return card


def gguf_metadata(gguf: Path, keys: tuple[str, ...] = ("general.architecture", "general.name",
                                                         "general.license", "general.file_type")
                  ) -> dict:
    """The scalar metadata `keys` of a GGUF file that it has."""
    from gguf import GGUFReader

    reader = GGUFReader(gguf)
    out = {}
    for key in keys:
        field = reader.get_field(key)
        if field is not None:
            out[key] = field.contents()
    return out


# --- converting ---------------------------------------------------------------------------


def _convert_into(folder: Path, gguf: Path, source: dict) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    meta = gguf_metadata(gguf)
    where = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(**where)
        loaded = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32,
                                                      **_dequantized())
    except ImportError as err:
        raise MCSDError(f"cannot read {gguf}: {err} (pip install gguf accelerate)") from None
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        raise MCSDError(f"cannot convert {gguf}: {type(err).__name__}: {err}") from None
    model = _plain_copy(loaded)
    del loaded
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    written = sorted(p for p in folder.rglob("*") if p.is_file())
    card = {
        "format": CARD_FORMAT,
        "source": source,
        "gguf": {"file": gguf.name, "sha256": gguf_sha256(gguf), "bytes": gguf.stat().st_size,
                 "name": meta.get("general.name"), "file_type": meta.get("general.file_type")},
        "license": meta.get("general.license"),
        "architecture": meta.get("general.architecture"),
        "model_class": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": "float32",
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "conversion_seconds": round(time.perf_counter() - start, 1),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gguf": _version("gguf")},
        "files": {p.relative_to(folder).as_posix(): file_sha256(p) for p in written},
        "bytes": {p.relative_to(folder).as_posix(): p.stat().st_size for p in written},
    }
    (folder / CARD_NAME).write_text(json.dumps(card, indent=2) + "\n")
    return card


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _dequantized() -> dict:
    """`from_pretrained` kwargs that unpack every weight to a dense tensor, where this
    transformers can otherwise keep them packed (its `GgufConfig(dequantize=...)`)."""
    import inspect

    import transformers

    config = getattr(transformers, "GgufConfig", None)
    if config is None or "dequantize" not in inspect.signature(config).parameters:
        return {}
    return {"quantization_config": config(dequantize=True)}


def _plain_copy(loaded):
    """The same model as an ordinary (unquantized, serializable) one: transformers marks a
    model read from a GGUF file as quantized and refuses to `save_pretrained` it."""
    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = copy.deepcopy(loaded.generation_config)
    return model.eval()


def _broken(root: str | Path, what: str) -> str:
    return (f"the converted GGUF model at {root} is incomplete or damaged: {what}. Delete that "
            f"folder (rm -r {root}); the next load converts the GGUF file again")
