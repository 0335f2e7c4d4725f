"""The decoder's data: its configuration, what it returns (results, statistics, step records, the
traces recorders see), and the per-sequence state of one step (the drafted tree, the verdict,
the frontier stoppers see, the proposals of the proposers). Read by the step engine
(`mcsd_runtime.decode.engine`) and its phases."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from mcsd_runtime import metrics
from mcsd_runtime.constants import BATCH_LAYOUTS, DEFAULT_K_CONFIG, GRAPHS, INITS, VERIFIERS
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.stop.features import (
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
from mcsd_runtime.tree import KConfig, TreeTensors, parse_k_config

if TYPE_CHECKING:  # what the engine reads of the decoder (`Decoding`)
    from mcsd_runtime.decode.graphs import EagerForwards, FixedForwards
    from mcsd_runtime.models.pair import Pair
    from mcsd_runtime.stop.contract import Stopper
    from mcsd_runtime.stop.copy_length import CopyLength
    from mcsd_runtime.stop.width import WidthPolicy
    from mcsd_runtime.tree import Tree


@dataclass(frozen=True)
class DecodeConfig:
    k_config: KConfig = DEFAULT_K_CONFIG  # () decodes autoregressively; "4,1/1": see KConfig
    init: str = "draft"  # "target": the paper's target-initialized first layer (lossy)
    temperature: float = 0.0  # 0 = greedy
    verify: str = "mcss"  # sampling verifier: mcss | mcss-replacement | naive
    max_new_tokens: int = 128
    seed: int = 0
    profile: bool = False  # on a GPU, synchronize around forwards to time them
    commit_limit: int | None = None  # commit at most this many tokens a step (dense collection)
    eos_token_ids: tuple[int, ...] | None = None  # None: the target's generation config's
    # batches: "max" drafts every row as deep as the batch goes (free in a padded forward),
    # "row" gives each row the tree its own stopper chooses, as if decoded alone
    batch_depth: str = "max"
    # batches: "ragged" forwards process each row's own tokens only, packed into one sequence
    # (`mcsd_runtime.decode.ragged`: a row that drafts or verifies less costs less), "padded"
    # every row to the batch's widest (the reference); batches of one are the same either way
    batch_layout: str = "padded"
    # prompt lookup (`mcsd_runtime.decode.lookup`): up to `lookup` tokens copied from the
    # context where its last lookup_min_ngram..lookup_max_ngram tokens occurred before; a step
    # with such a match verifies them instead of asking the stopper (0: off); unless the tree's
    # first `lookup` depths are a chain, the copied chain is verified on a chain tree of its own
    # (in a batch, beside the other rows' trees)
    lookup: int = 0
    lookup_min_ngram: int = 3
    lookup_max_ngram: int = 4
    # forwards of fixed shape over preallocated caches, replayed as CUDA graphs
    # (`mcsd_runtime.decode.graphs`): "auto" on CUDA, "off" eager (the reference path), "on"
    # everywhere (on a CPU the fixed-shape path runs without capture)
    graphs: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "k_config", parse_k_config(self.k_config))
        if self.init not in INITS:
            raise MCSDError(f"unknown init {self.init!r}: use 'draft' (lossless) or 'target'")
        if self.init == "target" and not self.k_config:
            raise MCSDError("init='target' needs a non-empty k-config, e.g. (4, 2, 2, 1)")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise MCSDError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if self.eos_token_ids is not None:
            object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        if self.verify not in VERIFIERS:
            raise MCSDError(f"unknown verifier {self.verify!r}: use one of "
                            f"{', '.join(VERIFIERS)}")
        if self.graphs not in GRAPHS:
            raise MCSDError(f"unknown graphs {self.graphs!r}: use one of {', '.join(GRAPHS)}")
        if self.batch_depth not in ("max", "row"):
            raise MCSDError(f"unknown batch_depth {self.batch_depth!r}: use 'max' or 'row'")
        if self.batch_layout not in BATCH_LAYOUTS:
            raise MCSDError(f"unknown batch_layout {self.batch_layout!r}: use one of "
                            f"{', '.join(BATCH_LAYOUTS)}")
        if self.commit_limit is not None and (self.commit_limit < 1 or self.init == "target"):
            raise MCSDError("commit_limit must be >= 1 and needs init='draft'")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise MCSDError(
                f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.lookup:
            self._check_lookup()

    def _check_lookup(self) -> None:
        if self.lookup < 0:
            raise MCSDError(f"lookup must be >= 0 (0: off), got {self.lookup}")
        if not self.k_config:
            raise MCSDError("prompt lookup copies beside a draft tree: give a k-config (a chain "
                            "such as 1,1,1,1,1,1 with the stopper 'none' copies with the target "
                            "alone)")
        if self.init != "draft":
            raise MCSDError("prompt lookup needs init='draft' (lossless)")
        if not 1 <= self.lookup_min_ngram <= self.lookup_max_ngram:
            raise MCSDError(f"lookup n-gram sizes must satisfy 1 <= min <= max, got "
                            f"{self.lookup_min_ngram} and {self.lookup_max_ngram}")

    @property
    def lossless(self) -> bool:
        return self.init == "draft"


@dataclass
class StepRecord:
    drafted: int  # depths drafted (s)
    accepted: int  # drafted tokens accepted (L)
    committed: int  # tokens committed this step (after EOS / max_new_tokens clipping)
    tree_size: int  # nodes the target verified
    target_cache: int  # cache lengths after the step
    draft_cache: int
    target_pending: int  # committed tokens not yet in each cache
    draft_pending: int
    copied: bool = False  # the tree was a prompt-lookup chain (`drafted` its length), no draft


@dataclass
class DecodeStats:
    """Counts and times of one generation. Forward times are exact on CPU; on a GPU they are
    only measured with `DecodeConfig(profile=True)`, which synchronizes around each forward."""

    new_tokens: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    wall_time: float = 0.0
    prefill_time: float = 0.0  # of wall_time: the prompt's forwards, before the first step
    target_time: float = 0.0
    draft_time: float = 0.0
    acceptance_sum: float = 0.0  # sum over drafting steps of accepted / drafted depth
    drafting_steps: int = 0
    lookup_steps: int = 0  # steps that verified a prompt-lookup chain (drafting no forward)
    forwards: str = "eager"  # how the forwards ran: eager, fixed (shapes) or captured (graphs)

    @property
    def tau(self) -> float:
        return metrics.tau(self.new_tokens, self.target_calls)

    @property
    def acceptance_rate(self) -> float:
        return metrics.acceptance_rate(self.acceptance_sum, self.drafting_steps)

    @property
    def tokens_per_s(self) -> float:
        return metrics.throughput(self.new_tokens, self.wall_time)

    @property
    def decode_time(self) -> float:
        """Seconds after the prefill: what stoppers can change, and what replay models."""
        return self.wall_time - self.prefill_time

    @property
    def forward_fraction(self) -> float:
        return (self.target_time + self.draft_time) / self.wall_time if self.wall_time else 0.0

    def as_dict(self) -> dict:
        return asdict(self) | {"tau": self.tau, "acceptance_rate": self.acceptance_rate,
                               "tokens_per_s": self.tokens_per_s,
                               "forward_fraction": self.forward_fraction}


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str | None
    steps: list[StepRecord]
    stats: DecodeStats
    lossless: bool


@dataclass
class StepTrace:
    """What a recorder sees after each step (device tensors; rows are nodes 1..tree_size)."""

    step: int
    tokens: torch.Tensor  # [1 + c] root then nodes
    node_features: torch.Tensor  # [c, len(NODE_FEATURES)]
    trajectory: list[float]  # trajectory feature values before the step
    target_prob: torch.Tensor  # [c] p_target(x) at the parent
    draft_prob: torch.Tensor  # [c] q(x) at the parent (the proposing distribution)
    hidden: torch.Tensor | None  # [c, H] draft hidden state that proposed each node, if asked
    path: list[int]  # accepted node indices, root-first
    accepted: int
    drafted: int
    row: int = 0  # the prompt's index in a batched call (0 for one sequence)


class Recorder(Protocol):
    """What the decoder calls after every step (e.g. `collect.recorder.RowRecorder`)."""

    needs_hidden: bool  # the trace carries the draft's hidden states

    def on_step(self, trace: StepTrace) -> None: ...


@dataclass
class RowState:
    committed: list[int]
    n_prompt: int
    t_pending: list[int]
    d_pending: list[int]
    root_probs: torch.Tensor | None = None  # target-init: target distribution at the root
    trajectory: Trajectory = field(default_factory=Trajectory)
    done: bool = False
    generator: torch.Generator | None = None  # this sequence's randomness
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
        if self._host is None:
            to_host_together([self])
        return self._host

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
    tt: TreeTensors | None = None  # the tree it lies on (a copied chain's own, or the draft's)
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


def to_host_together(layers: list[DraftLayer]) -> None:
    """Every layer's `host()` rows in one device-to-host copy."""
    rows = [layer.host_rows() for layer in layers]
    host = to_host(torch.cat(rows) if len(rows) > 1 else rows[0])  # sync: one copy for all
    at = 0
    for layer, r in zip(layers, rows, strict=True):
        layer._host, at = host[at : at + r.shape[0]], at + r.shape[0]


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


