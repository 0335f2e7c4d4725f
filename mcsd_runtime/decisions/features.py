"""The one definition of the stopper features, imported by the decoder, collect and train.

Node features describe one drafted node and the distribution that proposed it (its parent's
next-token distribution, already computed to draft it), so a stopper can decide whether to
forward the frontier and draft one more depth *before* paying for that forward. They depend
only on the tree, so collected rows store them. Trajectory features describe the run so
far (previous step's accepted length, a running mean); replay recomputes them along its own
trajectory, so they are kept apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mcsd_runtime.transfer import upload

SCHEMA_VERSION = 4  # 3 was an experiment that never shipped
TOP_K_MASS = 4  # top-k mass of the proposing distribution uses this k

NODE_FEATURES: tuple[str, ...] = (
    "depth",  # 1-based depth of the node
    "sibling_rank",  # rank among its siblings (0 = most likely under the draft)
    "frontier_size",  # nodes at this depth
    "draft_prob",  # q(x): probability of the node's token under the proposing distribution
    "log_path_prob",  # sum of log q along the path from the root
    "q_top1",  # top-1 probability of the proposing distribution
    "q_top2",
    "q_margin",  # top1 - top2
    "q_entropy",  # entropy (nats) of the proposing distribution
    "q_topk_mass",  # mass of its TOP_K_MASS most likely tokens
)
TRAJECTORY_FEATURES: tuple[str, ...] = (
    "tokens_generated",  # new tokens committed before this step
    "prev_accepted",  # accepted length of the previous step (0 at the first step)
    "accept_rate",  # this sequence's per-token acceptance so far (see Trajectory)
    "accept_rate_recent",  # the same over the last few steps (decay RECENT_DECAY per step)
)
FEATURE_NAMES: tuple[str, ...] = NODE_FEATURES + TRAJECTORY_FEATURES
# What learned stoppers read: every feature that drafting already computed (the top-k pass that
# picks greedy candidates gives q_top1, q_top2, q_margin and q_topk_mass). Entropy is left out:
# it needs one more pass over the whole vocabulary at every decision (the costliest feature by
# far: ~10x a softmax over the same row at 32k-152k tokens).
DECISION_FEATURES: tuple[str, ...] = tuple(n for n in FEATURE_NAMES if n != "q_entropy")
# Named subsets a learned stopper can be trained on (`mcsd train --features`); "node" leaves the
# run's history out, so the model decides from the draft alone.
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "all": DECISION_FEATURES,
    "node": tuple(n for n in DECISION_FEATURES if n not in TRAJECTORY_FEATURES),
}


def parse_feature_set(text: str) -> tuple[str, ...]:
    """A named set of FEATURE_SETS, or comma-separated names of DECISION_FEATURES, in the
    schema's order (MCSDError names the unknown ones and the choices)."""
    from mcsd_runtime.errors import MCSDError

    if text in FEATURE_SETS:
        return FEATURE_SETS[text]
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in DECISION_FEATURES]
    if not names or unknown:
        raise MCSDError(f"features {text!r}: unknown {', '.join(unknown) or '(none given)'}; use "
                        f"{' or '.join(FEATURE_SETS)} or comma-separated names of "
                        f"{', '.join(DECISION_FEATURES)}")
    return tuple(n for n in DECISION_FEATURES if n in names)


def node_features(static: torch.Tensor, draft_prob: torch.Tensor, log_path_prob: torch.Tensor,
                  parent_probs: torch.Tensor, top: torch.Tensor | None = None) -> torch.Tensor:
    """Node features for the `n` nodes of one depth, as a float32 [n, len(NODE_FEATURES)] tensor.

    `static` [n, 3] holds depth, sibling rank and frontier size (fixed by the tree);
    `parent_probs` [m, V] are the proposing distributions, one per parent; the n = m * k nodes
    are the parents' children in order; `top` [m, TOP_K_MASS], their largest probabilities when
    the caller already has them (greedy drafting picks candidates with the same top-k pass).
    A handful of tensor ops: this runs at every depth.
    """
    if top is None:
        top = parent_probs.topk(TOP_K_MASS, dim=-1).values
    entropy = torch.special.entr(parent_probs).sum(-1)
    stats = torch.stack([top[:, 0], top[:, 1], top[:, 0] - top[:, 1], entropy, top.sum(-1)], -1)
    k = draft_prob.shape[0] // parent_probs.shape[0]
    if k > 1:
        stats = stats.repeat_interleave(k, 0)
    return torch.cat([static, draft_prob[:, None], log_path_prob[:, None], stats], -1).float()


