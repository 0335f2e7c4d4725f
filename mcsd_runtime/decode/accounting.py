"""The account phase of a step (`Accounts`): after each row's commit, the recorder, the row's
trajectory and stopper, the proposers that learn (`update`), the batch's and the row's
statistics, the row's step record, and `generate`'s `on_commit` hook hear how the step went,
in that order.

Layers the draft did not propose (`Draft.roots`: target-initialized roots) are not drafted: to
the stopper and the statistics the drafted depth leaves them out, and so do the drafted tokens.
A copied chain (prompt lookup) is no draft to the stopper: a step without one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from mcsd_runtime.decode.cache import StepCache
from mcsd_runtime.decode.proposers import Proposer
from mcsd_runtime.decode.records import DecodeStats, StepRecord, StepTrace
from mcsd_runtime.decode.step_state import Draft, RowState, Verdict

if TYPE_CHECKING:
    from mcsd_runtime.decisions.contract import Planner
    from mcsd_runtime.decode.step_state import Decoding, Row, Timing

CommitHook = Callable[[list[int]], "int | None"]


class Accounts:
    """Accounts for one engine's steps into `stats` (the batch's) and each row's own:
    `proposers` learn from each row's step (`update`, in order), `on_commit` is `generate`'s
    hook."""

    def __init__(self, dec: Decoding, stats: DecodeStats, planner: Planner,
                 proposers: list[Proposer], on_commit: CommitHook | None) -> None:
        self.dec, self.stats, self.planner, self.proposers = dec, stats, planner, proposers
        self.on_commit, self.tree, self.pair = on_commit, dec.tree, dec.pair

    def account(self, rows: list[Row], outcomes: list, timing: Timing, tc: StepCache,
                dc: StepCache) -> None:
        """The step of every row: `outcomes[i]` is row i's (draft, verdict, committed tokens)."""
        self.stats.target_calls += 1
        self.stats.draft_calls += timing.draft_calls
        self.stats.target_time += timing.target
        self.stats.draft_time += timing.draft
        for i, r in enumerate(rows):
            draft, v, new = outcomes[i]
            rs = r.stats
            rs.target_calls += 1
            rs.draft_calls += timing.draft_calls
            rs.target_time += timing.target
            rs.draft_time += timing.draft
            self.learn(r.st, draft, v, new, rs, self.stats, row=r.index)
            r.steps.append(StepRecord(
                drafted=draft.depth, accepted=v.accepted, committed=len(new),
                tree_size=draft.size, target_cache=tc.lens[i],
                draft_cache=dc.lens[i] if self.tree.depth else 0,
                target_pending=len(r.st.t_pending), draft_pending=len(r.st.d_pending),
                copied=draft.copied))
            self.commit_hook(r)

    def commit_hook(self, r: Row) -> None:
        """`on_commit(tokens)` of `generate` sees the step's committed tokens; a count keeps
        only that many and ends the generation."""
        if self.on_commit is None:
            return
        st, step = r.st, r.steps[-1]
        start = len(st.committed) - step.committed
        keep = self.on_commit(st.committed[start:])
        if keep is not None:
            del st.committed[start + keep:]
            step.committed, st.done = min(step.committed, keep), True

    def learn(self, st: RowState, draft: Draft, v: Verdict, committed: list[int],
              *stats: DecodeStats, row: int = 0) -> None:
        """Tell the recorder, the trajectory, the stopper and each of `stats` how the step
        went."""
        s, c = draft.depth, draft.size
        drafted_depth = max(0, s - draft.roots)
        roots = draft.tt.tree.cum[s - drafted_depth]  # tokens the draft did not propose
        if self.dec.recorder is not None:
            self.dec.recorder.on_step(self.trace(st, draft, v, row))
        # the stopper did not draft a copied chain: to it, a step without a draft
        own, accepted = (0, 0) if draft.copied else (drafted_depth, v.accepted)
        st.trajectory.update(accepted, len(committed), own)
        self.planner.outcome(st, own, accepted)
        for proposer in self.proposers:
            proposer.update(st, draft, v, committed)
        for counts in stats:
            counts.lookup_steps += draft.copied
            counts.drafted_tokens += c - roots
            counts.accepted_tokens += v.accepted
            if drafted_depth:
                counts.drafting_steps += 1
                counts.acceptance_sum += v.accepted / drafted_depth

    def trace(self, st: RowState, draft: Draft, v: Verdict, row: int = 0) -> StepTrace:
        """What the recorder sees of a row's step."""
        tt, s = draft.tt, draft.depth
        c = draft.size
        layers = draft.layers
        probs = v.probs
        assert probs is not None, "verdicts keep the target's distributions for a recorder"
        empty = probs.new_zeros(0)
        feats = [layer.node_features(tt.static_features[tt.tree.depth_slice(d)])
                 for d, layer in enumerate(layers, 1)]
        hidden = None
        if self.dec.needs_hidden and s:
            model = self.pair.draft
            hidden = torch.cat([
                h if (h := layer.hidden()) is not None else  # roots the draft did not propose
                torch.zeros(layer.prob.shape[0], model.config.hidden_size, dtype=model.dtype,
                            device=model.device)
                for layer in layers])
        return StepTrace(
            step=st.trajectory.steps, tokens=draft.tokens[: 1 + c],
            node_features=torch.cat(feats) if s else empty,
            trajectory=st.trajectory.values(),
            target_prob=probs[tt.parent[1 : 1 + c], draft.tokens[1 : 1 + c]],
            draft_prob=torch.cat([layer.prob for layer in layers]) if s else empty,
            hidden=hidden, path=v.path, accepted=v.accepted, drafted=s, row=row)
