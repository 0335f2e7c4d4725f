"""The toolkit's decisions inside vLLM, as its custom proposer class (`speculative_config =
{"method": "custom_class", "model": "mcsd_runtime.serving.vllm_proposer.MCSDProposer",
"num_speculative_tokens": K}`), configured by `ProposerSpec` in the environment variable
`MCSD_VLLM_PROPOSER` (`mcsd eval --engine vllm --methods proposer:...` sets it):

- `copy`: prompt lookup finds where the context's last tokens occurred before
  (`mcsd_runtime.lookup.find_match`, the policy's n-gram sizes) and the learned copy length
  (`mcsd_runtime.decisions.copy_length.CopyLength`, `mcsd train --decision copy`) chooses how
  many of the tokens that followed to propose;
- `stopper` (with `draft`, the pair's draft model folder): the draft's greedy chain, its depth
  chosen per request and step by a stopper (a built-in spec or a trained stopper folder), through
  `mcsd_runtime.serving.draft_chain`;
- both: a copy where the copy length copies, the draft's chain where it copies nothing (as
  `lookup-learned:PATH+STOPPER` in the toolkit's decoder);
- with a `schedule` (K by batch size, `mcsd train --decision schedule`), each step's drafts are
  at most its K at the number of requests decoding, so that a band of K = 0 turns the class off
  where speculation loses (vLLM's own table does the same for its built-in methods).

Each request gets a draft of its own length, none where neither pays. vLLM verifies the chain,
so decoding stays lossless.

vLLM hands the class the batch's rows, not its requests: `propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu)` with row i's context `token_ids_cpu[i, :num_tokens_no_spec[i]]`
and `sampled_token_ids[i]` the tokens its last step committed. A request's state (copy history,
draft cache) is recognised by its context (the length and last tokens it had), at its row or,
where vLLM moved rows as others ended, at any row of the last step; a context that continues none
starts a new state. So states live only for rows in the batch: memory is bounded by the engine's
`max_num_seqs` (a draft cache holds a request's context: about 6 KB a token for the SmolLM2
pair's 4-layer draft in fp32), and a finished request's state goes with its row.

What it cannot see, and so gives the copy policy as unknown (-1, as at a request's first steps):
the target's confidence in the last tokens (vLLM does not pass the target's probabilities). The
step costs are the ones the policies were trained on (this toolkit's decoder): their choices are
judged end to end in vLLM, not assumed to transfer.

Cost on a GPU: it runs on the host, once per step. The copy length: a NumPy match over each
row's context and one LightGBM prediction per row over at most `num_speculative_tokens` lengths.
Measured on this project's CPU (Intel Xeon Ice Lake, 2.6 GHz, the other core busy; `propose`
timed over 50 steps, the policy of docs/results-vllm.md): 0.26 ms a row at one request (contexts
of 200 tokens), 0.35 ms at 600, 0.27 ms a row at 8 requests and 0.50 ms a row at 16 (8 ms a
step). vLLM waits for it between the GPU's steps, as it does for its own n-gram matcher: at a 135M
target's 16-18 ms step on an H200 (docs/results-gpu.md) that is 1.5-2% at one request and about
half a step at 16, so on a GPU it suits low concurrency, where a schedule (K by batch size)
should turn it off above a few requests; batching the rows' LightGBM predictions into one call is
the first thing to do before serving it wider. The draft's chain runs the draft model one row
and one depth at a time, in the engine's process and on its device: on a GPU that is one small
kernel launch sequence per row and depth, outside vLLM's graphs and its batching, which is why
vLLM's own draft-model method batches the rows; here it is a host loop that suits one or a few
requests.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from mcsd_runtime.decisions.copy_length import CopyHistory, CopyLength
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.serving.draft_chain import DraftChain
from mcsd_runtime.serving.schedule import Schedule

PROPOSER_ENV = "MCSD_VLLM_PROPOSER"  # the ProposerSpec (JSON) the class reads
TAIL = 8  # the last tokens of a row's context that recognise its request at the next step


@dataclass(frozen=True)
class ProposerSpec:
    """What `MCSDProposer` proposes with (module docstring): a copy-length folder, a stopper
    spec with the draft model folder it drafts with and the chain's depth (None: vLLM's K), or
    both; optionally a schedule folder capping each step's drafts by the live batch size."""

    copy: str | None = None
    stopper: str | None = None
    draft: str | None = None
    depth: int | None = None
    schedule: str | None = None

    def __post_init__(self) -> None:
        if not self.copy and not self.stopper:
            raise MCSDError("the proposer needs a copy length, a stopper, or both")
        if self.stopper and not self.draft:
            raise MCSDError("a stopper drafts with a draft model: give its folder")

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> ProposerSpec:
        text = os.environ.get(PROPOSER_ENV)
        if not text:
            raise MCSDError(f"set {PROPOSER_ENV} before vLLM starts (mcsd eval --engine vllm "
                            f"--methods proposer:... does)")
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError) as err:
            raise MCSDError(f"{PROPOSER_ENV}={text!r} is not a proposer spec ({err}): let "
                            f"`mcsd eval --engine vllm --methods proposer:...` set it") from None


