"""The step's own records: each row's state, the drafted tree and its layers, the draft phase's
record of every row (`Drafted`), the proposals of the proposers, the verdict, the frontier
stoppers see, and what the engine reads of the decoder (`Decoding`). Read by the step engine
(`mcsd_runtime.decode.engine`) and its phases."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from mcsd_runtime.decisions.features import (
    FEATURE_NAMES,
    TOP_K_MASS,
    TRAJECTORY_FEATURES,
    Trajectory,
    decision_matrix,
    host_nodes,
    node_column,
    node_features,
    with_trajectory,
)
from mcsd_runtime.decode.records import DecodeConfig, DecodeStats, Recorder, StepRecord
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.tree import TreeTensors

if TYPE_CHECKING:  # what the engine reads of the decoder (`Decoding`)
    from mcsd_runtime.decisions.contract import Planner, Stopper
    from mcsd_runtime.decisions.copy_length import CopyLength
    from mcsd_runtime.decisions.width import WidthPolicy
    from mcsd_runtime.decode.graphs import EagerForwards, FixedForwards
    from mcsd_runtime.models.pair import Pair
    from mcsd_runtime.tree import Tree



@dataclass
class RowState:
    committed: list[int]
    n_prompt: int
    t_pending: list[int]
    d_pending: list[int]
    generator: torch.Generator  # this sequence's randomness
    root_probs: torch.Tensor | None = None  # target-init: target distribution at the root
    trajectory: Trajectory = field(default_factory=Trajectory)
    done: bool = False
    stopper: Any = None  # this sequence's stopper (its own copy in a batch)
    copy_history: Any = None  # with a learned copy length: the row's `CopyHistory`
    # a feature draft: the target's state before each pending draft token ([n, H] chunks)
    d_feats: list = field(default_factory=list)


@dataclass
class DraftLayer:
    """The nodes of one tree depth and the distributions that proposed them, one per parent."""

    tokens: torch.Tensor  # [n]
    proposal: torch.Tensor  # [m, V], n = m * k
    proposer_hidden: torch.Tensor | None  # [m, H]: the draft's hidden state at each parent
    prob: torch.Tensor  # [n] q(x) under the node's proposal
    log_path: torch.Tensor  # [n] sum of log q along the path from the root
    top: torch.Tensor | None  # [m, TOP_K_MASS] the proposal's largest probabilities (greedy)
    _node_features: torch.Tensor | None = None  # computed when first asked for
    _host: np.ndarray | None = None

    def node_features(self, static: torch.Tensor) -> torch.Tensor:
        """[n, len(NODE_FEATURES)]; `static` [n, 3] are the nodes' rows of the tree's."""
        if self._node_features is None:
            self._node_features = node_features(static, self.prob, self.log_path, self.proposal,
                                                self.top)
        return self._node_features

    def host(self) -> np.ndarray:
        """The nodes' `host_nodes` rows (the layout `decision_matrix` reads) as a float64 host
        array. One device-to-host copy (`to_host_together` makes one for several layers), and
        no pass over the vocabulary when drafting took the top-k."""
        host = self._host
        if host is None:
            host = to_host_together([self])[0]
        return host

    def host_rows(self) -> torch.Tensor:
        """The nodes' `host_nodes` rows, still on the device."""
        top = self.top
        if top is None:  # sampled or target-initialized candidates
            top = self.proposal.topk(TOP_K_MASS, dim=-1).values
        return host_nodes(self.prob, self.log_path, per_node(top, self.prob.shape[0]))

    def hidden(self) -> torch.Tensor | None:
        """[n, H]: the hidden state that proposed each node, or None if not kept."""
        if self.proposer_hidden is None:
            return None
        return per_node(self.proposer_hidden, self.prob.shape[0])


