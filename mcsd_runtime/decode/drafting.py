"""The draft phase of a step (`TreeDrafter`): every row's pending draft tokens go in, depth 1 is
proposed; then, while the engine's planner says so (`mcsd_runtime.decode.planning`), the frontier
goes through the draft (one forward for all rows, tree attention) and the next depth is
proposed. The result is `Drafted`: each row's layers, the depth it drafted (`reach`) and the
depth it verifies (the planner's `verify`).

Each row is drafted at most to its cap (the new tokens it may still commit); the planner
chooses which rows draft each next depth (in max mode the batch's depth: all rows while any goes
on). Sampled rows draw with their own generator up to their own depth and from a spare generator
past it.

The first layer comes from `first_layer` (the draft's proposals at each row's last pending
token); a subclass may supply it otherwise (`target_init.InitDrafter`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from mcsd_runtime.decisions.contract import Planner
from mcsd_runtime.decisions.features import TOP_K_MASS
from mcsd_runtime.decode import speculative_sampling as V
from mcsd_runtime.decode.cache import StepCache
from mcsd_runtime.decode.graphs import Forward
from mcsd_runtime.decode.planning import drive
from mcsd_runtime.decode.ragged import Packing
from mcsd_runtime.decode.step_state import Drafted, DraftFrontier, DraftLayer

if TYPE_CHECKING:
    from mcsd_runtime.decode.step_state import Decoding, Row, Timing



class TreeDrafter:
    """Drafts every row's tree, depth by depth, for one engine: `forward` is the engine's timed
    forward, `planner` the engine's (asked after each depth, then how much each row verifies);
    `features`: a feature draft (reads the target's states); `packing`: the engine's forwards'
    layout (ragged ones take only the rows drafting)."""

    def __init__(self, dec: Decoding, forward: Forward, planner: Planner, features: bool,
                 packing: Packing) -> None:
        self.dec, self.forward, self.planner, self.packing = dec, forward, planner, packing
        self.cfg, self.tree, self.tt, self.pair = dec.config, dec.tree, dec.tt, dec.pair
        self.dev, self.features = dec.pair.device, features
        self.draft_hidden = dec.needs_hidden or features
        # draws for nodes beyond a row's own depth, which it never verifies: kept off the row's
        # generator so that its draws stay those of the prompt decoded alone
        self.spare = torch.Generator(self.dev)
        self.spare.manual_seed(self.cfg.seed)

    def draft(self, rows: list[Row], tokens: torch.Tensor, inputs: torch.Tensor,
              caps: list[int], dc: StepCache, timing: Timing) -> Drafted:
        """Draft every row up to the depth the planner lets it reach, asking after each depth
        before forwarding it; then the planner says how much of it each row verifies."""
        d = Drafted([[] for _ in rows], [0] * len(rows), [len(r.st.d_pending) for r in rows],
                    dc.length, went=[0] * len(rows), copied=[False] * len(rows),
                    refeed=self.features)
        if max(caps) <= 0:
            return d
        first = self.first_layer(rows, inputs, caps, dc, d, timing)
        d.cache_base = dc.length
        self.add_layers(d.layers, tokens, first)
        run = drive(self.planner, caps,
                    lambda depth, drew: self.frontiers(rows, d.layers, depth, drew),
                    lambda depth, drafting, own: self.next_depth(
                        rows, tokens, inputs, dc, d, timing, depth, drafting, own))
        d.depth, d.reach, d.depths = run.depth, run.reach, run.verify
        return d

    def next_depth(self, rows: list[Row], tokens: torch.Tensor, inputs: torch.Tensor,
                   dc: StepCache, d: Drafted, timing: Timing, depth: int, drafting: list[bool],
                   own: list[int]) -> None:
        """Depth + 1 of every row: the frontier goes through the draft (the rows `drafting`),
        which proposes the next layer (each row drawing to its `own` depth)."""
        q, hidden = self.forward_frontier(rows, tokens, inputs, dc, d, depth, timing, drafting)
        for i, on in enumerate(drafting):
            if self.packing.takes(on):
                d.went[i] = depth
        parent = torch.stack([rl[-1].log_path for rl in d.layers])
        self.add_layers(d.layers, tokens, self.propose(q, hidden, depth + 1, parent, rows, own))

    def first_layer(self, rows: list[Row], inputs: torch.Tensor, caps: list[int], dc: StepCache,
                    d: Drafted, timing: Timing) -> list[DraftLayer]:
        """Depth 1 of every row: its pending draft tokens go through the draft (`feeds`), which
        proposes at the last of them."""
        d.pending = self.feeds(rows, caps)
        q, hidden = self.feed_pending(rows, dc, inputs, timing, d.pending)
        for r, n in zip(rows, d.pending, strict=True):
            if self.packing.takes(n > 0):
                r.st.d_pending, r.st.d_feats = [], []
        d.fed = True
        return self.propose(q[:, None], hidden, 1, None, rows, caps)

    def feeds(self, rows: list[Row], caps: list[int]) -> list[int]:
        """The pending draft tokens each row feeds the step's first draft forward: all of them,
        except, ragged, a row that drafts nothing (cap 0), which keeps them for later."""
        return [len(r.st.d_pending) if self.packing.takes(c > 0) else 0
                for r, c in zip(rows, caps, strict=True)]

    def feed_pending(self, rows: list[Row], dc: StepCache, inputs: torch.Tensor,
                     timing: Timing, counts: list[int],
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed each row `counts[r]` of its pending draft tokens (`feeds`; right-padded, from
        `upload`); returns q [rows, V] (and the hidden state [rows, 1, H]) at each row's last
        pending token."""
        m = max(len(r.st.d_pending) for r in rows)
        prev = None
        if self.features:  # each pending token's target state, right-padded like the tokens
            prev = torch.nn.utils.rnn.pad_sequence([torch.cat(r.st.d_feats) for r in rows],
                                                   batch_first=True)
        uneven = len(set(counts)) > 1  # rows feeding unequal counts: padded, masked
        ids, n = inputs[:, 3 : 3 + m], inputs[:, 2:3] if uneven else m
        offsets = torch.arange(m, device=self.dev)[None]
        pos = inputs[:, :1] - n + 1 + offsets.clamp(max=n - 1)
        out = self.forward(self.pair.draft, dc, ids, pos, self.dec.causal_block(m)[None],
                           offsets < n if uneven else None, timing, keep=m if uneven else 1,
                           hidden=self.draft_hidden, prev=prev, counts=counts)
        last = (n - 1).clamp(min=0)[:, :, None] if isinstance(n, torch.Tensor) else None
        logits = out.logits[:, -1] if last is None else out.logits.gather(
            1, last.expand(-1, 1, out.logits.shape[-1]))[:, 0]
        hidden = None
        if self.draft_hidden:
            h = out.hidden
            assert h is not None, "the forward was asked for hidden states"
            hidden = h[:, -1:] if last is None else h.gather(1, last.expand(-1, 1, h.shape[-1]))
        return self.dec.probs(logits), hidden

    def forward_frontier(self, rows: list[Row], tokens: torch.Tensor, inputs: torch.Tensor,
                         dc: StepCache, d: Drafted, depth: int, timing: Timing,
                         drafting: list[bool]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the draft over every row's nodes of `depth`; returns their distributions q
        [rows, n, V] (and hidden states): the next depth's proposals. A ragged forward takes
        only the rows still `drafting`; the others' q is uniform (their deeper nodes are never
        verified)."""
        nodes = self.tree.depth_slice(depth)
        # a feature draft reads, at each node, the state its parent's proposal came from (it
        # keeps every layer's)
        prev = None
        if self.features:
            states = [rl[depth - 1].hidden() for rl in d.layers]
            prev = torch.stack(cast(list[torch.Tensor], states))
        out = self.forward(self.pair.draft, dc, tokens[:, nodes],
                           inputs[:, :1] + self.tt.depth[nodes][None],
                           self.tt.bias[nodes, 1 : nodes.stop][None], None, timing,
                           hidden=self.draft_hidden, prev=prev,
                           counts=[(nodes.stop - nodes.start) * on for on in drafting])
        return self.dec.probs(out.logits), out.hidden if self.draft_hidden else None

    def frontiers(self, rows: list[Row], layers: list[list[DraftLayer]], depth: int,
                  drew: list[bool]) -> list[DraftFrontier | None]:
        """The frontier of `depth` of each row that drew it (None elsewhere), read from the
        host in one copy for all when a decision reads their features."""
        peers = [layers[i][depth - 1] for i in range(len(rows)) if drew[i]]
        return [DraftFrontier(layers[i][depth - 1], depth, self.tree.depth, self.tt,
                              rows[i].st.trajectory, peers) if drew[i] else None
                for i in range(len(rows))]

    def propose(self, q: torch.Tensor, hidden: torch.Tensor | None, d: int,
                parent_log_path: torch.Tensor | None, rows: list[Row],
                own: list[int]) -> list[DraftLayer]:
        """Depth `d`'s candidates for every row from q [rows, m, V]: the top-k of all rows in one
        call when greedy; sampled rows draw with their own generator up to their own depth
        `own[i]` (`propose_row`)."""
        k, m = self.cfg.k_config[d - 1], self.tree.parents_with_children(d)
        if m < q.shape[1]:  # a capped depth: only the likeliest parents have children
            q, hidden = q[:, :m], None if hidden is None else hidden[:, :m]
            parent_log_path = None if parent_log_path is None else parent_log_path[:, :m]
        if self.cfg.temperature != 0:
            return [self.propose_row(q[i], None if hidden is None else hidden[i], d,
                                     None if parent_log_path is None else parent_log_path[i],
                                     r.st.generator if d <= own[i] else self.spare)
                    for i, r in enumerate(rows)]
        values, toks = q.topk(max(k, TOP_K_MASS), dim=-1)
        top, toks = values[..., :TOP_K_MASS], toks[..., :k].reshape(len(rows), -1)
        prob = q.reshape(-1, q.shape[-1]).gather(1, toks.reshape(-1, k)).reshape(len(rows), -1)
        log_path = prob.clamp_min(1e-30).log()
        if parent_log_path is not None:
            log_path = log_path + parent_log_path.repeat_interleave(k, dim=1)
        return [DraftLayer(toks[i], q[i], None if hidden is None else hidden[i], prob[i],
                           log_path[i], top[i]) for i in range(len(rows))]

    def propose_row(self, q: torch.Tensor, hidden: torch.Tensor | None, d: int,
                    parent_log_path: torch.Tensor | None, gen: torch.Generator) -> DraftLayer:
        """One row's sampled depth-`d` candidates from its parents' distributions q [m, V]."""
        k = self.cfg.k_config[d - 1]
        if self.cfg.verify == "mcss-replacement":
            toks = V.sample_with_replacement(q, k, gen)
        else:
            toks = V.sample_without_replacement(q, k, gen)
        prob = q.gather(1, toks).reshape(-1)
        log_path = prob.clamp_min(1e-30).log()
        if parent_log_path is not None:
            log_path = log_path + parent_log_path.repeat_interleave(k)
        return DraftLayer(toks.reshape(-1), q, hidden, prob, log_path, None)

    def add_layers(self, layers: list[list[DraftLayer]], tokens: torch.Tensor,
                   new: list[DraftLayer]) -> None:
        d = len(layers[0]) + 1
        tokens[:, self.tree.depth_slice(d)] = torch.stack([layer.tokens for layer in new])
        for row_layers, layer in zip(layers, new, strict=True):
            row_layers.append(layer)