@dataclass
class RowState:
    """One request's state (its copy history, its draft chain), with what recognises it: its
    context's length and last tokens at the last step, the prompt's length and what was
    proposed, by which (`copy`, `draft`, or None)."""

    history: CopyHistory | None
    chain: DraftChain | None
    n_prompt: int
    length: int = 0
    tail: tuple[int, ...] = ()
    proposed: list[int] = field(default_factory=list)
    by: str | None = None

    def continues(self, context: np.ndarray) -> bool:
        """Whether `context` is this request's, some tokens later."""
        n = self.length
        return len(context) > n and tuple(context[max(n - TAIL, 0):n].tolist()) == self.tail

    def observe(self, sampled: list[int]) -> None:
        """What the last step did with the row's proposal: accepted = committed - 1. A new
        request's first call follows its prefill, which committed a token without a draft: the
        chain counts it as such a step, as the decoder's first step without a draft counts."""
        if not self.length:
            if self.chain is not None:
                self.chain.observe(0, 0, len(sampled))
            return
        accepted = min(max(len(sampled) - 1, 0), len(self.proposed))
        drafted = len(self.proposed)
        if self.history is not None:
            copied = self.by == "copy"
            self.history.update(drafted if copied else 0, accepted if copied else 0, [])
            if self.by == "draft" and drafted:  # as the decoder: where its stopper drafted
                self.history.drafted(len(sampled))
        if self.chain is not None:
            mine = self.by == "draft"
            self.chain.observe(drafted if mine else 0, accepted if mine else 0, len(sampled))


class MCSDProposer:
    """vLLM's custom proposer class over the toolkit's decisions (module docstring), configured
    by the `ProposerSpec` in `MCSD_VLLM_PROPOSER`."""

    def __init__(self, vllm_config: Any) -> None:
        spec = ProposerSpec.from_env()
        self.policy = CopyLength.load(spec.copy) if spec.copy else None
        sc = getattr(vllm_config, "speculative_config", None)
        default = self.policy.max_copy if self.policy else 1
        self.k = int(getattr(sc, "num_speculative_tokens", None) or default)
        self.stopper, self.model, self.depth = None, None, min(spec.depth or self.k, self.k)
        if spec.stopper:
            self.stopper, self.model = _load_drafting(spec, self.depth, vllm_config)
        self.schedule = Schedule.load(spec.schedule) if spec.schedule else None
        self.rows: list[RowState | None] = []

    def _new_state(self, context: np.ndarray) -> RowState:
        return RowState(self.policy.history() if self.policy else None,
                        DraftChain.start(self.stopper) if self.stopper is not None else None,
                        n_prompt=max(len(context) - 1, 0))

    def _state(self, i: int, context: np.ndarray, claimed: set[int]) -> RowState:
        """Row i's request state: the one of the last step's rows (its own first) that this
        context continues, else a new request's."""
        order = [i] + [j for j in range(len(self.rows)) if j != i]
        for j in order:
            state = self.rows[j] if j < len(self.rows) else None
            if j not in claimed and state is not None and state.continues(context):
                claimed.add(j)
                return state
        return self._new_state(context)

    def _cap(self, live: int) -> int:
        """The most tokens a row may draft this step, `live` requests decoding."""
        return min(self.k, self.schedule.k_for(live)) if self.schedule and live else self.k

    def _propose_row(self, state: RowState, context: np.ndarray, cap: int) -> list[int]:
        ctx = context.tolist()
        if cap < 1:
            state.by = None
            return []
        if self.policy is not None:
            pending = None if state.chain is None else state.chain.pending(ctx)
            if copied := self.policy.copy(ctx, cap, state.n_prompt, state.history, pending):
                state.by = "copy"
                return copied
        if state.chain is None:
            state.by = None
            return []
        state.by = "draft"
        return state.chain.propose(self.model, ctx, min(self.depth, cap))

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """One draft per row (possibly empty), each at most `num_speculative_tokens` long."""
        drafts: list[list[int]] = []
        rows: list[RowState | None] = []
        claimed: set[int] = set()
        cap = self._cap(sum(1 for sampled in sampled_token_ids if sampled))
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a row still in prefill, or not scheduled: nothing to extend
                drafts.append([])
                rows.append(self.rows[i] if i < len(self.rows) else None)
                claimed.add(i)
                continue
            context = np.asarray(token_ids_cpu[i, : int(num_tokens_no_spec[i])])
            state = self._state(i, context, claimed)
            state.observe(sampled)
            draft = self._propose_row(state, context, cap)
            state.length, state.proposed = len(context), draft
            state.tail = tuple(context[max(len(context) - TAIL, 0):].tolist())
            drafts.append(draft)
            rows.append(state)
        self.rows = rows  # states of rows past the batch, or unclaimed, held ended requests
        return drafts

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the policies (and the draft) are read at construction."""


def _load_drafting(spec: ProposerSpec, k: int, vllm_config: Any) -> tuple[Any, Any]:
    """The stopper of `spec` (checked against a chain of `k` depths) and its draft model, on
    the CPU in the engine's dtype (float32 where it names none)."""
    import torch
    from transformers import AutoModelForCausalLM

    from mcsd_runtime.decisions.builtin import make_stopper
    from mcsd_runtime.distill.head import attach_reduced_head
    from mcsd_runtime.serving.draft_export import draft_source

    stopper = make_stopper(spec.stopper, (1,) * k)
    folder = draft_source(spec.draft)
    dtype = getattr(getattr(vllm_config, "model_config", None), "dtype", None)
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except OSError as err:
        raise MCSDError(f"cannot load the draft model {str(folder)!r}: {err}") from None
    return stopper, attach_reduced_head(model, folder).eval()
