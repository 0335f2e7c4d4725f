"""Proposers: where a step's candidates come from besides the draft's own depths
(`drafting.TreeDrafter`), each behind the interface of Hugging Face's candidate generators:
`propose` supplies candidates, `update` learns from how the step went.

- `PromptLookup` (`DecodeConfig.lookup`): a row whose context repeats itself verifies the tokens
  that followed the repeat as a chain. `plan` chooses them on the host before the forwards (they
  go up with the step's one upload), `propose` puts them in the row's tree in place of a draft,
  `update` tells a learned copy length's history how the step went.
- `WidthCut` (a learned `WidthPolicy`): `propose` cuts each row drafted to depth 1 to the width
  the policy chooses (one host copy for all rows).
- `TargetInit` (`init="target"`, the paper's; NOT lossless): `propose` supplies the first layer
  from the target's own distribution, `update` keeps the distribution after the accepted path
  for the next step's roots.

The engine calls each at a fixed point of its step, in a fixed order, so random draws and host
syncs happen where they always have: `plan` before the upload, the draft's depths, then
`PromptLookup.propose` and `WidthCut.propose`; `TargetInit.update` at a row's commit,
`PromptLookup.update` when the step is accounted for.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from mcsd_runtime.decode import verify as V
from mcsd_runtime.decode.cache import RowCache
from mcsd_runtime.decode.graphs import Forward
from mcsd_runtime.decode.lookup import chain_layers
from mcsd_runtime.decode.state import Draft, DraftLayer, RowState, Verdict
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.lookup import find_match
from mcsd_runtime.lookup import propose as propose_chain
from mcsd_runtime.stop.copy_length import CopyHistory, features

if TYPE_CHECKING:
    from mcsd_runtime.decode.state import Decoding, Drafted, Row, Timing



class Proposer:
    """The interface. `propose(...)` supplies candidates at the proposer's point of the step (its
    arguments are that point's: a row's state, or the step's drafted trees); `update` learns from
    one row's step. Neither returns anything for the engine to branch on."""

    def update(self, st: RowState, draft: Draft, v: Verdict, committed: list[int]) -> None:
        """Learn from a row's step: its tree, its verdict and the tokens it committed."""


class PromptLookup(Proposer):
    """Prompt lookup's chains (`mcsd_runtime.decode.lookup`), of a length `DecodeConfig.lookup`
    caps or a learned copy length (`policy`) chooses; `chain`: the tree a copied chain lies on
    when the draft's first depths are not a chain (`Decoding.chain`); `lo`: 1 when the target
    supplies the first layer (target-init)."""

    def __init__(self, dec: Decoding, beside_draft: bool, lo: int) -> None:
        self.cfg, self.policy, self.chain = dec.config, dec.copy_length, dec.chain
        self.vocab_size, self.lo = dec.pair.vocab_size, lo
        # a learned copy length trained beside a draft weighs copying against the drafted step
        self.beside_draft = beside_draft

    def history(self) -> CopyHistory | None:
        """A new row's copy history, which a learned copy length reads."""
        return self.policy.history() if self.policy else None

    def plan(self, st: RowState, cap: int) -> list[int]:
        """The tokens prompt lookup proposes for a row this step (at most `cap`), or []."""
        cfg, policy = self.cfg, self.policy
        if not cfg.lookup or cap <= 0:
            return []
        if policy is not None:
            match = find_match(st.committed, min(policy.max_copy, cap), policy.min_ngram,
                               policy.max_ngram)
            if match is None:
                return []
            feats = features(match, len(st.committed), st.n_prompt, st.copy_history)
            alt = (policy.alternative(st.copy_history, len(st.d_pending))
                   if self.beside_draft else None)
            return match.tokens[: policy.choose(match, feats, alt)]
        return propose_chain(st.committed, min(cfg.lookup, cap), cfg.lookup_min_ngram,
                             cfg.lookup_max_ngram)

    def propose(self, d: Drafted, tokens: torch.Tensor, chains: torch.Tensor,
                lengths: list[int]) -> None:
        """Put each row's chain (`chains` [rows, n] on the device, right-padded) in the tree in
        place of a draft (whose forwards the row's slots may have ridden along with, unkept)."""
        for i, n in enumerate(lengths):
            if n:
                tokens[i, 1 : 1 + n] = chains[i, :n]
                d.layers[i] = chain_layers(chains[i, :n], self.vocab_size)
                d.depths[i], d.copied[i] = n, True
        if self.chain is None:  # the copies lie in the draft's tree
            d.depth = max(d.depth, *d.depths)

    def update(self, st: RowState, draft: Draft, v: Verdict, committed: list[int]) -> None:
        """A learned copy length's history: what was copied and accepted, the target's
        confidence in each committed token, and whether the stopper drafted."""
        if st.copy_history is None:
            return
        st.copy_history.update(draft.depth if draft.copied else 0, v.accepted,
                               v.conf[: len(committed)])
        if not draft.copied and draft.depth > self.lo:  # the stopper drafted this step
            st.copy_history.drafted(len(committed))