def node_column(name: str, static: torch.Tensor, draft_prob: torch.Tensor,
                log_path_prob: torch.Tensor, parent_probs: torch.Tensor,
                top: torch.Tensor | None = None) -> torch.Tensor:
    """One column of `node_features` ([n] float32, the same values), computed alone: only
    `q_entropy` makes a pass over the vocabulary."""
    if name == "draft_prob":
        return draft_prob.float()
    if name == "log_path_prob":
        return log_path_prob.float()
    if name in ("depth", "sibling_rank", "frontier_size"):
        return static[:, NODE_FEATURES.index(name)].float()
    i = NODE_FEATURES.index(name)  # a statistic of the proposing distribution
    if name == "q_entropy":
        value = torch.special.entr(parent_probs).sum(-1)
    else:
        if top is None:
            top = parent_probs.topk(TOP_K_MASS, dim=-1).values
        value = {"q_top1": top[:, 0], "q_top2": top[:, 1], "q_margin": top[:, 0] - top[:, 1],
                 "q_topk_mass": top.sum(-1)}[NODE_FEATURES[i]]
    k = draft_prob.shape[0] // parent_probs.shape[0]
    return (value.repeat_interleave(k, 0) if k > 1 else value).float()


# Prior of the acceptance rates, in pseudo-counts (accepted, tried): 0.5, worth two drafted tokens.
ACCEPT_PRIOR = (1.0, 2.0)
RECENT_DECAY = 0.7  # accept_rate_recent: a step's weight decays by this factor per later step


@dataclass
class Trajectory:
    """Running state behind the trajectory features; updated once per step.

    The acceptance rates count, over the sequence's drafted tokens, how many the target accepted
    out of those it judged: a step that accepted L of `drafted` depths judged L + 1 of them if
    one was rejected (L < drafted) and L if all were accepted. A stopper that drafts shallow
    therefore does not read its own caution as low acceptance (a step that stopped at depth 2
    with both accepted counts 2 of 2), so the rates mean the same under any stopper, the
    collection's full-depth one included. A step that drafted nothing leaves both as they were.
    Both start from ACCEPT_PRIOR.
    """

    tokens_generated: int = 0
    prev_accepted: int = 0
    steps: int = 0
    accepted: float = 0.0
    tried: float = 0.0
    recent_accepted: float = 0.0
    recent_tried: float = 0.0

    def values(self) -> list[float]:
        a0, n0 = ACCEPT_PRIOR
        return [float(self.tokens_generated), float(self.prev_accepted),
                (self.accepted + a0) / (self.tried + n0),
                (self.recent_accepted + a0) / (self.recent_tried + n0)]

    def update(self, accepted: int, committed: int, drafted: int) -> None:
        """A step drafted `drafted` depths, `accepted` of them were accepted, and it committed
        `committed` tokens."""
        tried = accepted + (accepted < drafted)
        self.tokens_generated += committed
        self.prev_accepted = accepted
        self.steps += 1
        if not drafted:  # nothing was tried: both rates stay as they were
            return
        self.accepted += accepted
        self.tried += tried
        self.recent_accepted = RECENT_DECAY * self.recent_accepted + accepted
        self.recent_tried = RECENT_DECAY * self.recent_tried + tried


def with_trajectory(node_feats: torch.Tensor, trajectory: Sequence[float]) -> torch.Tensor:
    """The full [n, len(FEATURE_NAMES)] matrix: node features, then the trajectory features'
    values (`Trajectory.values()`) on every row."""
    traj = upload(trajectory, node_feats.device, node_feats.dtype)
    return torch.cat([node_feats, traj.expand(node_feats.shape[0], -1)], dim=-1)


