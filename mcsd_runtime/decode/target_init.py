"""Target-initialized candidates (the paper's, arXiv 2409.10644; NOT lossless: `init="target"`),
an engine of their own beside the lossless one.

The target's own distribution at the root supplies the first layer of the tree, the draft extends
each root, and the branch with the longest accepted continuation wins (which can differ from the
target's choice, hence lossy). So the target takes the whole prompt at the prefill, keeps no
pending root, verifies from node 1, and commits no bonus token: the distribution after the
accepted path gives the next step's roots. Only batches of one, and no feature draft.

`TargetInitEngine` is `engine.Engine` with these phases (`InitDrafter`, `InitAdmission`,
`InitVerifier`) and `TargetInit` among the proposers that learn from a step; the lossless
step's modules know nothing of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mcsd_runtime.decode import speculative_sampling as V
from mcsd_runtime.decode.admission import Admission
from mcsd_runtime.decode.cache import StepCache
from mcsd_runtime.decode.drafting import TreeDrafter
from mcsd_runtime.decode.engine import Engine
from mcsd_runtime.decode.graphs import Forward
from mcsd_runtime.decode.proposers import Proposer
from mcsd_runtime.decode.step_state import Draft, Drafted, DraftLayer, RowState, Verdict
from mcsd_runtime.decode.verifying import Verifier
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.tree import Tree

if TYPE_CHECKING:
    from mcsd_runtime.decode.step_state import Decoding, Row, Timing


class TargetInit(Proposer):
    """The target's roots for one engine: `forward` is its timed forward; refuses a batch
    (`batch_size` > 1) and a feature draft (`features`)."""

    def __init__(self, dec: Decoding, forward: Forward, batch_size: int, features: bool) -> None:
        if batch_size > 1:
            raise MCSDError("batched decoding supports init='draft' (lossless) only; decode "
                            "target-initialized runs one at a time (batch size 1)")
        if features:
            raise MCSDError("a feature draft reads the target's states, which target-"
                            "initialized candidates do not give it: decode with init='draft'")
        self.dec, self.forward = dec, forward
        self.cfg, self.tree, self.tt, self.dev = dec.config, dec.tree, dec.tt, dec.pair.device

    def first_layer(self, st: RowState) -> DraftLayer:
        """The first layer: the target's top (greedy) or sampled candidates at the root."""
        k, p = self.cfg.k_config[0], st.root_probs
        assert p is not None, "the prefill and every step leave the next roots' distribution"
        if self.cfg.temperature == 0:
            toks = p.topk(k, dim=-1).indices
        else:
            toks = V.sample_without_replacement(p, k, st.generator)
        prob = p.gather(1, toks).view(-1)
        return DraftLayer(toks.view(-1), p, None, prob, prob.clamp_min(1e-30).log(), None)

    def feed_roots(self, r: Row, tokens: torch.Tensor, inputs: torch.Tensor, dc: StepCache,
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
        hidden = out.hidden[:, -extra:] if out.hidden is not None else None  # if needs_hidden
        return self.dec.probs(out.logits[:, -extra:]), hidden

    def update(self, st: RowState, draft: Draft, v: Verdict, committed: list[int]) -> None:
        """The next roots come from the target's distribution after the path."""
        assert v.probs is not None, "target-initialized verdicts keep the distributions"
        st.root_probs = v.probs[v.best : v.best + 1]


class InitDrafter(TreeDrafter):
    """The first layer is the target's (`TargetInit.first_layer`); the roots go into the draft
    with the pending tokens, as its first forward."""

    def __init__(self, init: TargetInit, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.init = init

    def first_layer(self, rows: list[Row], inputs: torch.Tensor, caps: list[int], dc: StepCache,
                    d: Drafted, timing: Timing) -> list[DraftLayer]:
        return [self.init.first_layer(rows[0].st)]

    def forward_frontier(self, rows: list[Row], tokens: torch.Tensor, inputs: torch.Tensor,
                         dc: StepCache, d: Drafted, depth: int, timing: Timing,
                         drafting: list[bool]) -> tuple[torch.Tensor, torch.Tensor | None]:
        if depth > 1:
            return super().forward_frontier(rows, tokens, inputs, dc, d, depth, timing,
                                            drafting)
        d.fed = True
        return self.init.feed_roots(rows[0], tokens, inputs, dc, d, timing)


class InitAdmission(Admission):
    """The target takes the whole prompt; its last distribution gives the first roots."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.target_takes_prompt = True

    def after_prefill(self, r: Row, logits: torch.Tensor | None) -> None:
        assert logits is not None, "the target takes the whole prompt: it gives the logits"
        r.st.root_probs = self.dec.probs(logits[None])
        r.stats.target_calls += 1


class InitVerifier(Verifier):
    """The root's distribution is the last step's (`RowState.root_probs`); the roots need no
    test, and every root the target can produce is a candidate (the longest branch wins)."""

    def distributions(self, st: RowState, logits: torch.Tensor, greedy: bool,
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        roots = st.root_probs
        assert roots is not None, "the prefill and every step leave the next roots' distribution"
        probs = torch.cat([roots, self.probs(logits)])
        if not greedy:
            return probs, None
        return probs, torch.cat([roots.argmax(-1), logits.argmax(-1)])

    def admit(self, match: torch.Tensor, draft: Draft) -> None:
        match[: draft.tt.tree.sizes[0]] = draft.layers[0].prob > 0

    def children(self, d: int, layer: DraftLayer, probs: torch.Tensor, tree: Tree,
                 gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if d > 1:
            return super().children(d, layer, probs, tree, gen)
        zero = torch.zeros(1, dtype=torch.long, device=probs.device)
        return zero, zero


class TargetInitEngine(Engine):
    """`Engine` for `init="target"`: the target supplies every tree's first layer, so the target's
    forward carries no root, keeps no root slot and commits no bonus token; a step may draft up to
    the new tokens the row may still commit, and its stopper is not asked whether to draft."""

    def phases(self) -> tuple[TreeDrafter, Admission, Verifier]:
        dec, b = self.dec, self.batch_size
        self.init = TargetInit(dec, self.forward, b, self.features)
        self.accounts.proposers.append(self.init)
        return (InitDrafter(self.init, dec, self.forward, self.planner, self.features,
                            self.packing),
                InitAdmission(dec, self.forward, self.stopper, b, self.features, self.lookup,
                              self.accounts, self.stats),
                InitVerifier(self.cfg, dec.probs, dec.recorder is not None, self.wants_conf))

    def plan(self, rows: list[Row]) -> tuple[list[int], list[list[int]], list[int]]:
        remaining = self.remaining(rows)
        copied = self.planner.copy([r.st for r in rows], [m - 1 for m in remaining])
        caps = [max(0, min(self.tree.depth, m)) for m in remaining]  # s tokens: no bonus
        self.planner.plan(self.starts(rows, caps))  # the target supplies depth 1: no question
        return remaining, copied, caps

    def propose(self, *args, **kwargs):
        tokens, d, drafts = super().propose(*args, **kwargs)
        for draft in drafts:
            draft.roots = 1
        return tokens, d, drafts

    def tree_inputs(self, tokens, inputs, d, drafts):
        ids, pos, block = super().tree_inputs(tokens, inputs, d, drafts)
        return ids[:, 1:], pos[:, 1:], block[:, 1:, 1:]  # no root: it is the target's own

    def target_keep(self, base: int, path: list[int]) -> list[int]:
        return [base + j - 1 for j in path]

    def bonus(self, v: Verdict) -> list[int]:
        return []