@dataclass
class Draft:
    """The tree drafted in one step."""

    tokens: torch.Tensor  # [1 + num_nodes]: the root (last committed token), then the nodes
    layers: list[DraftLayer] = field(default_factory=list)  # layers[d - 1] holds depth d
    forwarded: int = 0  # deepest depth whose nodes are in the draft cache
    cache_base: int = 0  # draft cache length where depth-1 nodes start
    copied: bool = False  # a prompt-lookup chain, not drafted
    tt: TreeTensors = field(kw_only=True)  # the tree it lies on (a copied chain's own, or the
    # draft's)
    roots: int = 0  # leading layers the draft did not propose (target-initialized roots)

    @property
    def depth(self) -> int:
        return len(self.layers)

    @property
    def size(self) -> int:
        """Its nodes, the root excluded."""
        return self.tt.tree.cum[self.depth]


@dataclass
class Verdict:
    """What verification decided: the accepted path and the token after it."""

    path: list[int]  # accepted node indices, root-first (target-init: starting with a root)
    accepted: int  # drafted tokens accepted (target-init: the chosen root is not drafted)
    best: int  # the path's last node
    bonus: int  # the target's token after it (unused with target-init)
    tokens: list[int]  # the tree's tokens on the host, root first
    probs: torch.Tensor | None  # per row: the target's distribution after it, when computed
    conf: list[float] | None = None  # the target's top-1 probability at each path node, if asked


def to_host_together(layers: list[DraftLayer]) -> list[np.ndarray]:
    """Every layer's `host()` rows in one device-to-host copy (kept, and returned)."""
    rows = [layer.host_rows() for layer in layers]
    host = to_host(torch.cat(rows) if len(rows) > 1 else rows[0])  # sync: one copy for all
    at, out = 0, []
    for layer, r in zip(layers, rows, strict=True):
        layer._host, at = host[at : at + r.shape[0]], at + r.shape[0]
        out.append(layer._host)
    return out


class DraftFrontier:
    """`stoppers.Frontier` served from the tensors the decoder drafted with. `peers`: the
    layers of every frontier asked at the same time (the rows of a batch), copied to the host
    together when a stopper first reads decision features."""

    def __init__(self, layer: DraftLayer, depth: int, max_depth: int, tt: TreeTensors,
                 trajectory: Trajectory, peers: list[DraftLayer] | None = None) -> None:
        self.depth, self.max_depth = depth, max_depth
        self._layer, self._tt, self._trajectory = layer, tt, trajectory
        self._rows = tt.tree.depth_slice(depth)
        self._peers = peers

    def trajectory(self) -> list[float]:
        return self._trajectory.values()

    def features(self) -> torch.Tensor:
        static = self._tt.static_features[self._rows]
        return with_trajectory(self._layer.node_features(static), self.trajectory())

    def column(self, name: str) -> torch.Tensor:
        if name in TRAJECTORY_FEATURES:
            return self.features()[:, FEATURE_NAMES.index(name)]
        layer = self._layer
        return node_column(name, self._tt.static_features[self._rows], layer.prob,
                           layer.log_path, layer.proposal, layer.top)

    def decision_features(self) -> np.ndarray:
        if self._layer._host is None and self._peers:
            to_host_together(self._peers)
        return decision_matrix(self._tt.static_host[self._rows], self._layer.host(),
                               self.trajectory())

    def hidden(self) -> torch.Tensor:
        hidden = self._layer.hidden()
        if hidden is None:
            raise MCSDError("no draft hidden state for these nodes: a stopper that reads them "
                            "must set needs_hidden = True, and the first layer of a "
                            "target-initialized tree has none (use init='draft')")
        return hidden


def to_host(t: torch.Tensor) -> np.ndarray:
    """A device tensor as a host array (a view on CPU)."""
    return t.detach().cpu().numpy()