def column(name: str) -> int:
    """Column index of a feature in the full matrix."""
    return FEATURE_NAMES.index(name)


# ------------------------------------------------------------------ the decision-feature layout
# Where each DECISION_FEATURES column comes from, named once here. The decoder serves a decision
# from the tree's static rows and one host copy per depth (`host_nodes`); replay serves it from
# the collected NODE_FEATURES rows (`decision_from_nodes`); both fill the same columns.
STATIC_FEATURES: tuple[str, ...] = ("depth", "sibling_rank", "frontier_size")  # fixed by the tree
# What `host_nodes` packs per node, in order: these node features, then the TOP_K_MASS largest
# probabilities of the proposing distribution (q_top1, q_top2, q_margin and q_topk_mass follow).
HOST_FEATURES: tuple[str, ...] = ("draft_prob", "log_path_prob")
HOST_TOP = slice(len(HOST_FEATURES), len(HOST_FEATURES) + TOP_K_MASS)  # host columns of top-k


def _span(names: Sequence[str]) -> slice:
    """The DECISION_FEATURES columns of `names`, which lie side by side in that order."""
    start = DECISION_FEATURES.index(names[0])
    assert DECISION_FEATURES[start:start + len(names)] == tuple(names), names
    return slice(start, start + len(names))


DECISION_STATIC = _span(STATIC_FEATURES)
DECISION_HOST = _span(HOST_FEATURES)
DECISION_TOP2 = _span(("q_top1", "q_top2"))
DECISION_MARGIN = DECISION_FEATURES.index("q_margin")
DECISION_TOPK_MASS = DECISION_FEATURES.index("q_topk_mass")
DECISION_TRAJECTORY = _span(TRAJECTORY_FEATURES)
DECISION_NODE_FEATURES: tuple[str, ...] = tuple(n for n in DECISION_FEATURES
                                                if n in NODE_FEATURES)
DECISION_NODE = _span(DECISION_NODE_FEATURES)
# NODE_FEATURES columns of DECISION_NODE_FEATURES, in order (replay's stored node rows)
NODE_TO_DECISION: list[int] = [NODE_FEATURES.index(n) for n in DECISION_NODE_FEATURES]
# the aggregations read the path probability at one index in either matrix
assert column("log_path_prob") == DECISION_FEATURES.index("log_path_prob")


def host_nodes(prob: torch.Tensor, log_path: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """[n, len(HOST_FEATURES) + TOP_K_MASS]: what a depth's `n` nodes need on the host for a
    decision (`decision_matrix`): q(x), the log path probability, then `top` [n, TOP_K_MASS],
    the largest probabilities of each node's proposing distribution."""
    return torch.cat([prob[:, None], log_path[:, None], top], 1)


def decision_matrix(static: np.ndarray, node: np.ndarray, trajectory: list[float]) -> np.ndarray:
    """The DECISION_FEATURES of one depth's `n` nodes as a float64 [n, F] host array, from
    `static` [n, 3] (STATIC_FEATURES) and `node`, the host rows of `host_nodes`."""
    top = node[:, HOST_TOP]
    out = np.empty((node.shape[0], len(DECISION_FEATURES)))
    out[:, DECISION_STATIC] = static
    out[:, DECISION_HOST] = node[:, :HOST_TOP.start]
    out[:, DECISION_TOP2] = top[:, :2]
    out[:, DECISION_MARGIN] = top[:, 0] - top[:, 1]
    out[:, DECISION_TOPK_MASS] = top.sum(1)
    out[:, DECISION_TRAJECTORY] = trajectory
    return out


def decision_from_nodes(nodes: np.ndarray, trajectory: list[float]) -> np.ndarray:
    """The DECISION_FEATURES of `n` nodes as a float64 [n, F] array, from their stored
    NODE_FEATURES rows [n, len(NODE_FEATURES)] (collected rows, as replay serves them)."""
    out = np.empty((nodes.shape[0], len(DECISION_FEATURES)))
    out[:, DECISION_NODE] = nodes[:, NODE_TO_DECISION]
    out[:, DECISION_TRAJECTORY] = trajectory
    return out
