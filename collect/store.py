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
    prompt_ids (the ordered ids; rows are keyed by prompt_id)
  counts {prompts, prompts_done, rows, steps, new_tokens, target_calls, shards}
  summary {tau, mean_accepted, acceptance_rate, accepted_length_histogram {"L": steps}}
  timings {decode_seconds, rows_per_decode_s, wall_seconds}
  sessions [{started, finished, wall_seconds, world_size, device, prompts, rows, rows_per_s}]
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mcsd_runtime.errors import MCSDError

MANIFEST = "manifest.json"
FORMAT = "mcsd-collect-run"
TMP_PREFIX = ".tmp-"
SHARD_GLOB = "train-*.parquet"
SHARD_RE = re.compile(r"^train-(\d{6,})-r(\d{3,})\.parquet$")
META_KEY = b"mcsd_collect"
EMPTY_RE = re.compile(r"^empty-(\d{6,})-r(\d{3,})\.json$")

# Fields of the manifest that define what the rows mean: a resumed run must match them all.
IDENTITY_FIELDS = (
    "format", "pair", "pair_weights", "dtype", "k_config", "init", "temperature", "verify",
    "max_new_tokens", "seed", "dense", "save_hidden", "feature_schema_version",
    "row_schema_version", "feature_names", "prompt_set", "limit", "prompt_ids",
)


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


def check_compatible(run_dir: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The folder's existing manifest, after checking that it was collected with `identity`;
    None for a new (missing or empty) folder. Raises MCSDError naming the first difference."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise MCSDError(f"--out {run_dir} exists and is not a folder")
    manifest = read_manifest(run_dir) if run_dir.is_dir() else None
    if manifest is None:
        if run_dir.is_dir():
            others = [p.name for p in run_dir.iterdir() if not p.name.startswith(TMP_PREFIX)]
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
        raise MCSDError(
            f"run folder {run_dir} was collected with a different {key} ({detail}); nothing was "
            f"changed. Rerun with the stored configuration to resume it, or choose another --out")
    return manifest


def _comparable(key: str, value):
    """The pair's names are how it was given (a relative folder, a hub name); its identity is
    in the config, tokenizer and weight hashes, so a run resumes from another directory."""
    if key == "pair" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in ("target", "draft")}
    return value


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
