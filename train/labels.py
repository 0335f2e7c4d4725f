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

import numpy as np
import pandas as pd

DEPTH = "depth"  # the node-feature column
_KEY = ["run_id", "prompt_id", "step"]


def add_labels(df: pd.DataFrame) -> pd.DataFrame:
    """`label_hard`, `label_soft` and `decision` (the row is a decision point) columns."""
    df = df.copy()
    depth = df[DEPTH].to_numpy().astype(np.int64)
    df["label_hard"] = (df["on_accepted_path"].to_numpy().astype(bool)
                        & (df["accepted_length"].to_numpy() > depth)).astype(np.float32)
    df["decision"] = depth < df["drafted_depth"].to_numpy()
    soft = df["soft_label"].to_numpy().astype(np.float64).clip(0, 1)
    # path product of soft labels, depth by depth through the parent's row
    key = df[_KEY].astype(str).agg("/".join, axis=1).to_numpy()
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

