"""The static shape of a k-config tree and its attention bias, built once per decoder.

Nodes are numbered breadth-first. Index 0 is the *root*: the last committed token, from which
depth 1 grows. Node `j` at depth `d` with local index `i` has parent local index `i // k[d-1]`.
A node sees the context, its ancestors, the root and itself; nothing else of the tree.

The bias is built for the largest tree; a draft depth uses its rows and a verification that stops
at depth `s` uses the top-left `1 + cum[s]` block (the dynamic sliced mask).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from mcsd_runtime.errors import MCSDError


def parse_k_config(spec: str | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """`"4,2,2,1"` or `(4, 2, 2, 1)` -> `(4, 2, 2, 1)`. An empty tuple means autoregressive; a
    string must name at least one depth and no empty one (`""` and `"4,,2"` are refused)."""
    if isinstance(spec, str):
        parts = spec.strip().removeprefix("(").removesuffix(")").split(",")
        if parts and not parts[-1].strip() and len(parts) > 1:
            parts.pop()  # "(4, 2,)": a tuple's trailing comma
        try:
            values = tuple(int(p) for p in parts)
        except ValueError:
            raise MCSDError(
                f"bad k-config {spec!r}: use comma-separated positive integers, e.g. 4,2,2,1 "
                f"(every depth named; for autoregressive decoding use the method ar)"
            ) from None
    else:
        values = tuple(spec)
    if any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in values):
        raise MCSDError(
            f"bad k-config {spec!r}: every entry must be a positive integer, e.g. (4, 2, 2, 1)"
        )
    return values


@dataclass(frozen=True)
class Tree:
    """Topology of the full tree for `k_config`; everything per-step is a slice of this."""

    k_config: tuple[int, ...]
    sizes: tuple[int, ...] = field(init=False)  # nodes per depth, depth 1..D
    cum: tuple[int, ...] = field(init=False)  # cum[d] = nodes in depths 1..d; cum[0] = 0

    def __post_init__(self) -> None:
        sizes = tuple(math.prod(self.k_config[: d + 1]) for d in range(len(self.k_config)))
        cum = [0]
        for n in sizes:
            cum.append(cum[-1] + n)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "cum", tuple(cum))

    @property
    def depth(self) -> int:
        return len(self.k_config)

    @property
    def num_nodes(self) -> int:
        return self.cum[-1]

    def parents(self) -> list[int]:
        """Parent index (0 = root) of every index 0..N; the root's parent is -1."""
        parent = [-1]
        for d, k in enumerate(self.k_config, start=1):
            for i in range(self.sizes[d - 1]):
                parent.append(0 if d == 1 else 1 + self.cum[d - 2] + i // k)
        return parent

    def depths(self) -> list[int]:
        return [0] + [d for d in range(1, self.depth + 1) for _ in range(self.sizes[d - 1])]

    def sibling_ranks(self) -> list[int]:
        return [0] + [
            i % k for d, k in enumerate(self.k_config, 1) for i in range(self.sizes[d - 1])
        ]

    def ancestors(self) -> list[list[int]]:
        """For each index, its ancestors-or-self excluding the root, root-first (the path)."""
        parent = self.parents()
        paths: list[list[int]] = [[]]
        for j in range(1, self.num_nodes + 1):
            paths.append(paths[parent[j]] + [j])
        return paths

    def depth_slice(self, d: int) -> slice:
        """Indices (root = 0) of the nodes at depth `d`."""
        return slice(1 + self.cum[d - 1], 1 + self.cum[d])


@dataclass
class TreeTensors:
    """Device tensors derived from a `Tree`, built once per decoder and only sliced afterwards."""

    tree: Tree
    parent: torch.Tensor  # [N+1] long, root's parent clamped to 0
    depth: torch.Tensor  # [N+1] long
    sibling_rank: torch.Tensor  # [N+1] long
    path_matrix: torch.Tensor  # [N+1, N+1] bool: path_matrix[j, a] = a on the path to j (a >= 1)
    bias: torch.Tensor  # [N+1, N+1] additive attention bias: 0 visible, dtype-min hidden
    score: torch.Tensor  # [N+1] deeper first, then lower index; the root scores 0
    static_features: torch.Tensor  # [N+1, 3] float32: depth, sibling rank, frontier size
    paths: list[list[int]]  # host copy of path_matrix rows
    depths: list[int]  # host copy of depth
    static_host: np.ndarray  # host copy of static_features, float64

    @classmethod
    def build(cls, tree: Tree, device: torch.device, dtype: torch.dtype) -> TreeTensors:
        n = tree.num_nodes + 1
        paths = tree.ancestors()
        path_matrix = torch.zeros(n, n, dtype=torch.bool)
        for j, path in enumerate(paths):
            path_matrix[j, path] = True
        visible = path_matrix.clone()
        visible[:, 0] = True  # everyone sees the root
        bias = torch.zeros(n, n, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)
        parent = torch.tensor(tree.parents()).clamp_(min=0)
        depth = torch.tensor(tree.depths())
        score = depth * (n + 1) - torch.arange(n)
        score[0] = 0
        frontier = torch.tensor([0] + [n_d for n_d in tree.sizes for _ in range(n_d)])
        static = torch.stack([depth, torch.tensor(tree.sibling_ranks()), frontier], -1).float()
        return cls(
            tree=tree,
            parent=parent.to(device),
            depth=depth.to(device),
            sibling_rank=torch.tensor(tree.sibling_ranks(), device=device),
            path_matrix=path_matrix.to(device),
            bias=bias.to(device),
            score=score.to(device),
            static_features=static.to(device),
            paths=paths,
            depths=tree.depths(),
            static_host=static.double().numpy(),
        )
