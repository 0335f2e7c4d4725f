"""A run folder on disk: Parquet shards of whole prompts plus `manifest.json`.

    run_dir/
      manifest.json                 configuration, ordered prompt ids, counts, summary, timings
      train-000012-r001.parquet     rows of a group of whole prompts, written by rank 1; the
                                    number is the index of the group's first prompt. The
                                    `train-` prefix is what lets `datasets.load_dataset("parquet",
                                    data_dir=run_dir)` take the shards as its train split and
                                    leave manifest.json alone
      empty-000020-r000.json        a group of prompts that drafted no node at all (datasets
                                    cannot read a Parquet file without rows): its metadata only
      .tmp-*                        a write in progress (ignored; removed at the next start)
      .collect.lock                 held while a job writes to the folder (see run_lock)

Every file is written under a temporary name in the same folder, flushed to disk, then renamed
into place, so a reader (or a resumed run) sees a shard either whole or not at all. A prompt
is done exactly when the shard holding it exists; each shard's Parquet metadata lists its
prompts and their decoding statistics, which is all a resume or a summary needs.

manifest.json fields:
  format "mcsd-collect-run", run_id, status (running | complete | incomplete), created, updated
  identity (a resumed run must match all of them; see IDENTITY_FIELDS):
    pair (the runtime's Pair.fingerprint: target, draft, target_config, draft_config,
    tokenizer), pair_weights {target, draft} (checksums of a few weight tensors), dtype,
    k_config, init, temperature, verify, max_new_tokens, seed, dense, save_hidden,
    feature_schema_version, row_schema_version, feature_names, prompt_set, limit,
    prompt_ids (the ordered ids; rows are keyed by prompt_id), prompt_format (how the prompts
    reached the model: {"format": "chat" | "text" | "mixed", "template_hash"},
    mcsd_runtime.prompts.chat; a manifest without it is text)
  chat (the --chat setting that gave prompt_format)
  counts {prompts, prompts_done, rows, steps, new_tokens, target_calls, shards}
  summary {tau, mean_accepted, acceptance_rate, accepted_length_histogram {"L": steps}}
  timings {decode_seconds, rows_per_decode_s, wall_seconds}
  sessions [{started, finished, wall_seconds, world_size, device, prompts, rows, rows_per_s}]
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts.chat import recorded_format

MANIFEST = "manifest.json"
FORMAT = "mcsd-collect-run"
TMP_PREFIX = ".tmp-"
SHARD_GLOB = "train-*.parquet"
SHARD_RE = re.compile(r"^train-(\d{6,})-r(\d{3,})\.parquet$")
META_KEY = b"mcsd_collect"
EMPTY_RE = re.compile(r"^empty-(\d{6,})-r(\d{3,})\.json$")
LOCK = ".collect.lock"

# Fields of the manifest that define what the rows mean: a resumed run must match them all.
IDENTITY_FIELDS = (
    "format", "pair", "pair_weights", "dtype", "k_config", "init", "temperature", "verify",
    "max_new_tokens", "seed", "dense", "save_hidden", "feature_schema_version",
    "row_schema_version", "feature_names", "prompt_set", "limit", "prompt_ids", "prompt_format",
)
# Those of them fixed by the toolkit's version rather than by the job's options.
SCHEMA_FIELDS = ("format", "feature_schema_version", "row_schema_version", "feature_names")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def shard_name(first_index: int, rank: int) -> str:
    return f"train-{first_index:06d}-r{rank:03d}.parquet"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_shard(path: Path, table: pa.Table, meta: dict[str, Any]) -> None:
    """Write `table` to `path` atomically, with `meta` (JSON) in the Parquet key-value metadata."""
    schema = table.schema.with_metadata((table.schema.metadata or {})
                                        | {META_KEY: json.dumps(meta).encode()})
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    with open(tmp, "wb") as f:
        pq.write_table(table.replace_schema_metadata(schema.metadata), f, compression="zstd")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_empty_marker(path: Path, meta: dict[str, Any]) -> None:
    """Record a group of prompts without rows (`path` is its shard path)."""
    m = SHARD_RE.match(path.name)
    name = f"empty-{m.group(1)}-r{m.group(2)}.json"
    atomic_write_bytes(path.with_name(name), json.dumps(meta).encode())


def shard_paths(run_dir: Path) -> list[Path]:
    return sorted(p for p in Path(run_dir).glob(SHARD_GLOB) if SHARD_RE.match(p.name))


def shard_meta(path: Path) -> dict[str, Any]:
    try:
        meta = pq.read_schema(path).metadata or {}
        return json.loads(meta[META_KEY])
    except (OSError, KeyError, ValueError, pa.ArrowException) as err:
        raise MCSDError(f"shard {path} is unreadable or not written by mcsd collect ({err}); "
                        f"move it out of the run folder and rerun to collect its prompts again"
                        ) from None


def scan_shards(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Shard file name -> its metadata (prompt indices/ids, per-prompt statistics, rank)."""
    shards = {p.name: shard_meta(p) for p in shard_paths(run_dir)}
    for p in sorted(Path(run_dir).glob("empty-*.json")):
        if EMPTY_RE.match(p.name):
            try:
                shards[p.name] = json.loads(p.read_text(encoding="utf-8"))
            except (OSError, ValueError) as err:
                raise MCSDError(f"{p} is unreadable ({err}); move it out of the run folder and "
                                f"rerun to collect its prompts again") from None
    return shards


