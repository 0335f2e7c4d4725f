"""The decoder's public records: its configuration (`DecodeConfig`), what it returns (results,
statistics, step records) and the traces recorders see; and the causal mask its forwards share.
The step's own records are `step_state`'s."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from mcsd_runtime import metrics
from mcsd_runtime.constants import BATCH_LAYOUTS, DEFAULT_K_CONFIG, GRAPHS, INITS, VERIFIERS
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.tree import KConfig, parse_k_config

if TYPE_CHECKING:  # what the engine reads of the decoder (`Decoding`)
    pass



@dataclass(frozen=True)
class DecodeConfig:
    # any k-config `parse_k_config` reads; () decodes autoregressively; "4,1/1": see KConfig
    k_config: KConfig = KConfig(DEFAULT_K_CONFIG)
    init: str = "draft"  # "target": the paper's target-initialized first layer (lossy)
    temperature: float = 0.0  # 0 = greedy
    verify: str = "mcss"  # sampling verifier: mcss | mcss-replacement | naive
    max_new_tokens: int = 128
    seed: int = 0
    profile: bool = False  # on a GPU, synchronize around forwards to time them
    commit_limit: int | None = None  # commit at most this many tokens a step (dense collection)
    eos_token_ids: tuple[int, ...] | None = None  # None: the target's generation config's
    # batches: "max" drafts every row as deep as the batch goes (free in a padded forward),
    # "row" gives each row the tree its own stopper chooses, as if decoded alone
    batch_depth: str = "max"
    # batches: "ragged" forwards process each row's own tokens only, packed into one sequence
    # (`mcsd_runtime.decode.ragged`: a row that drafts or verifies less costs less), "padded"
    # every row to the batch's widest (the reference); batches of one are the same either way
    batch_layout: str = "padded"
    # prompt lookup (`mcsd_runtime.decode.proposers`): up to `lookup` tokens copied from the
    # context where its last lookup_min_ngram..lookup_max_ngram tokens occurred before; a step
    # with such a match verifies them instead of asking the stopper (0: off); unless the tree's
    # first `lookup` depths are a chain, the copied chain is verified on a chain tree of its own
    # (in a batch, beside the other rows' trees)
    lookup: int = 0
    lookup_min_ngram: int = 3
    lookup_max_ngram: int = 4
    # forwards of fixed shape over preallocated caches, replayed as CUDA graphs
    # (`mcsd_runtime.decode.graphs`): "auto" on CUDA, "off" eager (the reference path), "on"
    # everywhere (on a CPU the fixed-shape path runs without capture)
    graphs: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "k_config", parse_k_config(self.k_config))
        if self.init not in INITS:
            raise MCSDError(f"unknown init {self.init!r}: use 'draft' (lossless) or 'target'")
        if self.init == "target" and not self.k_config:
            raise MCSDError("init='target' needs a non-empty k-config, e.g. (4, 2, 2, 1)")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise MCSDError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if self.eos_token_ids is not None:
            object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        if self.verify not in VERIFIERS:
            raise MCSDError(f"unknown verifier {self.verify!r}: use one of "
                            f"{', '.join(VERIFIERS)}")
        if self.graphs not in GRAPHS:
            raise MCSDError(f"unknown graphs {self.graphs!r}: use one of {', '.join(GRAPHS)}")
        if self.batch_depth not in ("max", "row"):
            raise MCSDError(f"unknown batch_depth {self.batch_depth!r}: use 'max' or 'row'")
        if self.batch_layout not in BATCH_LAYOUTS:
            raise MCSDError(f"unknown batch_layout {self.batch_layout!r}: use one of "
                            f"{', '.join(BATCH_LAYOUTS)}")
        if self.commit_limit is not None and (self.commit_limit < 1 or self.init == "target"):
            raise MCSDError("commit_limit must be >= 1 and needs init='draft'")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise MCSDError(
                f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.lookup:
            self._check_lookup()

    def _check_lookup(self) -> None:
        if self.lookup < 0:
            raise MCSDError(f"lookup must be >= 0 (0: off), got {self.lookup}")
        if not self.k_config:
            raise MCSDError("prompt lookup copies beside a draft tree: give a k-config (a chain "
                            "such as 1,1,1,1,1,1 with the stopper 'none' copies with the target "
                            "alone)")
        if self.init != "draft":
            raise MCSDError("prompt lookup needs init='draft' (lossless)")
        if not 1 <= self.lookup_min_ngram <= self.lookup_max_ngram:
            raise MCSDError(f"lookup n-gram sizes must satisfy 1 <= min <= max, got "
                            f"{self.lookup_min_ngram} and {self.lookup_max_ngram}")

    @property
    def lossless(self) -> bool:
        return self.init == "draft"


@dataclass
class StepRecord:
    drafted: int  # depths drafted (s)
    accepted: int  # drafted tokens accepted (L)
    committed: int  # tokens committed this step (after EOS / max_new_tokens clipping)
    tree_size: int  # nodes the target verified
    target_cache: int  # cache lengths after the step
    draft_cache: int
    target_pending: int  # committed tokens not yet in each cache
    draft_pending: int
    copied: bool = False  # the tree was a prompt-lookup chain (`drafted` its length), no draft


@dataclass
class DecodeStats:
    """Counts and times of one generation. Forward times are exact on CPU; on a GPU they are
    only measured with `DecodeConfig(profile=True)`, which synchronizes around each forward."""

    new_tokens: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    wall_time: float = 0.0
    prefill_time: float = 0.0  # of wall_time: the prompt's forwards, before the first step
    target_time: float = 0.0
    draft_time: float = 0.0
    acceptance_sum: float = 0.0  # sum over drafting steps of accepted / drafted depth
    drafting_steps: int = 0
    lookup_steps: int = 0  # steps that verified a prompt-lookup chain (drafting no forward)
    forwards: str = "eager"  # how the forwards ran: eager, fixed (shapes) or captured (graphs)

    @property
    def tau(self) -> float:
        return metrics.tau(self.new_tokens, self.target_calls)

    @property
    def acceptance_rate(self) -> float:
        return metrics.acceptance_rate(self.acceptance_sum, self.drafting_steps)

    @property
    def tokens_per_s(self) -> float:
        return metrics.throughput(self.new_tokens, self.wall_time)

    @property
    def decode_time(self) -> float:
        """Seconds after the prefill: what stoppers can change, and what replay models."""
        return self.wall_time - self.prefill_time

    @property
    def forward_fraction(self) -> float:
        return (self.target_time + self.draft_time) / self.wall_time if self.wall_time else 0.0

    def as_dict(self) -> dict:
        return asdict(self) | {"tau": self.tau, "acceptance_rate": self.acceptance_rate,
                               "tokens_per_s": self.tokens_per_s,
                               "forward_fraction": self.forward_fraction}


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str | None
    steps: list[StepRecord]
    stats: DecodeStats
    lossless: bool


@dataclass
class StepTrace:
    """What a recorder sees after each step (device tensors; rows are nodes 1..tree_size)."""

    step: int
    tokens: torch.Tensor  # [1 + c] root then nodes
    node_features: torch.Tensor  # [c, len(NODE_FEATURES)]
    trajectory: list[float]  # trajectory feature values before the step
    target_prob: torch.Tensor  # [c] p_target(x) at the parent
    draft_prob: torch.Tensor  # [c] q(x) at the parent (the proposing distribution)
    hidden: torch.Tensor | None  # [c, H] draft hidden state that proposed each node, if asked
    path: list[int]  # accepted node indices, root-first
    accepted: int
    drafted: int
    row: int = 0  # the prompt's index in a batched call (0 for one sequence)


class Recorder(Protocol):
    """What the decoder calls after every step (e.g. `collect.recorder.RowRecorder`)."""

    needs_hidden: bool  # the trace carries the draft's hidden states

    def on_step(self, trace: StepTrace) -> None: ...


def causal_bias(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive [n, n] causal mask: 0 on and below the diagonal, dtype-min above."""
    hidden = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    return torch.zeros(n, n, dtype=dtype, device=device).masked_fill_(
        hidden, torch.finfo(dtype).min)
