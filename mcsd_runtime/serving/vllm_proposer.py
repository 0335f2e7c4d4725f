"""The toolkit's learned copy length inside vLLM, as its custom proposer class
(`speculative_config = {"method": "custom_class", "model":
"mcsd_runtime.serving.vllm_proposer.LearnedLookupProposer", "num_speculative_tokens": K}`).

At each step, for each request, prompt lookup finds where the context's last tokens occurred
before (`mcsd_runtime.lookup.find_match`, the policy's n-gram sizes) and the learned copy length
(`mcsd_runtime.decisions.copy_length.CopyLength`, `mcsd train --decision copy`) chooses how many
of the tokens that followed to propose: a draft of its own length per request, none where copying
does not pay. vLLM verifies the chain, so decoding stays lossless.

vLLM hands the class the batch's rows, not its requests: `propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu)` with row i's context `token_ids_cpu[i, :num_tokens_no_spec[i]]`
and `sampled_token_ids[i]` the tokens its last step committed. A request's copy history is kept
per row and recognised by its context (the length and last tokens it had); a row whose context
is not the continuation of the one it held starts a new history (a new request, or rows that
vLLM moved as others ended). So histories live only for rows in the batch: memory is bounded by
the engine's `max_num_seqs`, and a finished request's history goes with its row.

What it cannot see, and so gives the policy as unknown (-1, as at a request's first steps): the
target's confidence in the last tokens (vLLM does not pass the target's probabilities). The step
costs are the ones the policy was trained on (this toolkit's decoder): the policy's choices are
judged end to end in vLLM, not assumed to transfer.

Cost on a GPU: it runs on the host, once per step, a NumPy match over each row's context and one
LightGBM prediction per row over at most `num_speculative_tokens` lengths. Measured on this
project's CPU (Intel Xeon Ice Lake, 2.6 GHz, the other core busy; `propose` timed over 50 steps,
the policy of docs/results-vllm.md): 0.26 ms a row at one request (contexts of 200 tokens),
0.35 ms at 600, 0.27 ms a row at 8 requests and 0.50 ms a row at 16 (8 ms a step). vLLM waits
for it between the GPU's steps, as it does for its own n-gram matcher: at a 135M target's
16-18 ms step on an H200 (docs/results-gpu.md) that is 1.5-2% at one request and about half a
step at 16, so on a GPU it suits low concurrency, where a schedule (K by batch size) should turn
it off above a few requests; batching the rows' LightGBM predictions into one call is the first
thing to do before serving it wider.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mcsd_runtime.decisions.copy_length import CopyHistory, CopyLength, features
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.lookup import find_match
from mcsd_runtime.serving.vllm_methods import PROPOSER_ENV

TAIL = 8  # the last tokens of a row's context that recognise its request at the next step


@dataclass
class RowState:
    """One request's copy history, with what recognises it: its context's length and last
    tokens at the last step, the prompt's length and what was proposed."""

    history: CopyHistory
    n_prompt: int
    length: int = 0
    tail: tuple[int, ...] = ()
    proposed: list[int] = field(default_factory=list)

    def continues(self, context: np.ndarray) -> bool:
        """Whether `context` is this request's, some tokens later."""
        n = self.length
        return len(context) > n and tuple(context[max(n - TAIL, 0):n].tolist()) == self.tail


class LearnedLookupProposer:
    """vLLM's custom proposer class over a learned copy length (see the module doc); the policy
    folder comes from the environment variable `MCSD_VLLM_PROPOSER`, which `mcsd eval --engine
    vllm --methods proposer:PATH` sets before vLLM starts its workers."""

    def __init__(self, vllm_config: Any) -> None:
        folder = os.environ.get(PROPOSER_ENV)
        if not folder:
            raise MCSDError(f"set {PROPOSER_ENV} to a folder of `mcsd train --decision copy` "
                            f"before vLLM starts (mcsd eval --methods proposer:PATH does)")
        self.policy = CopyLength.load(folder)
        spec = getattr(vllm_config, "speculative_config", None)
        self.k = int(getattr(spec, "num_speculative_tokens", None) or self.policy.max_copy)
        self.rows: list[RowState | None] = []

    def _state(self, i: int, context: np.ndarray) -> RowState:
        """Row i's request state: kept when the row continues it, else a new request's."""
        while len(self.rows) <= i:
            self.rows.append(None)
        state = self.rows[i]
        if state is None or not state.continues(context):
            state = RowState(self.policy.history(), n_prompt=max(len(context) - 1, 0))
            self.rows[i] = state
        return state

    def _observe(self, state: RowState, sampled: list[int]) -> None:
        """What the last step did with the row's proposal: accepted = committed - 1."""
        if state.length:
            accepted = min(max(len(sampled) - 1, 0), len(state.proposed))
            state.history.update(len(state.proposed), accepted, [])

    def _propose_row(self, state: RowState, context: np.ndarray) -> list[int]:
        ctx = context.tolist()
        match = find_match(ctx, min(self.k, self.policy.max_copy), self.policy.min_ngram,
                           self.policy.max_ngram)
        if match is None:
            return []
        n = self.policy.choose(match, features(match, len(ctx), state.n_prompt, state.history))
        return match.tokens[:n]

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """One draft per row (possibly empty), each at most `num_speculative_tokens` long."""
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a row still in prefill, or not scheduled: nothing to extend
                drafts.append([])
                continue
            context = np.asarray(token_ids_cpu[i, : int(num_tokens_no_spec[i])])
            state = self._state(i, context)
            self._observe(state, sampled)
            draft = self._propose_row(state, context)
            state.length, state.proposed = len(context), draft
            state.tail = tuple(context[max(len(context) - TAIL, 0):].tolist())
            drafts.append(draft)
        del self.rows[len(sampled_token_ids):]  # rows past the batch hold ended requests
        return drafts

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the policy is read at construction."""