def done_indices(shards: dict[str, dict[str, Any]]) -> set[int]:
    done: set[int] = set()
    for name, meta in shards.items():
        idx = set(meta["prompt_indices"])
        if done & idx:
            raise MCSDError(f"shard {name} repeats prompts held by another shard; the run folder "
                            f"was modified by hand or by two runs at once")
        done |= idx
    return done


def clean_temp_files(run_dir: Path) -> list[str]:
    removed = []
    for p in Path(run_dir).glob(f"{TMP_PREFIX}*"):
        if p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p.name)
    return removed


# --- manifest ---------------------------------------------------------------------------------


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    atomic_write_bytes(Path(run_dir) / MANIFEST, json.dumps(manifest, indent=2).encode())


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise MCSDError(f"cannot read {path}: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise MCSDError(f"{path} is not the manifest of an mcsd collect run")
    return manifest


def load_manifest(run_dir: str | Path) -> dict[str, Any]:
    """The manifest of a collect run folder (see `collect.store` and the README for fields)."""
    manifest = read_manifest(Path(run_dir))
    if manifest is None:
        raise MCSDError(f"{run_dir} is not a collect run folder: it has no {MANIFEST}")
    return manifest


def _describe(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def check_folder(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise MCSDError(f"--out {run_dir} exists and is not a folder")


def check_compatible(run_dir: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The folder's existing manifest, after checking that it was collected with `identity`;
    None for a new (missing or empty) folder. Raises MCSDError naming the first difference."""
    run_dir = Path(run_dir)
    check_folder(run_dir)
    manifest = read_manifest(run_dir) if run_dir.is_dir() else None
    if manifest is None:
        if run_dir.is_dir():
            others = [p.name for p in run_dir.iterdir()
                      if not p.name.startswith((TMP_PREFIX, LOCK))]
            if others:
                raise MCSDError(f"--out {run_dir} is not empty and holds no collect run "
                                f"(found {', '.join(sorted(others)[:3])}); choose a new folder")
        return None
    for key in IDENTITY_FIELDS:
        old, new = _comparable(key, manifest.get(key)), _comparable(key, identity.get(key))
        if old == new:
            continue
        if key == "prompt_ids":
            o, n = old or [], new or []
            first = next((i for i in range(min(len(o), len(n))) if o[i] != n[i]),
                         min(len(o), len(n)))
            detail = (f"{len(old or [])} stored prompt ids vs {len(new or [])} now, first "
                      f"difference at position {first}")
        elif key in ("pair", "pair_weights"):
            diff = sorted(k for k in set(old or {}) | set(new or {})
                          if (old or {}).get(k) != (new or {}).get(k))
            detail = (f"{', '.join(diff)} differ: stored {_describe({k: old.get(k) for k in diff})}"
                      f", now {_describe({k: new.get(k) for k in diff})}")
        else:
            detail = f"stored {_describe(old)}, now {_describe(new)}"
        fix = ("this version of the toolkit cannot add rows to it (its rows still load); choose "
               "another --out" if key in SCHEMA_FIELDS else
               "Rerun with the stored configuration to resume it, or choose another --out")
        raise MCSDError(f"run folder {run_dir} was collected with a different {key} ({detail}); "
                        f"nothing was changed. {fix}")
    return manifest


def _comparable(key: str, value):
    """The pair's names are how it was given (a relative folder, a hub name); its identity is
    in the config, tokenizer and weight hashes, so a run resumes from another directory."""
    if key == "pair" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in ("target", "draft")}
    if key == "prompt_format":  # a manifest written before the field: raw text prompts
        return recorded_format(value)
    return value


# --- the lock of a job writing to the folder ----------------------------------------------------

_HELD: set[Path] = set()  # folders whose lock this process holds


@contextlib.contextmanager
def run_lock(run_dir: str | Path) -> Iterator[None]:
    """Hold `run_dir`'s lock (creating the folder) while a job writes to it; MCSDError at once if
    another live job holds it. A lock left by a job that was killed (its process is gone from
    this host) is taken over. Re-entrant within a process; a folder this call created is
    removed again if the job leaves it empty."""
    run_dir = Path(run_dir)
    check_folder(run_dir)
    key = run_dir.resolve()
    if key in _HELD:
        yield
        return
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        _acquire(run_dir / LOCK)
    except BaseException as err:
        if created:
            _remove_if_empty(run_dir)
        if isinstance(err, OSError):
            raise MCSDError(f"cannot lock the run folder {run_dir}: {err}") from None
        raise
    _HELD.add(key)
    try:
        yield
    finally:
        _HELD.discard(key)
        _release(run_dir / LOCK)
        if created:
            _remove_if_empty(run_dir)


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _acquire(path: Path) -> None:
    text = json.dumps(_me() | {"started": now()})
    for _ in range(3):
        if _create_exclusive(path, text):
            return
        holder = _read_lock(path)
        if holder is not None and _alive(holder):
            raise MCSDError(
                f"run folder {path.parent} is in use by another collect job (pid "
                f"{holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}); "
                f"wait for it to finish or choose another --out. If that job is not running, "
                f"delete {path} and rerun")
        if holder is not None:
            _take_over(path, holder)
    raise MCSDError(f"could not take the lock {path}: other jobs keep taking it; run one job per "
                    f"run folder")


def _take_over(path: Path, dead: dict[str, Any]) -> None:
    """Remove `path` if it still holds the `dead` job's lock. Moved aside in one atomic rename
    and read there, so that of two jobs taking over at once, neither deletes the lock the other
    just took (checking, then deleting, would); a live lock moved aside is put back."""
    aside = path.with_name(f"{path.name}.stale.{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:  # another job moved it first
        return
    try:
        if _read_lock(aside) != dead:  # a new holder's lock: restore it
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)
    finally:
        aside.unlink(missing_ok=True)


def _create_exclusive(path: Path, text: str) -> bool:
    """Create `path` holding `text` unless it exists; readers never see it half written."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _read_lock(path: Path) -> dict[str, Any] | None:
    """The lock's holder; None if the lock is gone. MCSDError if it is not a lock."""
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise MCSDError(f"cannot read the lock {path} ({err}); if no collect job is writing to "
                        f"{path.parent}, delete it and rerun") from None
    pid = holder.get("pid") if isinstance(holder, dict) else None
    if not isinstance(pid, int) or pid <= 0:
        raise MCSDError(f"{path} is not a collect lock; if no collect job is writing to "
                        f"{path.parent}, delete it and rerun")
    return holder


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the holder's process may still run: certain only on this host. A lock naming
    this very process is stale (a previous process with the same pid), as `_HELD` was checked."""
    if holder.get("host") != socket.gethostname():
        return True
    if holder["pid"] == os.getpid():
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _release(path: Path) -> None:
    try:
        holder = _read_lock(path)
    except MCSDError:
        return
    if holder is not None and {k: holder.get(k) for k in ("pid", "host")} == _me():
        path.unlink(missing_ok=True)


def _remove_if_empty(run_dir: Path) -> None:
    with contextlib.suppress(OSError):  # not empty
        run_dir.rmdir()


# --- reading rows -----------------------------------------------------------------------------


def load_rows(run_dir: str | Path, columns: Sequence[str] | None = None):
    """All rows of a collect run folder as one pandas DataFrame, ordered by the manifest's
    prompt order, then step, then node (so a resumed run reads exactly like an uninterrupted
    one). `columns` selects columns (default: all)."""
    run_dir = Path(run_dir)
    manifest = load_manifest(run_dir)
    paths = shard_paths(run_dir)
    key = ["prompt_id", "step", "node"]
    cols = None if columns is None else list(dict.fromkeys([*columns, *key]))
    if not paths:
        from collect.schema import row_schema

        schema = row_schema(manifest.get("save_hidden", False))
        empty = schema.empty_table().to_pandas()
        return empty if columns is None else empty[list(columns)]
    try:
        table = pa.concat_tables(pq.read_table(p, columns=cols) for p in paths)
    except (pa.ArrowException, OSError) as err:
        raise MCSDError(f"cannot read the shards of {run_dir}: {err}") from None
    df = table.to_pandas()
    order = {pid: i for i, pid in enumerate(manifest.get("prompt_ids", []))}
    df["_order"] = df["prompt_id"].map(order).fillna(len(order)).astype("int64")
    df = df.sort_values(["_order", "step", "node"], kind="stable").reset_index(drop=True)
    df = df.drop(columns="_order")
    return df if columns is None else df[list(columns)]


def iter_metas(shards: dict[str, dict[str, Any]]) -> Iterable[dict[str, Any]]:
    for meta in shards.values():
        yield from meta["prompts"]
