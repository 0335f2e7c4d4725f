"""The static shape of a k-config tree and its attention bias, built once per decoder.

Nodes are numbered breadth-first. Index 0 is the *root*: the last committed token, from which
depth 1 grows. Node `j` at depth `d` with local index `i` has parent local index `i // k[d-1]`.
A capped depth (`k/cap`) keeps its first `cap` nodes: the children of its parents' likeliest.
A node sees the context, its ancestors, the root and itself; nothing else of the tree.

The bias is built for the largest tree; a draft depth uses its rows and a verification that stops
at depth `s` uses the top-left `1 + cum[s]` block (the dynamic sliced mask).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mcsd_runtime.errors import MCSDError


class KConfig(tuple):
    """A tree's shape: the children of every parent at each depth (the tuple's ints), and
    `caps`, the most nodes kept at each depth (None: all). A capped depth keeps its first nodes
    breadth-first, all the children of its likeliest parents, so `4,1/1,1` drafts four
    candidates and a chain of two under the likeliest only. Written `k` or `k/cap` per depth;
    an uncapped KConfig equals the plain tuple of its ints."""

    caps: tuple[int | None, ...]

    def __new__(cls, ks, caps=None) -> KConfig:
        self = super().__new__(cls, (int(k) for k in ks))
        caps = tuple(caps) if caps is not None else (None,) * len(self)
        if len(caps) != len(self):
            raise MCSDError(f"k-config {tuple(self)} has {len(self)} depths but {len(caps)} caps")
        size, kept = 1, []
        for d, (k, cap) in enumerate(zip(self, caps, strict=True), 1):
            full = size * k
            if cap is not None and cap < full:
                if d == 1 or cap < k or cap % k:
                    raise MCSDError(
                        f"bad k-config cap {k}/{cap} at depth {d}: a cap keeps whole families, "
                        f"so it is a multiple of that depth's children ({k}) below the depth's "
                        f"full size ({full}), and depth 1 takes no cap (write its width)")
                full = cap
            else:
                cap = None
            kept.append(cap)
            size = full
        self.caps = tuple(kept)
        return self

    @property
    def sparse(self) -> bool:
        return any(c is not None for c in self.caps)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, tuple):
            return NotImplemented
        return tuple.__eq__(self, other) and self.caps == getattr(
            other, "caps", (None,) * len(other))

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return tuple.__hash__(self) if not self.sparse else hash((tuple(self), self.caps))

    def __str__(self) -> str:
        return ",".join(str(k) if c is None else f"{k}/{c}" for k, c in zip(self, self.caps,
                                                                           strict=True))

    def __repr__(self) -> str:
        return f"KConfig({str(self)!r})"

    def __reduce__(self):
        return KConfig, (tuple(self), self.caps)

    def json(self) -> list[int] | str:
        """For manifests and artifacts: the list of ints when uncapped (as ever), else the text."""
        return list(self) if not self.sparse else str(self)


def parse_k_config(spec: str | tuple[int, ...] | list[int]) -> KConfig:
    """`"4,2,2,1"`, `(4, 2, 2, 1)` or `"4,1/1,1"` -> a KConfig. An empty one means
    autoregressive; a string must name at least one depth and no empty one (`""` and `"4,,2"`
    are refused)."""
    if isinstance(spec, KConfig):
        return spec
    caps = None
    if isinstance(spec, str):
        parts = spec.strip().removeprefix("(").removesuffix(")").split(",")
        if parts and not parts[-1].strip() and len(parts) > 1:
            parts.pop()  # "(4, 2,)": a tuple's trailing comma
        try:
            pairs = [p.split("/") for p in parts]
            if any(len(p) > 2 for p in pairs):
                raise ValueError
            values = tuple(int(p[0]) for p in pairs)
            caps = tuple(int(p[1]) if len(p) == 2 else None for p in pairs)
        except ValueError:
            raise MCSDError(
                f"bad k-config {spec!r}: use comma-separated positive integers, e.g. 4,2,2,1 "
                f"(every depth named; k/cap keeps at most cap nodes at a depth, e.g. 4,1/1,1; "
                f"for autoregressive decoding use the method ar)"
            ) from None
    else:
        values = tuple(spec)
    if any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in values) or any(
            c is not None and c < 1 for c in caps or ()):
        raise MCSDError(
            f"bad k-config {spec!r}: every entry must be a positive integer, e.g. (4, 2, 2, 1)"
        )
    return KConfig(values, caps)


def k_text(spec) -> str:
    """A k-config as the CLI writes it, `"() (autoregressive)"` when empty."""
    return str(parse_k_config(spec)) or "() (autoregressive)"


@dataclass(frozen=True)
class Tree:
    """Topology of the full tree for `k_config`; everything per-step is a slice of this."""

    k_config: KConfig
    sizes: tuple[int, ...] = field(init=False)  # nodes per depth, depth 1..D
    cum: tuple[int, ...] = field(init=False)  # cum[d] = nodes in depths 1..d; cum[0] = 0

    def __post_init__(self) -> None:
        k_config = parse_k_config(self.k_config)
        object.__setattr__(self, "k_config", k_config)
        sizes, size = [], 1
        for k, cap in zip(k_config, k_config.caps, strict=True):
            size = size * k if cap is None else cap
            sizes.append(size)
        sizes = tuple(sizes)
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

    def parents_with_children(self, d: int) -> int:
        """How many nodes of depth `d - 1` (the root for d = 1) have children at depth `d`: the
        first ones; a capped depth leaves the others leaves."""
        return self.sizes[d - 1] // self.k_config[d - 1]

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
