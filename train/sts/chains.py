"""What an STS table is fitted on: per drafting step, the draft's chain of confidence logits and
whether each prefix of it was accepted, as [n, gamma] arrays (`Samples`), read from our
collections (`collection_samples`) or from DSpark's captured shards (`shard_samples`).

**Our collections** hold one row per drafted node. A step's *chain* is the draft's own path:
its depth-1 node of sibling rank 0, then at each next depth the sibling-rank-0 child of the node
chosen before, as deep as the step drafted (on a chain tree, every node). Position j's logit is
`confidence_logit` of the draft probability of the chain's node at depth j; its target is 1 when
the chain's nodes at depths 1..j are all on the accepted path. A step that drafted fewer than
gamma positions lacks the rest (`valid`). Engine traces (one row per verify step) say how many
tokens a step accepted, not how confident the draft was of each: they cannot be calibrated.

**DSpark's shards** (SGLang's and TensorRT-LLM's calibration capture) are `torch.save`d dicts
with `logits` and `prefix_mask`, both [n, gamma]: the confidence head's logits and whether the
first j + 1 drafted tokens were all accepted; every position of every sample is valid.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcsd_runtime.decisions.sts import check_arrays, confidence_logits
from mcsd_runtime.errors import MCSDError

STEP = ["run_id", "prompt_id", "step"]  # the columns naming one drafting step
CHAIN_COLUMNS = (*STEP, "node", "parent", "depth", "sibling_rank", "draft_prob",
                 "on_accepted_path")
DENSE = ("collect a dense collection of a chain: `mcsd collect --dense --k-config "
         "1,1,1,1,1,1 --out DIR`")


@dataclass
class Samples:
    """[n, gamma] confidence logits, valid positions and prefix targets, and each sample's
    group (its prompt, or the sample itself for shards: the held-out split keeps a group
    whole)."""

    logits: np.ndarray
    valid: np.ndarray
    prefix_mask: np.ndarray
    groups: np.ndarray

    @property
    def gamma(self) -> int:
        return int(self.logits.shape[1])

    def take(self, rows: np.ndarray) -> Samples:
        """The samples at `rows` (a boolean mask or indices)."""
        return Samples(self.logits[rows], self.valid[rows], self.prefix_mask[rows],
                       self.groups[rows])


def chain_arrays(rows, gamma: int | None = None):
    """The draft's chain of every step of collected `rows` (module docstring): [n, gamma]
    logits, valid positions and prefix targets, and the steps (a DataFrame of run_id,
    prompt_id, step, in the order they first appear). `gamma` cuts deeper chains (None: the
    deepest)."""
    missing = [c for c in CHAIN_COLUMNS if c not in rows.columns]
    if missing:
        raise MCSDError(f"the collected rows lack columns {missing}: {DENSE}")
    levels = _chain_levels(rows, gamma)
    steps = levels[0][STEP].drop_duplicates().reset_index(drop=True)
    numbered = steps.assign(_sample=np.arange(len(steps)))
    shape = (len(steps), len(levels))
    logits, valid, accepted = np.zeros(shape), np.zeros(shape, bool), np.zeros(shape, bool)
    for j, level in enumerate(levels):
        at = level.merge(numbered, on=STEP, how="left")["_sample"].to_numpy()
        logits[at, j] = confidence_logits(level["draft_prob"].to_numpy())
        valid[at, j] = True
        accepted[at, j] = level["on_accepted_path"].astype(bool).to_numpy()
    prefix = np.logical_and.accumulate(accepted & valid, axis=1)
    return logits, valid, prefix.astype(np.float64), steps


def _chain_levels(rows, gamma: int | None) -> list:
    """The chain's rows at depths 1, 2, ... (a frame each), up to `gamma` depths."""
    rows = rows.assign(depth=rows["depth"].round().astype("int64"),
                       sibling_rank=rows["sibling_rank"].round().astype("int64"))
    top = rows[rows["sibling_rank"] == 0]
    link = top[(top["depth"] == 1) & (top["parent"] == 0)]
    levels: list = []  # frames
    while not link.empty and (gamma is None or len(levels) < gamma):
        levels.append(link)
        below = top[top["depth"] == len(levels) + 1]
        parents = link[[*STEP, "node"]].rename(columns={"node": "parent"})
        link = below.merge(parents, on=[*STEP, "parent"])
    if not levels:
        raise MCSDError(f"the collected rows hold no drafted step (no depth-1 node): {DENSE}")
    return levels