def per_node(rows: torch.Tensor, n: int) -> torch.Tensor:
    """Per-parent rows repeated for each of the parent's `n // len(rows)` children."""
    return rows if rows.shape[0] == n else rows.repeat_interleave(n // rows.shape[0], 0)


# ---------------------------------------------------------------- the engine's own records
@dataclass
class Row:
    """One sequence in the batch."""

    index: int  # the prompt's position in the call
    st: RowState
    stats: DecodeStats = field(default_factory=DecodeStats)
    steps: list[StepRecord] = field(default_factory=list)
    admitted: float = 0.0


@dataclass
class Timing:
    """Forward seconds and draft calls of one step (or one admission)."""

    target: float = 0.0
    draft: float = 0.0
    draft_calls: int = 0


@dataclass
class Drafted:
    """Every row's tree after the draft phase."""

    layers: list[list[DraftLayer]]  # per row; layers[i][d - 1] holds depth d
    depths: list[int]  # each row's tree depth: what it verifies
    pending: list[int]  # each row's pending draft tokens at the start of the step
    pending_base: int  # draft cache length before the pending tokens went in
    cache_base: int = 0  # draft cache length where depth-1 nodes start
    depth: int = 0  # the batch's depth (the deepest row's)
    went: list[int] = field(default_factory=list)  # per row: the deepest of its depths whose
    # nodes went through the draft this step (and stay in its cache), whatever the layout
    fed: bool = False  # the pending draft tokens went through the draft this step
    copied: list[bool] = field(default_factory=list)  # per row: a prompt-lookup chain
    trees: dict[int, TreeTensors] = field(default_factory=dict)  # row -> its own tree, if not
    # the draft's (a copied chain's, a cut width's)
    refeed: bool = False  # a feature draft: accepted nodes go in again, with the target's states
    reach: list[int] = field(default_factory=list)  # per row: drafted depth (>= verified depth)

    def seen(self, i: int) -> int:
        """The deepest of row i's depths whose nodes went through the draft and stay in its
        cache: none for a copied chain or where accepted nodes go in again."""
        return 0 if self.copied[i] or self.refeed else self.went[i]

    def take(self, i: int, proposal: Proposal) -> None:
        """Row i verifies `proposal` in place of what the draft gave it."""
        self.layers[i], self.depths[i] = proposal.layers, len(proposal.layers)
        self.copied[i] = proposal.copied
        if proposal.tt is not None:
            self.trees[i] = proposal.tt
        else:  # it lies in the draft's tree, which the target's forward slices to the batch depth
            self.depth = max(self.depth, len(proposal.layers))


@dataclass
class Proposal:
    """One row's tree from a proposer (`mcsd_runtime.decode.proposers`): its layers (the
    tokens, one layer per depth), on its own tree `tt` (None: the draft's), `copied` when it is
    a prompt-lookup chain rather than a draft."""

    layers: list[DraftLayer]
    tt: TreeTensors | None = None
    copied: bool = False


class Decoding(Protocol):
    """What the engine reads of the decoder that runs it (`MCSDDecoder`)."""

    pair: Pair
    config: DecodeConfig
    tree: Tree
    tt: TreeTensors
    chain: TreeTensors | None  # copies' own chain tree (a draft tree of several candidates)
    stopper: Stopper
    planner: Planner | None  # a whole-step planner in place of per-row stoppers (a budget)
    recorder: Recorder | None
    forwards: EagerForwards | FixedForwards  # eager, or fixed shapes captured as CUDA graphs
    needs_hidden: bool  # the stopper, planner or recorder reads draft hidden states
    eos: set[int]
    sync_forwards: bool  # synchronize around forwards to time them (a GPU, profile=True)
    copy_length: CopyLength | None  # a learned prompt-lookup copy length
    width: WidthPolicy | None  # a learned width of the first depth (`mcsd_runtime.decisions.width`)
    widths: dict[int, TreeTensors]  # the first depth cut to w < k candidates, by w

    def probs(self, logits: torch.Tensor) -> torch.Tensor: ...

    def causal_block(self, n: int) -> torch.Tensor: ...