class WidthCut(Proposer):
    """A learned width of the first depth (`mcsd_runtime.stop.width`; None: no cut): `widths`
    holds the first depth cut to w < k candidates, by w (`Decoding.widths`)."""

    def __init__(self, dec: Decoding) -> None:
        self.policy, self.widths, self.cfg = dec.width, dec.widths, dec.config

    def propose(self, d: Drafted) -> None:
        """Cut each row drafted to depth 1 to the width the policy chooses from the draft's k
        largest probabilities at its root (one host copy for all rows). The choice never reads
        the candidates, and the first w are the w likeliest (greedy) or the first w drawn
        (sampled): a cut tree verifies losslessly."""
        if self.policy is None:
            return
        k = self.cfg.k_config[0]
        rows = [i for i, n in enumerate(d.depths) if n == 1 and not d.copied[i]]
        if not rows or k == 1:
            return
        firsts = [d.layers[i][0] for i in rows]
        tops = [layer.top[0, :k] if layer.top is not None and layer.top.shape[-1] >= k
                else layer.proposal[0].topk(k).values for layer in firsts]
        host = torch.stack(tops).float().tolist()  # sync: the widths' decision
        for i, layer, top in zip(rows, firsts, host, strict=True):
            w = self.policy.choose(top)
            if w < k:
                d.layers[i][0] = replace(layer, tokens=layer.tokens[:w], prob=layer.prob[:w],
                                         log_path=layer.log_path[:w], _node_features=None,
                                         _host=None)
                d.cut[i] = self.widths[w]


class TargetInit(Proposer):
    """Target-initialized candidates (the paper's; NOT lossless): the target's own distribution
    at the root supplies the first layer, the draft extends each root, and the branch with the
    longest accepted continuation wins (which can differ from the target's choice). The target
    takes the whole prompt at the prefill and verifies from node 1. `forward`: the engine's
    timed forward; only a batch of one (`batch_size`) of a draft that is no feature draft
    (`features`) takes them."""

    def __init__(self, dec: Decoding, forward: Forward, batch_size: int, features: bool) -> None:
        if batch_size > 1:
            raise MCSDError("batched decoding supports init='draft' (lossless) only; decode "
                            "target-initialized runs one at a time (batch size 1)")
        if features:
            raise MCSDError("a feature draft reads the target's states, which target-"
                            "initialized candidates do not give it: decode with init='draft'")
        self.dec, self.forward = dec, forward
        self.cfg, self.tree, self.tt, self.dev = dec.config, dec.tree, dec.tt, dec.pair.device

    def after_prefill(self, r: Row, logits: torch.Tensor) -> None:
        r.st.root_probs = self.dec.probs(logits[None])
        r.stats.target_calls += 1

    def propose(self, st: RowState) -> DraftLayer:
        """The first layer: the target's top (greedy) or sampled candidates at the root."""
        k, p = self.cfg.k_config[0], st.root_probs
        if self.cfg.temperature == 0:
            toks = p.topk(k, dim=-1).indices
        else:
            toks = V.sample_without_replacement(p, k, st.generator)
        prob = p.gather(1, toks).view(-1)
        return DraftLayer(toks.view(-1), p, None, prob, prob.clamp_min(1e-30).log(), None)

    def feed_roots(self, r: Row, tokens: torch.Tensor, inputs: torch.Tensor, dc: RowCache,
                   d: Drafted, timing: Timing) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The pending draft tokens and the roots in one draft forward; returns q [1, k, V] (and
        hidden states) at the roots, and moves `d.cache_base` to the first root."""
        st, needs_hidden = r.st, self.dec.needs_hidden
        m, extra = len(st.d_pending), self.tree.sizes[0]
        ids = torch.cat([inputs[0, 3 : 3 + m], tokens[0, 1 : 1 + extra]])
        pos = torch.cat([inputs[0, 0] - m + 1 + torch.arange(m, device=self.dev),
                         self.tt.depth[1 : 1 + extra] + inputs[0, 0]])
        block = self.dec.causal_block(m + extra).clone()
        block[m:, m:] = self.tt.bias[1 : 1 + extra, 1 : 1 + extra]
        out = self.forward(self.dec.pair.draft, dc, ids[None], pos[None], block[None], None,
                           timing, keep=extra, hidden=needs_hidden)
        st.d_pending = []
        d.cache_base = dc.length - extra
        hidden = out.hidden[:, -extra:] if needs_hidden else None
        return self.dec.probs(out.logits[:, -extra:]), hidden

    def with_root(self, st: RowState, probs: torch.Tensor) -> torch.Tensor:
        """Row 0, the root: the target's distribution from the last step."""
        return torch.cat([st.root_probs, probs])

    def match_roots(self, match: torch.Tensor, draft: Draft) -> None:
        """Every root the target can produce is a candidate; the longest branch wins."""
        match[: self.tree.sizes[0]] = draft.layers[0].prob > 0

    def update(self, st: RowState, draft: Draft, v: Verdict, committed: list[int]) -> None:
        """The next roots come from the target's distribution after the path."""
        st.root_probs = v.probs[v.best : v.best + 1]
