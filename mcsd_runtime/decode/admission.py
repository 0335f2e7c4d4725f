"""Admission (`Admission`): prompts join the batch where rows left it (continuous batching).
Each new row gets its own generator (seeded like `generate`) and stopper (the decoder's own in a
batch of one, a copy in a batch), then the new prompts are prefilled together, right-padded,
into both models' caches. Both take each prompt but its last token, which stays pending; the
target takes that one too when it supplies the first token (AR: `first_token` commits it as a
step would; a subclass may read the prefill's logits otherwise: `after_prefill`). A feature
draft reads the target's state one position back, so the target's prefill states go into the
draft's.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING

import torch

from mcsd_runtime.decisions.contract import Stopper
from mcsd_runtime.decode import speculative_sampling as V
from mcsd_runtime.decode.accounting import Accounts
from mcsd_runtime.decode.cache import RowCache, StepCache
from mcsd_runtime.decode.graphs import Forward
from mcsd_runtime.decode.proposers import PromptLookup
from mcsd_runtime.decode.records import DecodeStats, StepRecord
from mcsd_runtime.decode.step_state import Row, RowState, Timing
from mcsd_runtime.transfer import upload

if TYPE_CHECKING:
    from mcsd_runtime.decode.step_state import Decoding



class Admission:
    """Admits prompts for one engine: `forward` its timed forward, `stopper` the batch's
    stopper, `features` a feature draft; prefill seconds and calls go into `stats` (the
    batch's) and each row's own."""

    def __init__(self, dec: Decoding, forward: Forward, stopper: Stopper, batch_size: int,
                 features: bool, lookup: PromptLookup, accounts: Accounts,
                 stats: DecodeStats) -> None:
        self.dec, self.forward, self.stopper, self.batch_size = dec, forward, stopper, batch_size
        self.features, self.lookup = features, lookup
        self.accounts, self.stats = accounts, stats
        self.cfg, self.tree, self.pair = dec.config, dec.tree, dec.pair
        self.dev, self.dtype = dec.pair.device, dec.pair.dtype
        # the target takes the whole prompt at the prefill when it supplies the first token (AR)
        self.target_takes_prompt = not self.tree.depth

    def admit(self, take: list[int], prompts: list[list[int]], seeds: list[int],
              tc: StepCache, dc: StepCache) -> list[Row]:
        """Prefill the prompts `take` and append their rows to the batch's caches. Both models
        take each prompt but its last token, which stays pending; the target takes that one too
        when it must supply the first token (`target_takes_prompt`)."""
        t0 = time.perf_counter()
        rows = [self.new_row(i, prompts[i], seeds[i], t0) for i in take]
        ids = [prompts[i] for i in take]
        timing = Timing()
        n_t = [len(p) - (0 if self.target_takes_prompt else 1) for p in ids]
        logits, states = self.prefill(self.pair.target, tc, ids, n_t, timing,
                                      logits=self.target_takes_prompt, states=self.features)
        if self.tree.depth:  # (a feature draft reads the target's state one position back)
            prev = None if states is None else torch.cat(
                [torch.zeros_like(states[:, :1]), states[:, :-1]], 1)
            self.prefill(self.pair.draft, dc, ids, [len(p) - 1 for p in ids], timing, prev=prev)
        for i, (r, n) in enumerate(zip(rows, n_t, strict=True)):
            r.st.t_pending = r.st.committed[n:]
            r.st.d_pending = r.st.committed[-1:] if self.tree.depth else []
            if self.features:  # the pending last prompt token's: the target's state before it
                r.st.d_feats = [states[i, n - 1 : n] if n and states is not None else torch.zeros(
                    1, self.pair.draft.config.hidden_size, dtype=self.dtype, device=self.dev)]
        dt = time.perf_counter() - t0
        self.stats.prefill_time += dt
        self.stats.target_time += timing.target
        self.stats.draft_time += timing.draft
        if self.target_takes_prompt:  # the prefill's last logits serve as one target call
            self.stats.target_calls += 1
        for i, r in enumerate(rows):
            r.stats.prefill_time = dt
            r.stats.target_time, r.stats.draft_time = timing.target, timing.draft
            self.after_prefill(r, None if logits is None else logits[i])
        return rows

    def after_prefill(self, r: Row, logits: torch.Tensor | None) -> None:
        """A new row after its prefill (`logits` [V] at its last token when the target took
        it): AR commits its first token."""
        if not self.tree.depth:
            assert logits is not None, "AR: the target takes the whole prompt, which is not empty"
            self.first_token(r, logits)

    def new_row(self, index: int, ids: list[int], seed: int, t0: float) -> Row:
        gen = torch.Generator(self.dev)
        gen.manual_seed(seed)
        # a batch of one asks the decoder's own stopper; rows of a batch, their own copies
        stopper = self.stopper if self.batch_size == 1 else copy.copy(self.stopper)
        stopper.reset()
        st = RowState(committed=list(ids), n_prompt=len(ids),
                      t_pending=[], d_pending=[], generator=gen, stopper=stopper,
                      copy_history=self.lookup.history())
        return Row(index, st, admitted=t0)

    def prefill(self, model, cache: StepCache, prompts: list[list[int]], lens: list[int],
                timing: Timing, logits: bool = False, states: bool = False,
                prev: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Each row's first `lens[r]` prompt tokens into `cache` (right-padded). Returns, when
        asked, the logits [rows, V] at each row's last one and the final hidden states [rows,
        n, H]; `prev` is a feature draft's input states [rows, n, H]."""
        n = max(lens)
        new = RowCache(len(prompts), self.dev)
        last = hidden = None
        if n:
            ids = upload([p[: lens[r]] + [0] * (n - lens[r]) for r, p in enumerate(prompts)],
                         self.dev, torch.long)
            pos = torch.arange(n, device=self.dev).expand(len(prompts), -1)
            uneven = len(set(lens)) > 1  # prompts of unequal lengths: padded, masked
            lens_t = upload(lens, self.dev, torch.long)
            valid = pos < lens_t[:, None] if uneven else None
            out = self.forward(model, new, ids, pos, self.dec.causal_block(n)[None], valid,
                               timing, keep=n if uneven and logits else 1, prefill=True,
                               hidden=states, prev=prev)
            hidden = out.hidden if states else None
            if logits:
                rows = torch.arange(len(prompts), device=self.dev)
                last = out.logits[:, -1] if not uneven else out.logits[rows, lens_t - 1]
            new.settle(lens)
        cache.extend(new)
        return last, hidden

    def first_token(self, r: Row, logits: torch.Tensor) -> None:
        """AR: commit the first token from the prefill's last logits, as a step would."""
        st = r.st
        if self.cfg.temperature == 0:
            token = int(logits.argmax())  # sync: the token
        else:
            token = int(V.sample(self.dec.probs(logits[None]), st.generator)[0])  # sync
        st.committed.append(token)
        st.t_pending = [token]
        st.done = token in self.dec.eos or self.cfg.max_new_tokens == 1
        r.stats.target_calls += 1
        st.trajectory.update(0, 1, 0)
        self.accounts.planner.outcome(st, 0, 0)
        r.steps.append(StepRecord(drafted=0, accepted=0, committed=1, tree_size=0,
                                  target_cache=len(st.committed) - 1, draft_cache=0,
                                  target_pending=1, draft_pending=0))
        self.accounts.commit_hook(r)