def causal_bias(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive [n, n] causal mask: 0 on and below the diagonal, dtype-min above."""
    hidden = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    return torch.zeros(n, n, dtype=dtype, device=device).masked_fill_(
        hidden, torch.finfo(dtype).min)


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
    forwarded: int = 0  # deepest depth whose nodes went through the draft
    fed: bool = False  # the pending draft tokens went through the draft this step
    copied: list[bool] = field(default_factory=list)  # per row: a prompt-lookup chain
    trees: dict[int, TreeTensors] = field(default_factory=dict)  # row -> its own tree, if not
    # the draft's (a copied chain's, a cut width's)
    refeed: bool = False  # a feature draft: accepted nodes go in again, with the target's states
    ragged: bool = False  # depth forwards took only the rows still drafting
    reach: list[int] = field(default_factory=list)  # per row: drafted depth (>= verified depth)

    def seen(self, i: int) -> int:
        """The deepest of row i's depths whose nodes went through the draft and stay in its
        cache (ragged: a row's depth d went through exactly when it drafted past d)."""
        if self.copied[i] or self.refeed:
            return 0
        if not self.ragged:
            return self.forwarded
        drafted = self.reach[i] if self.reach else self.depths[i]
        return max(0, min(self.forwarded, drafted - 1))

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
    recorder: Recorder | None
    forwards: EagerForwards | FixedForwards  # eager, or fixed shapes captured as CUDA graphs
    needs_hidden: bool  # the stopper or the recorder reads draft hidden states
    eos: set[int]
    sync_forwards: bool  # synchronize around forwards to time them (a GPU, profile=True)
    copy_length: CopyLength | None  # a learned prompt-lookup copy length
    width: WidthPolicy | None  # a learned width of the first depth (`mcsd_runtime.stop.width`)
    widths: dict[int, TreeTensors]  # the first depth cut to w < k candidates, by w

    def probs(self, logits: torch.Tensor) -> torch.Tensor: ...

    def causal_block(self, n: int) -> torch.Tensor: ...
