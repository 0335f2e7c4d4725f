"""The toy corpus: the Python standard library's own `.py` sources, split by file.

Every machine with Python has these files, so the embedded model pair and its prompt sets can be
rebuilt offline. The split is a pure function of each file's path relative to the stdlib root
(a hash bucket), so it does not depend on the seed, the preset or the file system's order:

- `train` (85% of files): the models' training text;
- `eval` (7%): held out; the model card's losses and agreement and the `toy-code` prompts;
- `collect` (8%): held out; the `toy-code-collect` prompts (stopper training data).
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mcsd_runtime.errors import MCSDError

SPLITS = ("train", "eval", "collect")
# Folders left out everywhere: tests, third-party code, and generated tables or prose that are
# not code (codec tables, pydoc's topic dump).
EXCLUDED_PARTS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
     "encodings", "pydoc_data", "__phello__"}
)
MAX_FILE_BYTES = 400_000


@dataclass(frozen=True)
class SourceFile:
    """One stdlib source file: its path relative to the stdlib root and its split."""

    rel: str
    path: Path
    split: str


def stdlib_root() -> Path:
    """The running interpreter's standard-library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_version() -> str:
    """The interpreter version whose stdlib is the corpus (part of the recipe hash)."""
    v = sys.version_info
    return f"{sys.implementation.name}-{v.major}.{v.minor}.{v.micro}"


def split_of(rel: str) -> str:
    """The split of a file, from a hash of its relative path (stable across machines)."""
    bucket = int(hashlib.sha256(rel.encode("utf-8")).hexdigest()[:8], 16) % 100
    if bucket < 85:
        return "train"
    return "eval" if bucket < 92 else "collect"


@lru_cache(maxsize=4)
def _list_files(root: str) -> tuple[SourceFile, ...]:
    base = Path(root)
    files = []
    for path in base.rglob("*.py"):
        rel = path.relative_to(base).as_posix()
        if EXCLUDED_PARTS.intersection(rel.split("/")[:-1]):
            continue
        try:
            if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
                continue
        except OSError:
            continue
        files.append(SourceFile(rel=rel, path=path, split=split_of(rel)))
    return tuple(sorted(files, key=lambda f: f.rel))


def source_files(split: str | None = None, root: Path | None = None) -> list[SourceFile]:
    """The corpus files, sorted by relative path; only those of `split` when given."""
    if split is not None and split not in SPLITS:
        raise MCSDError(f"unknown corpus split {split!r}; use one of {', '.join(SPLITS)}")
    base = root or stdlib_root()
    files = _list_files(str(base))
    if not files:
        raise MCSDError(
            f"no Python sources found under {base}; the toy pair needs the interpreter's "
            "standard-library .py files (some minimal installs strip them)"
        )
    return [f for f in files if split is None or f.split == split]


def read_source(file: SourceFile) -> str:
    """A file's text (UTF-8, undecodable bytes replaced), with a trailing newline."""
    text = file.path.read_bytes().decode("utf-8", errors="replace").replace("\r\n", "\n")
    return text if text.endswith("\n") else text + "\n"


def split_texts(split: str, root: Path | None = None) -> list[str]:
    """The texts of one split's files, in path order."""
    return [read_source(f) for f in source_files(split, root)]