def collection_samples(runs: list[Path], gamma: int | None) -> tuple[Samples, list[dict]]:
    """The samples of collected runs (each step's chain, grouped by prompt), and what each run
    was; MCSDError for engine traces and runs not drafted deep enough for `gamma`."""
    from replay.runs import load_runs, prompt_groups

    for run in runs:
        _refuse_traces(Path(run))
    rows, manifests = load_runs(list(runs))
    logits, valid, prefix, steps = chain_arrays(rows, gamma)
    if gamma is not None and logits.shape[1] < gamma:
        raise MCSDError(f"--gamma {gamma}: the collections' chains reach {logits.shape[1]} "
                        f"draft position(s); collect with a deeper --k-config or pass --gamma "
                        f"{logits.shape[1]}")
    group, _ = prompt_groups(rows)
    of_step = rows[STEP].assign(_group=group.to_numpy()).drop_duplicates(STEP)
    groups = steps.merge(of_step, on=STEP, how="left")["_group"].to_numpy(dtype=object)
    sources = [{"path": m.get("path"), "kind": "collection", "k_config": m.get("k_config")}
               for m in manifests]
    return Samples(logits, valid, prefix, groups), sources


def _refuse_traces(run: Path) -> None:
    """MCSDError for an engine trace folder (manifest.json `"kind": "engine-trace"`)."""
    try:
        manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # load_runs says what is wrong with it
    if isinstance(manifest, dict) and manifest.get("kind") == "engine-trace":
        raise MCSDError(f"{run} is an engine trace (one row per verify step, without the "
                        f"draft's per-token probabilities): a per-position calibration needs "
                        f"each drafted token's confidence; {DENSE}")


def shard_samples(pattern: str, gamma: int | None) -> tuple[Samples, list[dict]]:
    """The samples of DSpark's shards matching the glob `pattern` (each sample its own
    group), and each shard's path and sample count; MCSDError naming a shard that is
    unreadable or of the wrong shape."""
    paths = sorted(glob.glob(str(Path(pattern).expanduser())))
    if not paths:
        raise MCSDError(f"--from-shards {pattern!r} matches no file: pass a glob of the .pt "
                        f"shards SGLang or TensorRT-LLM captured (quote it for the shell)")
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    sources = []
    for path in paths:
        logits, mask = _read_shard(path)
        if parts and logits.shape[1] != parts[0][0].shape[1]:
            raise MCSDError(f"shard {path} has gamma {logits.shape[1]}, the shards before it "
                            f"{parts[0][0].shape[1]}: fit one engine configuration at a time")
        parts.append((logits, mask))
        sources.append({"path": path, "kind": "dspark-shard", "samples": len(logits)})
    logits = np.concatenate([p[0] for p in parts])
    mask = np.concatenate([p[1] for p in parts])
    if gamma is not None and gamma != logits.shape[1]:
        raise MCSDError(f"--gamma {gamma}: the shards hold gamma {logits.shape[1]}, and the "
                        f"engine refuses a table of another length; leave --gamma out")
    valid = np.ones(logits.shape, bool)
    logits, valid, mask = check_arrays(logits, valid, mask, f"--from-shards {pattern}")
    return Samples(logits, valid, mask, np.arange(len(logits)).astype(object)), sources


def _read_shard(path: str) -> tuple[np.ndarray, np.ndarray]:
    """A shard's `logits` and `prefix_mask` as [n, gamma] float64 arrays."""
    import torch

    try:
        shard = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unreadable file: the same error
        raise MCSDError(f"cannot read shard {path} ({type(err).__name__}: {err}): pass .pt "
                        f"shards of DSpark's calibration capture") from None
    if not isinstance(shard, dict) or not {"logits", "prefix_mask"} <= set(shard):
        raise MCSDError(f"shard {path} is not a dict with 'logits' and 'prefix_mask' tensors "
                        f"(keys: {sorted(shard) if isinstance(shard, dict) else type(shard)})")
    arrays = []
    for key in ("logits", "prefix_mask"):
        value = shard[key]
        if not isinstance(value, torch.Tensor) or value.ndim != 2:
            raise MCSDError(f"shard {path}: {key} must be an [n, gamma] tensor, got "
                            f"{getattr(value, 'shape', type(value).__name__)}")
        arrays.append(value.detach().to(torch.float64).numpy())
    if arrays[0].shape != arrays[1].shape:
        raise MCSDError(f"shard {path}: logits {tuple(arrays[0].shape)} and prefix_mask "
                        f"{tuple(arrays[1].shape)} differ in shape")
    return arrays[0], arrays[1]


def split_groups(groups: np.ndarray, test_frac: float, seed: int) -> np.ndarray:
    """Whether each sample is held out: a seeded `test_frac` of the groups (at least one, and
    at least one left to fit on), no group on both sides."""
    unique = sorted(set(groups.tolist()), key=str)
    if len(unique) < 2:
        raise MCSDError(f"the data hold {len(unique)} prompt(s): the calibration needs at least "
                        f"2, some to fit on and some held out to report on")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(unique))
    n_test = min(len(unique) - 1, max(1, round(test_frac * len(unique))))
    test = {unique[i] for i in order[:n_test]}
    return np.array([g in test for g in groups.tolist()], dtype=bool)
