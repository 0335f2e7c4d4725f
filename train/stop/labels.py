"""Training labels for the decision "after drafting depth d, draft depth d+1?".

The decision is worth it exactly when the accepted path reaches depth d+1, i.e. L > d. Drafting
d+1 pays off *through* one frontier node: the one on the accepted path. So a frontier node x at
depth d is labelled

- hard: `on_accepted_path(x) and accepted_length > d` - x is accepted and so is one of its
  children. At most one frontier node is positive, so P(L > d) is the sum of the node
  probabilities (the `sum` aggregation);
- soft: `prod(soft_label(a) for a on the path to x) * max(soft_label(c) for c child of x)` - the
  same event with each acceptance replaced by its probability min(1, p/q).

Rows at a step's deepest drafted depth take no decision (nothing deeper can be drafted) and are
not training examples.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from mcsd_runtime.decisions.features import TRAJECTORY_FEATURES, Trajectory
from mcsd_runtime.pricing.step_model import step_outcome
from replay.runs import SEQUENCE_KEY, sequence_ids

DEPTH = "depth"  # the node-feature column
_KEY = [*SEQUENCE_KEY, "step"]


def add_labels(df: pd.DataFrame) -> pd.DataFrame:
    """`label_hard`, `label_soft` and `decision` (the row is a decision point) columns."""
    df = df.copy()
    depth = df[DEPTH].to_numpy().astype(np.int64)
    df["label_hard"] = (df["on_accepted_path"].to_numpy().astype(bool)
                        & (df["accepted_length"].to_numpy() > depth)).astype(np.float32)
    df["decision"] = depth < df["drafted_depth"].to_numpy()
    soft = df["soft_label"].to_numpy().astype(np.float64).clip(0, 1)
    # path product of soft labels, depth by depth through the parent's row
    # run/prompt/step, built column-wise (a row-wise join takes seconds on 30k rows)
    parts = [df[c].astype(str) for c in _KEY]
    joined = parts[0]
    for part in parts[1:]:
        joined = joined + "/" + part
    key = joined.to_numpy()
    node = df["node"].to_numpy().astype(np.int64)
    parent = df["parent"].to_numpy().astype(np.int64)
    index = pd.Series(np.arange(len(df)), index=pd.MultiIndex.from_arrays([key, node]))
    path = soft.copy()
    for d in range(2, int(depth.max()) + 1 if len(df) else 1):
        rows = np.nonzero(depth == d)[0]
        parent_rows = index.reindex(pd.MultiIndex.from_arrays([key[rows], parent[rows]]))
        path[rows] = soft[rows] * path[parent_rows.to_numpy()]
    # best child's soft label
    child = pd.DataFrame({"key": key, "parent": parent, "soft": soft})
    best = child.groupby(["key", "parent"])["soft"].max()
    best_child = best.reindex(pd.MultiIndex.from_arrays([key, node])).fillna(0.0).to_numpy()
    df["label_soft"] = (path * best_child).astype(np.float32)
    return df



def walk_trajectory(df: pd.DataFrame) -> pd.DataFrame:
    """Trajectory features of a dense greedy collection, recomputed as a decoder would see them.

    A dense collection commits one token per step, so its stored `prev_accepted` is L at the
    previous position, and L_t >= L_{t-1} - 1 there: a leak no decoder ever sees (a model fitted
    on it scores well on held-out rows and stops badly in replay and end to end). Instead, walk
    the prompt at full depth; a step starting at position t sees the walk's state before the step
    at t, and a position u = t + j strictly inside a walk step is where a stopper that stopped
    the step at t at depth j - 1 (all accepted) would start next: prev_accepted = j - 1, and the
    running mean includes it. Prompts that are not dense keep their stored features.
    """
    df = df.copy()
    key = sequence_ids(df)
    first = df[df[DEPTH] == 1].assign(_key=key)
    walked = np.zeros((len(df), len(TRAJECTORY_FEATURES)))
    done = np.zeros(len(df), dtype=bool)
    pos_all = df["position"].to_numpy()
    for k, g in first.groupby("_key", sort=False):
        g = g.drop_duplicates("position").sort_values("position")
        positions = g["position"].to_numpy()
        if not np.array_equal(positions, np.arange(len(positions))):
            continue  # not dense: keep the stored trajectory
        acc = g["accepted_length"].to_numpy()
        cap = g["drafted_depth"].to_numpy()
        n = len(positions)
        values = np.zeros((n, len(TRAJECTORY_FEATURES)))
        traj, t = Trajectory(), 0
        while t < n:
            values[t] = traj.values()
            full = step_outcome(int(acc[t]), int(cap[t]))
            for j in range(1, min(full.accepted, n - 1 - t) + 1):
                stopped = step_outcome(int(acc[t]), j - 1)  # all accepted: commits j tokens
                after = replace(traj)
                after.update(stopped.accepted, stopped.committed, stopped.depth)
                values[t + j] = after.values()
            traj.update(full.accepted, full.committed, full.depth)
            t += full.committed
        rows = np.nonzero((key == k).to_numpy())[0]
        walked[rows] = values[pos_all[rows]]
        done[rows] = True
    for i, name in enumerate(TRAJECTORY_FEATURES):
        df.loc[done, name] = walked[done, i].astype(df[name].dtype)
    return df
