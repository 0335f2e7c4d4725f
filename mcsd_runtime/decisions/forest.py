"""A LightGBM model evaluated as tensor operations, on whatever device its features live.

`TensorForest.load(model.txt)` reads LightGBM's text model format (numeric splits: the features
a stopper reads) into padded per-tree arrays. `forest(x)` walks every tree for every row at
once: one gather and one comparison per tree level, `max_depth` times, then the leaves' values
summed over trees, and the objective's link applied (sigmoid for `binary` and
`cross_entropy`). That way a decision scores nodes where the draft's distributions already are,
with no host round trip, and a CUDA graph can capture it. The split rule is LightGBM's (`x <=
threshold` goes left, in float64), with its reading of inputs (a value within 1e-35 of zero is
0) and its missing-value rules: for missing type `NaN`, a NaN takes the default side; for
`Zero`, a NaN or a zero does; for `None`, NaN is read as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mcsd_runtime.errors import MCSDError

_ZERO = 1.0000000180025095e-35  # LightGBM's kZeroThreshold, the float 1e-35f
_MISSING = {0: "none", 1: "zero", 2: "nan"}


@dataclass
class _Tree:
    feature: list[int]
    threshold: list[float]
    decision: list[int]
    left: list[int]
    right: list[int]
    leaf: list[float]


def _parse(text: str) -> tuple[str, list[_Tree]]:
    """The objective and the trees of a LightGBM text model."""
    objective, trees = "", []
    block: dict[str, list[str]] | None = None
    for line in text.splitlines() + [""]:
        if line.startswith("objective="):
            objective = line.split("=", 1)[1].split()[0]
        elif line.startswith("Tree="):
            block = {}
        elif block is not None and "=" in line:
            key, value = line.split("=", 1)
            block[key] = value.split()
        elif block is not None and not line.strip() and block:
            trees.append(_tree(block))
            block = None
    if not trees:
        raise MCSDError("no trees in this LightGBM model file")
    return objective, trees


def _tree(b: dict[str, list[str]]) -> _Tree:
    if int(b.get("num_cat", ["0"])[0]):
        raise MCSDError("categorical splits are not supported on the device: retrain without "
                        "categorical features")
    ints = lambda key: [int(v) for v in b.get(key, [])]  # noqa: E731
    return _Tree(ints("split_feature"), [float(v) for v in b.get("threshold", [])],
                 ints("decision_type"), ints("left_child"), ints("right_child"),
                 [float(v) for v in b["leaf_value"]])


class TensorForest:
    """A LightGBM model's trees as padded tensors (see the module docstring)."""

    def __init__(self, objective: str, trees: list[_Tree],
                 device: torch.device | str = "cpu") -> None:
        self.objective = objective
        t, m = len(trees), max(1, max(len(tr.feature) for tr in trees))
        lv = max(len(tr.leaf) for tr in trees)
        pad = lambda rows, width, fill: [r + [fill] * (width - len(r)) for r in rows]  # noqa: E731
        self.feature = torch.tensor(pad([tr.feature for tr in trees], m, 0), device=device)
        self.threshold = torch.tensor(pad([tr.threshold for tr in trees], m, 0.0),
                                      dtype=torch.float64, device=device)
        dec = torch.tensor(pad([tr.decision for tr in trees], m, 0), device=device)
        self.default_left = (dec & 2) > 0
        self.missing = (dec >> 2) & 3  # 0 none, 1 zero, 2 nan
        # a one-leaf tree starts at its leaf (~0 = -1); children < 0 are leaves ~index
        self.left = torch.tensor(pad([tr.left for tr in trees], m, -1), device=device)
        self.right = torch.tensor(pad([tr.right for tr in trees], m, -1), device=device)
        self.start = torch.tensor([0 if tr.feature else -1 for tr in trees], device=device)
        self.leaf = torch.tensor(pad([tr.leaf for tr in trees], lv, 0.0), dtype=torch.float64,
                                 device=device)
        self.depth = max(_depth(tr) for tr in trees)
        self.trees = torch.arange(t, device=device)

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu") -> TensorForest:
        objective, trees = _parse(Path(path).read_text())
        return cls(objective, trees, device)

    def to(self, device: torch.device | str) -> TensorForest:
        out = object.__new__(TensorForest)
        for name, value in vars(self).items():
            setattr(out, name, value.to(device) if isinstance(value, torch.Tensor) else value)
        return out

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """The summed leaf values [rows] for feature rows x [rows, features]."""
        x = x.to(torch.float64)
        x = torch.where(x.abs() <= _ZERO, 0.0, x)  # LightGBM reads such inputs as absent: 0
        node = self.start.expand(x.shape[0], -1).clone()  # [rows, trees]
        rows = torch.arange(x.shape[0], device=x.device)[:, None]
        for _ in range(self.depth):
            at = node.clamp_min(0)
            value = x[rows, self.feature[self.trees, at]]
            missing = self.missing[self.trees, at]
            nan = value.isnan()
            value = torch.where(nan & (missing != 2), 0.0, value)
            default = (nan & (missing == 2)) | ((missing == 1) & (nan | (value.abs() <= _ZERO)))
            left = torch.where(default, self.default_left[self.trees, at],
                               value <= self.threshold[self.trees, at])
            nxt = torch.where(left, self.left[self.trees, at], self.right[self.trees, at])
            node = torch.where(node >= 0, nxt, node)
        return self.leaf[self.trees, ~node].sum(-1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Predictions [rows] as LightGBM's `predict` gives them (the objective's link)."""
        raw = self.raw(x)
        if self.objective in ("binary", "cross_entropy", "xentropy"):
            return torch.sigmoid(raw)
        return raw


def _depth(tree: _Tree) -> int:
    """The number of splits on the tree's longest path from the root to a leaf."""
    if not tree.feature:
        return 0
    best, stack = 0, [(0, 1)]
    while stack:
        node, d = stack.pop()
        best = max(best, d)
        stack += [(c, d + 1) for c in (tree.left[node], tree.right[node]) if c >= 0]
    return best
