"""Proposers: where a step's candidates come from besides the draft's own depths
(`drafting.TreeDrafter`), each behind one interface, that of Hugging Face's candidate
generators: `propose(step)` returns each row's `Proposal` (or None: the row keeps its tree),
`update` learns from how a row's step went. A proposer changes no shared state; the engine
gives each row the proposals in the proposers' order (`Drafted.take`).

- `PromptLookup` (`DecodeConfig.lookup`): a row whose context repeats itself verifies the tokens
  that followed the repeat as a chain. The planner chooses them on the host before the forwards
  (`Planner.copy`; they go up with the step's one upload), `propose` returns them as the row's
  tree in place of a draft, `update` tells a learned copy length's history how the step went.
- `WidthCut` (a learned `WidthPolicy`): `propose` cuts each row drafted to depth 1 to the width
  the planner chooses (`Planner.width`, one host copy for all rows).

The engine calls each at a fixed point of its step, in a fixed order, so random draws and host
syncs happen where they always have: the copies before the upload, the draft's depths, then
`PromptLookup.propose` and `WidthCut.propose`; `update` when the step is accounted for.
Target-initialized candidates, which are not lossless, live apart (`target_init`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from mcsd_runtime.decisions.copy_length import CopyHistory
from mcsd_runtime.decode.step_state import Draft, DraftLayer, Proposal, RowState, Verdict

if TYPE_CHECKING:
    from mcsd_runtime.decode.step_state import Decoding, Drafted


@dataclass
class Proposing:
    """What a proposer sees of a step: the draft phase's trees (`drafted`, read only) and the
    chains prompt lookup planned (`chains` [rows, n] on the device, right-padded; `lengths`
    each row's, 0 for none)."""

    drafted: Drafted
    chains: torch.Tensor
    lengths: list[int]


class Proposer:
    """The interface: `propose` returns each row's proposal at the proposer's point of the step
    (None: the row keeps its tree); `update` learns from one row's step."""

    def propose(self, step: Proposing) -> list[Proposal | None]:
        """Each row's tree from this proposer, or None (by default, none)."""
        return [None] * len(step.lengths)

    def update(self, st: RowState, draft: Draft, v: Verdict, committed: list[int]) -> None:
        """Learn from a row's step: its tree, its verdict and the tokens it committed."""


def chain_layers(tokens: torch.Tensor, vocab_size: int) -> list[DraftLayer]:
    """A copied chain (`tokens` [n] on the device) as the draft layers the engine verifies: one
    depth per token, each proposed by a one-hot float32 distribution (q(x) = 1, as the
    verifiers read it), so greedy and sampled decoding stay lossless."""
    n = tokens.shape[0]
    one_hot = torch.zeros(n, vocab_size, dtype=torch.float32, device=tokens.device)
    one_hot.scatter_(1, tokens[:, None], 1.0)
    ones, zeros = one_hot.new_ones(1), one_hot.new_zeros(1)
    return [DraftLayer(tokens[i : i + 1], one_hot[i : i + 1], None, ones, zeros, None)
            for i in range(n)]


class PromptLookup(Proposer):
    """Prompt lookup's chains (`chain_layers`), as the planner chose them
    (`mcsd_runtime.decode.planning.CopyRule`); `chain`: the tree a copied chain lies on when the
    draft's first depths are not a chain (`Decoding.chain`)."""

    def __init__(self, dec: Decoding) -> None:
        self.policy, self.chain = dec.copy_length, dec.chain
        self.vocab_size = dec.pair.vocab_size

    def history(self) -> CopyHistory | None:
        """A new row's copy history, which a learned copy length reads."""
        return self.policy.history() if self.policy else None

    def propose(self, step: Proposing) -> list[Proposal | None]:
        """Each row's planned chain as its tree, in place of a draft (whose forwards the row's
        slots may have ridden along with, unkept); on the draft's tree when its first depths
        are a chain, else on the chain tree (`Decoding.chain`)."""
        return [Proposal(chain_layers(step.chains[i, :n], self.vocab_size), self.chain, True)
                if n else None for i, n in enumerate(step.lengths)]

    def update(self, st: RowState, draft: Draft, v: Verdict, committed: list[int]) -> None:
        """A learned copy length's history: what was copied and accepted, the target's
        confidence in each committed token, and whether the stopper drafted."""
        if st.copy_history is None:
            return
        assert v.conf is not None, "a learned copy length has the verdicts send confidences"
        st.copy_history.update(draft.depth if draft.copied else 0, v.accepted,
                               v.conf[: len(committed)])
        if not draft.copied and draft.depth > draft.roots:  # the stopper drafted this step
            st.copy_history.drafted(len(committed))


class WidthCut(Proposer):
    """The first depth cut to the width the planner chooses (`choose`: `Planner.width`), where
    the decoder has a learned width (`mcsd_runtime.decisions.width`; else no cut): `widths`
    holds the first depth cut to w < k candidates, by w (`Decoding.widths`)."""

    def __init__(self, dec: Decoding, choose: Callable[[list[list[float]]], list[int]]) -> None:
        self.policy, self.widths, self.cfg, self.choose = dec.width, dec.widths, dec.config, choose

    def propose(self, step: Proposing) -> list[Proposal | None]:
        """Each row drafted to depth 1, cut to the width the policy chooses from the draft's k
        largest probabilities at its root (one host copy for all rows). The choice never reads
        the candidates, and the first w are the w likeliest (greedy) or the first w drawn
        (sampled): a cut tree verifies losslessly."""
        d = step.drafted
        out: list[Proposal | None] = [None] * len(step.lengths)
        if self.policy is None:
            return out
        k = self.cfg.k_config[0]
        rows = [i for i, n in enumerate(d.depths) if n == 1 and not d.copied[i]]
        if not rows or k == 1:
            return out
        firsts = [d.layers[i][0] for i in rows]
        tops = [layer.top[0, :k] if layer.top is not None and layer.top.shape[-1] >= k
                else layer.proposal[0].topk(k).values for layer in firsts]
        host = torch.stack(tops).float().tolist()  # sync: the widths' decision
        for i, layer, w in zip(rows, firsts, self.choose(host), strict=True):
            if w < k:
                cut = replace(layer, tokens=layer.tokens[:w], prob=layer.prob[:w],
                              log_path=layer.log_path[:w], _node_features=None, _host=None)
                out[i] = Proposal([cut], self.widths[w])
        return out
