"""A draft model's chain for one request of a serving engine, cut by a stopper: what the
toolkit's proposer class (`mcsd_runtime.serving.vllm_proposer`) runs where it drafts.

`DraftChain` holds one request's draft KV cache and the tokens in it. At each step it is given
the request's context (the engine's committed tokens) and
- keeps the longest prefix of its cache that the context still agrees with (the drafts the
  engine accepted stay; rejected ones are cropped away), feeds the rest of the context, and
- drafts greedily, one token a depth, asking the stopper after each depth whether to draft one
  more (`Stopper.should_continue`, before that token goes through the draft), up to K.

The stopper sees a `ChainFrontier`: the features the toolkit's decoder serves for a chain's
node (depth, q(x), the path's log probability, the proposing distribution's top
probabilities, the run's trajectory), from the same functions (`decisions.features`), so a
stopper trained on the decoder's chain collections reads the same columns here. The engine
verifies what is proposed, so outputs stay the target's whatever is drafted.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mcsd_runtime.backend.compat import cache_kwargs
from mcsd_runtime.decisions.contract import StepStart, Stopper
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
from mcsd_runtime.errors import MCSDError


class ChainFrontier:
    """`contract.Frontier` of a chain's one node at `depth`: its token's probability `prob`
    under `probs` (the proposing distribution, [V]), the path's log probability, the draft's
    hidden state that proposed it (None where not kept)."""

    def __init__(self, depth: int, max_depth: int, probs: torch.Tensor, prob: float,
                 log_path: float, trajectory: list[float],
                 hidden: torch.Tensor | None = None) -> None:
        self.depth, self.max_depth = depth, max_depth
        self._probs = probs[None].float()
        self._top = self._probs.topk(TOP_K_MASS, dim=-1).values
        self._prob = torch.tensor([prob], dtype=torch.float32)
        self._log_path = torch.tensor([log_path], dtype=torch.float32)
        self._static = torch.tensor([[depth, 0, 1]], dtype=torch.float32)
        self._trajectory, self._hidden = trajectory, hidden

    def trajectory(self) -> list[float]:
        return self._trajectory

    def features(self) -> torch.Tensor:
        return with_trajectory(node_features(self._static, self._prob, self._log_path,
                                             self._probs, self._top), self._trajectory)

    def column(self, name: str) -> torch.Tensor:
        if name in TRAJECTORY_FEATURES:
            return self.features()[:, FEATURE_NAMES.index(name)]
        return node_column(name, self._static, self._prob, self._log_path, self._probs,
                           self._top)

    def decision_features(self) -> np.ndarray:
        node = host_nodes(self._prob, self._log_path, self._top).numpy()
        return decision_matrix(self._static.numpy(), node, self._trajectory)

    def hidden(self) -> torch.Tensor:
        if self._hidden is None:
            raise MCSDError("no draft hidden state kept: a stopper that reads it must set "
                            "needs_hidden = True")
        return self._hidden[None]


@dataclass
class DraftChain:
    """One request's draft state: its KV cache and the tokens in it, its own copy of the
    stopper and its trajectory (module docstring)."""

    stopper: Stopper
    cache: Any = None
    tokens: list[int] = field(default_factory=list)
    trajectory: Trajectory = field(default_factory=Trajectory)
    forwards: int = 0  # the draft's forwards so far (a measure of its cost)

    @classmethod
    def start(cls, stopper: Stopper) -> DraftChain:
        """A new request's chain, with its own reset copy of `stopper`."""
        own = copy.copy(stopper)
        own.reset()
        return cls(own)

    def pending(self, context: list[int]) -> int:
        """The context tokens the draft has still to be fed before it can draft (1 at least)."""
        return len(context) - self._kept(context)

    def _kept(self, context: list[int]) -> int:
        """How much of the cache `context` keeps: the prefix they agree on, short of the
        context's last token (fed again where cached: its logits are needed)."""
        return max(min(common_prefix(self.tokens, context), len(context) - 1), 0)

    def observe(self, drafted: int, accepted: int, committed: int) -> None:
        """What the engine did with the last proposal: `drafted` tokens proposed by this chain
        (0: none, or another proposer's), `accepted` of them, `committed` tokens in all. The
        stopper hears every step, (0, 0) where it drafted nothing, as in the toolkit's decoder
        (`decode.accounting`): a skip gate counts those steps to know when to probe again."""
        self.stopper.update(drafted, accepted)
        self.trajectory.update(accepted, committed, drafted)

    def propose(self, model: Any, context: list[int], k: int) -> list[int]:
        """Up to `k` greedy draft tokens continuing `context` (module docstring); none where
        the stopper does not draft this step."""
        if k < 1 or not self.stopper.should_draft(StepStart(k, self.trajectory.values())):
            return []
        probs, hidden = self._sync(model, context)
        drafts: list[int] = []
        log_path = 0.0
        for depth in range(1, k + 1):
            token = int(probs.argmax())
            prob = float(probs[token])
            log_path += float(np.log(max(prob, 1e-30)))
            drafts.append(token)
            if depth == k:
                break
            frontier = ChainFrontier(depth, k, probs, prob, log_path, self.trajectory.values(),
                                     hidden)
            if not self.stopper.should_continue(frontier):
                break
            probs, hidden = self._feed(model, [token])
        return drafts

    def _sync(self, model: Any, context: list[int]) -> tuple[torch.Tensor, Any]:
        """The draft's distribution after `context`: the cache cropped to the prefix the
        context agrees with, the rest fed (the last context token at least)."""
        keep = self._kept(context)
        if keep < len(self.tokens):
            if keep == 0:
                self.cache, self.tokens = None, []
            else:
                self.cache.crop(keep - len(self.tokens))  # negative: tokens removed
                del self.tokens[keep:]
        return self._feed(model, context[keep:])

    @torch.inference_mode()
    def _feed(self, model: Any, tokens: list[int]) -> tuple[torch.Tensor, Any]:
        """Feed `tokens` through the draft; the next token's probabilities ([V], float32) and
        the last hidden state where the stopper reads it."""
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache()
        device = next(model.parameters()).device
        out = model(input_ids=torch.tensor([tokens], device=device),
                    **cache_kwargs(model, self.cache), use_cache=True,
                    output_hidden_states=self.stopper.needs_hidden, logits_to_keep=1)
        self.tokens += tokens
        self.forwards += 1
        hidden = out.hidden_states[-1][0, -1] if self.stopper.needs_hidden else None
        return torch.softmax(out.logits[0, -1].float(), -1), hidden


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return int(np.argmax(np.asarray(a[:n]) != np.asarray(b[:n])))
