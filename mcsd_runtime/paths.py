"""Where things live.

- Built models (the toy pairs) go to a per-user cache, as Hugging Face caches hub models:
  `$MCSD_CACHE`, else `$XDG_CACHE_HOME/mcsd`, else `~/.cache/mcsd`; a pair built once is found
  from any directory.
- Runs (collections, evaluations) go where `--out` points, by default under `$MCSD_DATA/runs`
  (`MCSD_DATA` defaults to `./data`, the repository's git-ignored folder).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from mcsd_runtime.errors import MCSDError

CACHE_HELP = "$MCSD_CACHE, else $XDG_CACHE_HOME/mcsd, else ~/.cache/mcsd"

T = TypeVar("T")


def cache_root() -> Path:
    """The per-user cache of built models (see the module docstring)."""
    if os.environ.get("MCSD_CACHE"):
        return Path(os.environ["MCSD_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "mcsd"


def data_root() -> Path:
    return Path(os.environ.get("MCSD_DATA", "data")).expanduser()


def models_dir() -> Path:
    """Where toy pairs are built: `<cache>/models`."""
    return cache_root() / "models"


def runs_dir() -> Path:
    """The default parent of run folders: `$MCSD_DATA/runs`."""
    return data_root() / "runs"


def short_model_name(name: str | None) -> str:
    """A model folder's last two parts (`toy-tiny-abc/target`) for titles; a hub name as is."""
    path = Path(str(name))
    return "/".join(path.parts[-2:]) if path.is_absolute() else str(name)


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB chunks (cards, cache checks)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tmp_beside(dest: Path, what: str, remedy: str) -> Path:
    """A fresh, writable temporary folder next to `dest`, where `what` is built before it is
    renamed into place. MCSDError if that location is not writable: `cannot write WHAT to DEST:
    WHY; REMEDY`."""
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        probe = tmp / ".probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        blocker = next((p for p in dest.parents if p.exists()), None)
        why = (f"{blocker} is not a folder" if blocker is not None and not blocker.is_dir()
               else err.strerror or str(err))
        raise MCSDError(f"cannot write {what} to {dest}: {why}; {remedy}") from None
    return tmp


def install_folder(staging: Path, dest: Path, what: str = "the finished build",
                   keep: Callable[[Path], bool] | None = None) -> None:
    """Rename the complete folder `staging` to `dest`, so that `dest` never holds half a build.

    Without `keep`, whatever is at `dest` (a folder or a file) is replaced: it is moved aside,
    `staging` renamed into place, then the old one deleted; if the rename fails the old one is
    put back. With `keep`, an empty folder at `dest` is replaced, and if the rename fails
    because `keep(dest)` holds (another process finished the same build first) that folder is
    kept. `staging` is removed on failure; MCSDError `cannot move WHAT to DEST: WHY`.
    """
    old = None
    try:
        if keep is not None and dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()
        elif keep is None and (dest.exists() or dest.is_symlink()):
            old = dest.parent / f".{dest.name}.old-{os.getpid()}"
            _remove(old)
            os.replace(dest, old)
        os.replace(staging, dest)
    except OSError as err:
        if old is not None and old.exists() and not dest.exists():
            os.replace(old, dest)
        _remove(staging)
        if keep is None or not keep(dest):
            raise MCSDError(f"cannot move {what} to {dest}: {err}") from None
        return
    if old is not None:
        _remove(old)


def build_folder(dest: Path, what: str, remedy: str, build: Callable[[Path], T],
                 keep: Callable[[Path], bool] | None = None) -> T:
    """`build(staging)` writes a folder into a fresh staging folder beside `dest` (`tmp_beside`,
    whose MCSDError names `remedy`), which then replaces `dest` (`install_folder`); returns what
    `build` returns. The staging folder is removed whatever happens."""
    staging = tmp_beside(dest, what, remedy)
    try:
        result = build(staging)
        install_folder(staging, dest, what, keep)
    finally:
        _remove(staging)
    return result


def _remove(path: Path) -> None:
    """Delete a folder tree or a file, if there (errors ignored)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def read_card_file(root: str | Path, name: str, fmt: str, kind: str,
                   broken: Callable[[str | Path, str], str]) -> dict:
    """The JSON card `name` of a built folder, whose `format` must be `fmt` (MCSDError naming
    the fix, `broken(root, what)`, if missing, unreadable or another kind of card)."""
    path = Path(root) / name
    try:
        card = json.loads(path.read_text())
    except FileNotFoundError:
        raise MCSDError(broken(root, f"{name} is missing")) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MCSDError(broken(root, f"{name} is unreadable ({err})")) from None
    if not isinstance(card, dict) or card.get("format") != fmt:
        raise MCSDError(broken(root, f"{name} is not a {kind} card"))
    return card


def check_files(root: Path, card: dict, broken: Callable[[str | Path, str], str]) -> None:
    """Every file the card lists is in `root` with its SHA-256 (MCSDError, `broken(root, what)`,
    otherwise)."""
    files = card.get("files")
    if not isinstance(files, dict) or not files:
        raise MCSDError(broken(root, "the card lists no files"))
    for rel, digest in sorted(files.items()):
        path = root / rel
        if not path.is_file():
            raise MCSDError(broken(root, f"{rel} is missing"))
        if file_sha256(path) != digest:
            raise MCSDError(broken(root, f"{rel} does not match its checksum"))


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
