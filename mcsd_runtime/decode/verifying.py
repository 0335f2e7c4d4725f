"""The verify phase of a step (`Verifier`): each row's tree against the target's logits on the
device, then, from the step's one host copy, each row's verdict. The verifiers' rules are the
pure functions of `mcsd_runtime.decode.speculative_sampling`.

Greedy rows accept a node whose token is the target's argmax at its parent; sampled rows run
the configured verifier depth by depth with the row's own generator. `distributions`, `admit`
and `children` are where a subclass verifies otherwise (`target_init.InitVerifier`).

A learned copy length reads the target's confidence in the tokens it commits: each node's top-1
probability travels to the host with the verdicts, in millionths (`CONF_SCALE`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mcsd_runtime.decode import speculative_sampling as V
from mcsd_runtime.decode.records import DecodeConfig
from mcsd_runtime.decode.step_state import Draft, DraftLayer, RowState, Verdict
from mcsd_runtime.tree import Tree

CONF_SCALE = 1_000_000  # probabilities travel to the host with the verdicts as integers


class Verifier:
    """Verifies trees for one engine: `probs` the decoder's logits-to-distributions;
    `want_probs`: keep the target's distributions for a recorder; `wants_conf`: send each
    node's top-1 probability with the verdicts."""

    def __init__(self, cfg: DecodeConfig, probs: Callable[[torch.Tensor], torch.Tensor],
                 want_probs: bool, wants_conf: bool) -> None:
        self.cfg, self.probs = cfg, probs
        self.want_probs, self.wants_conf = want_probs, wants_conf

    def verify(self, states: list[RowState], drafts: list[Draft], logits: torch.Tensor,
               ) -> list[Verdict]:
        """Every row's verdict: each row judged on the device (`logits` [rows, n, V], the
        target's over the rows' roots and trees), then one host copy for all of them."""
        judged = [self.judge(st, draft, logits[i, : 1 + draft.size])
                  for i, (st, draft) in enumerate(zip(states, drafts, strict=True))]
        values = [j[0] for j in judged]
        host = (torch.cat(values) if len(values) > 1 else values[0]).tolist()  # sync: verdicts
        verdicts, at = [], 0
        for (_, probs), draft in zip(judged, drafts, strict=True):
            n = 2 + (1 + draft.size) * (1 + self.wants_conf)  # this row's values
            verdicts.append(self.verdict(host[at : at + n], probs, draft))
            at += n
        return verdicts

    def judge(self, st: RowState, draft: Draft, logits: torch.Tensor,
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Verify one row's tree on the device: every node's accepted child and next token, then
        the deepest node whose whole path was accepted. Returns [best, its next token, the
        tree's tokens] (for the step's one host copy) and the target's distributions, when
        computed."""
        tt, c = draft.tt, draft.size
        tokens = draft.tokens[: 1 + c]
        greedy = self.cfg.temperature == 0
        probs, nxt = self.distributions(st, logits, greedy)
        if greedy:
            assert nxt is not None, "greedy distributions give the argmax"
            match = tokens[1:] == nxt[tt.parent[1 : 1 + c]]
        else:
            assert probs is not None, "sampled distributions give the probabilities"
            match, nxt = self.verify_sampled(probs, draft, st.generator)
        self.admit(match, draft)
        acc = ~(tt.path_matrix[1 : 1 + c, 1 : 1 + c] & ~match).any(-1)
        score = torch.where(torch.cat([acc.new_ones(1), acc]), tt.score[: 1 + c], -1)
        best = score.argmax()
        values = [best.view(1), nxt[best].view(1), tokens]
        if self.wants_conf:  # every node's top-1 probability, in millionths
            top = (logits.float().amax(-1) - logits.float().logsumexp(-1)).exp()
            values.append((top * CONF_SCALE).round().long())
        return torch.cat(values), probs

    def distributions(self, st: RowState, logits: torch.Tensor, greedy: bool,
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The target's distributions at the root and each node (when sampled, or kept for a
        recorder) and, greedy, its argmax at each."""
        probs = self.probs(logits) if not greedy or self.want_probs else None
        return probs, logits.argmax(-1) if greedy else None

    def admit(self, match: torch.Tensor, draft: Draft) -> None:
        """Adjust which nodes the target accepts given their parent (none here)."""

    def children(self, d: int, layer: DraftLayer, probs: torch.Tensor, tree: Tree,
                 gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Depth `d`'s accepted child rank and next token at each of its parents (sampled)."""
        rows = slice(0, 1) if d == 1 else tree.depth_slice(d - 1)
        m = tree.parents_with_children(d)
        cands = layer.tokens.view(m, tree.k_config[d - 1])
        rank, nxt = V.verify_children(probs[rows][:m], layer.proposal, cands, self.cfg.verify,
                                      gen)
        if m < rows.stop - rows.start:  # a capped depth: the other parents are leaves
            leaf = probs[rows][m:]
            rank = torch.cat([rank, rank.new_full((leaf.shape[0],), -1)])
            nxt = torch.cat([nxt, V.sample(leaf, gen)])
        return rank, nxt

    def verdict(self, host: list[int], probs: torch.Tensor | None, draft: Draft) -> Verdict:
        """The verdict from `judge`'s values on the host (a row's tree on `draft.tt`; roots the
        draft did not propose are no accepted draft tokens)."""
        path = draft.tt.paths[host[0]]
        tokens, conf = host[2:], None
        if self.wants_conf:
            tokens, nodes = tokens[: len(tokens) // 2], tokens[len(tokens) // 2 :]
            conf = [nodes[j] / CONF_SCALE for j in [0, *path]]  # each committed token's
        return Verdict(path=path, accepted=len(path) - draft.roots, best=host[0], bonus=host[1],
                       tokens=tokens, probs=probs, conf=conf)

    def verify_sampled(self, probs: torch.Tensor, draft: Draft, gen: torch.Generator,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-node accepted child and next token for the sampling verifiers."""
        tt = draft.tt
        tree, c = tt.tree, draft.size
        rank_rows, next_rows = [], []
        for d, layer in enumerate(draft.layers, 1):
            rank, nxt = self.children(d, layer, probs, tree, gen)
            rank_rows.append(rank)
            next_rows.append(nxt)
        leaves = tree.depth_slice(draft.depth) if draft.depth else slice(0, 1)
        next_rows.append(V.sample(probs[leaves], gen))
        rank = torch.cat(rank_rows) if rank_rows else probs.new_zeros(0, dtype=torch.long)
        match = tt.sibling_rank[1 : 1 + c] == rank[tt.parent[1 : 1 + c]]
        return match, torch.cat(next_rows)
