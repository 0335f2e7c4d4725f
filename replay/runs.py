"""Loading collected runs for training: rows as one DataFrame, manifests, labels, the split."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from mcsd_runtime.decisions.features import FEATURE_NAMES, SCHEMA_VERSION
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts.chat import combine_formats
from mcsd_runtime.tree import KConfig, parse_k_config

NEEDED = ("run_id", "prompt_id", "step", "position", "node", "parent", "init",
          "on_accepted_path", "accepted_length", "drafted_depth", "soft_label", *FEATURE_NAMES)


def load_runs(run_dirs: Sequence[str | Path], hidden: bool = False,
              ) -> tuple[pd.DataFrame, list[dict]]:
    """All rows of the given collection runs and their manifests. Uses `collect.load_rows` when
    the collect package provides it, else reads the runs' Parquet files directly."""
    frames, manifests = [], []
    for run in run_dirs:
        run = Path(run)
        if not run.is_dir():
            raise MCSDError(f"no collection run at {run}: pass folders written by `mcsd collect`")
        df, manifest = _load_one(run, hidden)
        if df.empty:
            raise MCSDError(f"collection run {run} has no rows")
        frames.append(df)
        manifests.append(manifest)
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    check_rows(df, hidden)
    return df, manifests


def _load_one(run: Path, hidden: bool) -> tuple[pd.DataFrame, dict]:
    mpath = run / "manifest.json"
    try:
        manifest = json.loads(mpath.read_text()) if mpath.is_file() else {}
    except (OSError, ValueError) as err:
        raise MCSDError(f"cannot read {mpath}: {err}") from None
    load_rows: Callable[..., pd.DataFrame] | None = None
    if manifest.get("format") == "mcsd-collect-run":  # a run of `mcsd collect`
        try:
            from collect import load_rows
        except ImportError:
            load_rows = None
    if load_rows is not None:
        df = load_rows(run)
    else:  # any folder of Parquet files with the row schema
        files = sorted(run.rglob("*.parquet"))
        if not files:
            raise MCSDError(f"collection run {run} has no Parquet row files")
        df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    manifest = dict(manifest)
    manifest.setdefault("path", str(run))
    if load_rows is not None:
        manifest["output_lengths"] = _output_lengths(run)
    if not hidden and "hidden" in df.columns:
        df = df.drop(columns=["hidden"])
    return df, manifest


def _output_lengths(run: Path) -> dict[str, int]:
    """Prompt id -> tokens the decoder committed, from a collect run's shard metadata."""
    from collect.store import iter_metas, scan_shards

    return {m["id"]: int(m["new_tokens"]) for m in iter_metas(scan_shards(run))}


def output_lengths(manifests: list[dict]) -> dict[str, int]:
    """Sequence id (`sequence_ids`) -> the decoder's output length, for the runs that recorded
    it (`load_runs` reads it from a collect run's shards). Replay needs it: an output that ends
    in EOS one token before the budget looks, from its rows alone, like a budget-capped one."""
    return {f"{m.get('run_id')}/{pid}": n for m in manifests
            for pid, n in (m.get("output_lengths") or {}).items()}


def check_rows(df: pd.DataFrame, hidden: bool = False) -> None:
    missing = [c for c in NEEDED if c not in df.columns]
    if missing:
        raise MCSDError(f"collected rows lack columns {missing}: collect them with this version "
                        f"of the toolkit (feature schema {SCHEMA_VERSION})")
    if hidden and "hidden" not in df.columns:
        raise MCSDError("--model mlp-hidden needs hidden states: collect with hidden states "
                        "enabled (the `hidden` column)")


def pair_fingerprint(manifests: list[dict]) -> dict | None:
    """The runs' common pair fingerprint; MCSDError if the runs come from different pairs."""
    prints = [p for m in manifests if (p := m.get("pair") or m.get("pair_fingerprint"))]
    if not prints:
        return None
    keys = ("target_config", "draft_config", "tokenizer")
    first = prints[0]
    for p in prints[1:]:
        if any(p.get(k) != first.get(k) for k in keys):
            raise MCSDError("the runs passed to --runs come from different model pairs; train one "
                            "stopper per pair")
    return first


def collected_k_config(manifests: list[dict]) -> KConfig | None:
    """The runs' common k-config (None when no manifest records one); MCSDError if the runs
    were collected with different trees."""
    configs = {parse_k_config(m["k_config"]) for m in manifests if m.get("k_config")}
    if len(configs) > 1:
        shown = " and ".join(sorted(map(str, configs)))
        raise MCSDError(f"the runs passed to --runs were collected with different k-configs "
                        f"({shown}); train one stopper per k-config")
    return configs.pop() if configs else None


def collected_prompt_format(manifests: list[dict]) -> dict:
    """How the runs' prompts reached the model (`mcsd_runtime.prompts.chat`): chat, text, or
    mixed when the runs differ; a manifest without the field is text. MCSDError for runs
    formatted with different chat templates."""
    return combine_formats(m.get("prompt_format") for m in manifests)


SEQUENCE_KEY = ("run_id", "prompt_id")  # the columns naming one decoded sequence


def sequence_ids(df: pd.DataFrame) -> pd.Series:
    """`run_id/prompt_id`: the key of one decoded sequence (a prompt within one run)."""
    run, prompt = (df[c].astype(str) for c in SEQUENCE_KEY)
    return run + "/" + prompt


def sequence_parts(key: str) -> tuple[str, str]:
    """(run_id, prompt_id) of a `sequence_ids` key (prompt ids may hold `/`, run ids do not)."""
    run, _, prompt = key.partition("/")
    return run, prompt


def prompt_groups(df: pd.DataFrame) -> tuple[pd.Series, int]:
    """What the train/validation/test split groups rows by, and how many prompts fell back.

    The group is the prompt itself (`prompt_hash`, a hash of its token ids), so two runs over the
    same prompts cannot put one prompt in two splits. Rows collected before the column existed
    (row schema 1) fall back to their run and prompt id; the count says how many such prompts.
    """
    seq = sequence_ids(df)
    if "prompt_hash" not in df.columns:
        return seq, int(seq.nunique())
    hashes = df["prompt_hash"]
    missing = hashes.isna() | (hashes.astype(str) == "")
    return hashes.astype(str).where(~missing, seq), int(seq[missing].nunique())


def split_prompts(groups: pd.Series, val_frac: float, test_frac: float,
                  seed: int) -> dict[str, np.ndarray]:
    """Boolean row masks train/val/test; every prompt lies in exactly one split."""
    uniq = np.array(sorted(groups.unique()))
    if len(uniq) < 3:
        raise MCSDError(f"need at least 3 prompts to split train/validation/test, got {len(uniq)}")
    rng = np.random.default_rng(seed)
    rng.shuffle(uniq)
    n_test = max(1, round(test_frac * len(uniq)))
    n_val = max(1, round(val_frac * len(uniq)))
    if n_test + n_val >= len(uniq):
        n_test = n_val = 1
    test, val = set(uniq[:n_test]), set(uniq[n_test:n_test + n_val])
    g = groups.to_numpy()
    is_test = np.isin(g, list(test))
    is_val = np.isin(g, list(val))
    return {"train": ~(is_test | is_val), "val": is_val, "test": is_test}
