"""The multi-candidate speculative decoder: draft a tree depth by depth (asking the stopper after
each depth), verify it with one target forward, commit the accepted path, cut both caches.

Cache convention: each model's cache holds the committed tokens except its *pending* ones, which
it has not seen yet and takes in first at its next forward. The target's pending token is the
previous step's bonus token (none with `init="target"`); the draft may also lag by the deepest
accepted node when the last depth was never forwarded through it.

`init="target"` (the paper's target-initialized candidates) is NOT lossless: the first layer of
the tree is the target's own top candidates and the root with the longest accepted continuation
wins, which can differ from the target's choice. Results carry `lossless=False`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

import numpy as np
import torch
from transformers import DynamicCache

from mcsd_runtime import metrics
from mcsd_runtime import verify as V
from mcsd_runtime.constants import DEFAULT_K_CONFIG, INITS, VERIFIERS
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.features import (
    TOP_K_MASS,
    Trajectory,
    decision_matrix,
    node_features,
    with_trajectory,
)
from mcsd_runtime.kv import cache_len, keep_path
from mcsd_runtime.pair import Pair
from mcsd_runtime.stoppers import Stopper, make_stopper
from mcsd_runtime.tree import Tree, TreeTensors, parse_k_config


@dataclass(frozen=True)
class DecodeConfig:
    k_config: tuple[int, ...] = DEFAULT_K_CONFIG  # () decodes autoregressively
    init: str = "draft"  # "target": the paper's target-initialized first layer (lossy)
    temperature: float = 0.0  # 0 = greedy
    verify: str = "mcss"  # sampling verifier: mcss | mcss-replacement | naive
    max_new_tokens: int = 128
    seed: int = 0
    profile: bool = False  # on a GPU, synchronize around forwards to time them
    commit_limit: int | None = None  # commit at most this many tokens a step (dense collection)
    eos_token_ids: tuple[int, ...] | None = None  # None: the target's generation config's

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
        if self.commit_limit is not None and (self.commit_limit < 1 or self.init == "target"):
            raise MCSDError("commit_limit must be >= 1 and needs init='draft'")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise MCSDError(
                f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")

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


class Recorder(Protocol):
    """What the decoder calls after every step (e.g. `collect.recorder.RowRecorder`)."""

    needs_hidden: bool  # the trace carries the draft's hidden states

    def on_step(self, trace: StepTrace) -> None: ...


@dataclass
class _State:
    committed: list[int]
    n_prompt: int
    t_cache: DynamicCache
    d_cache: DynamicCache
    t_pending: list[int]
    d_pending: list[int]
    root_probs: torch.Tensor | None = None  # target-init: target distribution at the root
    trajectory: Trajectory = field(default_factory=Trajectory)
    done: bool = False


@dataclass
class DraftLayer:
    """The nodes of one tree depth and the distributions that proposed them, one per parent."""

    tokens: torch.Tensor  # [n]
    proposal: torch.Tensor  # [m, V], n = m * k
    proposer_hidden: torch.Tensor | None  # [m, H]: the draft's hidden state at each parent
    prob: torch.Tensor  # [n] q(x) under the node's proposal
    log_path: torch.Tensor  # [n] sum of log q along the path from the root
    top: torch.Tensor | None  # [m, TOP_K_MASS] the proposal's largest probabilities (greedy)
    _node_features: torch.Tensor | None = None  # computed when first asked for
    _host: np.ndarray | None = None

    def node_features(self, static: torch.Tensor) -> torch.Tensor:
        """[n, len(NODE_FEATURES)]; `static` [n, 3] are the nodes' rows of the tree's."""
        if self._node_features is None:
            self._node_features = node_features(static, self.prob, self.log_path, self.proposal,
                                                self.top)
        return self._node_features

    def host(self) -> np.ndarray:
        """[n, 2 + TOP_K_MASS] float64 on the host: q(x), log path, the proposal's top-k. One
        device-to-host copy, and no pass over the vocabulary when drafting took the top-k."""
        if self._host is None:
            top = self.top
            if top is None:  # sampled or target-initialized candidates
                top = self.proposal.topk(TOP_K_MASS, dim=-1).values
            top = _per_node(top, self.prob.shape[0])
            self._host = _host(torch.cat([self.prob[:, None], self.log_path[:, None], top], 1))
        return self._host

    def hidden(self) -> torch.Tensor | None:
        """[n, H]: the hidden state that proposed each node, or None if not kept."""
        if self.proposer_hidden is None:
            return None
        return _per_node(self.proposer_hidden, self.prob.shape[0])


@dataclass
class _Draft:
    """The tree drafted in one step."""

    tokens: torch.Tensor  # [1 + num_nodes]: the root (last committed token), then the nodes
    layers: list[DraftLayer] = field(default_factory=list)  # layers[d - 1] holds depth d
    forwarded: int = 0  # deepest depth whose nodes are in the draft cache
    cache_base: int = 0  # draft cache length where depth-1 nodes start

    @property
    def depth(self) -> int:
        return len(self.layers)


@dataclass
class _Verdict:
    """What verification decided: the accepted path and the token after it."""

    path: list[int]  # accepted node indices, root-first (target-init: starting with a root)
    accepted: int  # drafted tokens accepted (target-init: the chosen root is not drafted)
    best: int  # the path's last node
    bonus: int  # the target's token after it (unused with target-init)
    tokens: list[int]  # the tree's tokens on the host, root first
    probs: torch.Tensor | None  # per row: the target's distribution after it, when computed


class DraftFrontier:
    """`stoppers.Frontier` served from the tensors the decoder drafted with."""

    def __init__(self, layer: DraftLayer, depth: int, max_depth: int, tt: TreeTensors,
                 trajectory: Trajectory) -> None:
        self.depth, self.max_depth = depth, max_depth
        self._layer, self._tt, self._trajectory = layer, tt, trajectory
        self._rows = tt.tree.depth_slice(depth)

    def trajectory(self) -> list[float]:
        return self._trajectory.values()

    def features(self) -> torch.Tensor:
        static = self._tt.static_features[self._rows]
        return with_trajectory(self._layer.node_features(static), self.trajectory())

    def decision_features(self) -> np.ndarray:
        return decision_matrix(self._tt.static_host[self._rows], self._layer.host(),
                               self.trajectory())

    def hidden(self) -> torch.Tensor:
        hidden = self._layer.hidden()
        if hidden is None:
            raise MCSDError("no draft hidden state for these nodes: a stopper that reads them "
                            "must set needs_hidden = True, and the first layer of a "
                            "target-initialized tree has none (use init='draft')")
        return hidden


def _host(t: torch.Tensor) -> np.ndarray:
    """A device tensor as a host array (a view on CPU)."""
    return t.detach().cpu().numpy()


def _per_node(rows: torch.Tensor, n: int) -> torch.Tensor:
    """Per-parent rows repeated for each of the parent's `n // len(rows)` children."""
    return rows if rows.shape[0] == n else rows.repeat_interleave(n // rows.shape[0], 0)


def causal_bias(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive [n, n] causal mask: 0 on and below the diagonal, dtype-min above."""
    hidden = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    return torch.zeros(n, n, dtype=dtype, device=device).masked_fill_(
        hidden, torch.finfo(dtype).min)


def _apply_commit_hook(st: _State, step: StepRecord,
                       on_commit: Callable[[list[int]], int | None] | None) -> None:
    if on_commit is None:
        return
    start = len(st.committed) - step.committed
    keep = on_commit(st.committed[start:])
    if keep is not None:
        del st.committed[start + keep:]
        step.committed, st.done = min(step.committed, keep), True


class MCSDDecoder:
    """Greedy or sampled multi-candidate speculative decoding of one sequence at a time."""

    def __init__(self, pair: Pair, config: DecodeConfig | None = None,
                 stopper: Stopper | str | None = None, recorder: Recorder | None = None) -> None:
        self.pair = pair
        self.config = config or DecodeConfig()
        self.stopper = make_stopper(stopper, self.config.k_config)
        self.recorder = recorder
        self.tree = Tree(self.config.k_config)
        self.tt = TreeTensors.build(self.tree, pair.device, pair.dtype)
        if self.tree.depth and max(self.config.k_config) > pair.vocab_size:
            raise MCSDError(f"k-config {self.config.k_config} asks for more candidates than the "
                            f"vocabulary has ({pair.vocab_size})")
        # Target-init: the target proposes the first layer, so it has already seen the root (no
        # bonus token pending) and its verification forward starts at node 1.
        self._target_init = self.config.init == "target"
        self._needs_hidden = self.stopper.needs_hidden or (recorder is not None
                                                           and recorder.needs_hidden)
        n = max(self.tree.num_nodes + 1, 8)
        self._causal = causal_bias(n, pair.dtype, pair.device)
        self._ctx = torch.zeros(n, min(pair.max_positions, 1 << 17), dtype=pair.dtype,
                                device=pair.device)
        self._generator = torch.Generator(pair.device)
        self._sync = pair.device.type != "cpu" and self.config.profile
        eos = self.config.eos_token_ids
        self._eos = set(pair.eos_token_ids if eos is None else eos)
        # (model, new tokens, seconds) of every forward after the prefill, when a list (profiling)
        self.forward_log: list[tuple[str, int, float]] | None = None

    # ----------------------------------------------------------------- public API
    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.pair.tokenizer is None:
                raise MCSDError("this pair has no tokenizer: pass the prompt as token ids")
            ids = self.pair.tokenizer(prompt)["input_ids"]
        else:
            ids = [int(i) for i in prompt]
        if not ids:
            raise MCSDError("empty prompt: pass at least one token")
        if any(i < 0 or i >= self.pair.vocab_size for i in ids):
            raise MCSDError(f"prompt token ids must lie in [0, {self.pair.vocab_size})")
        need = len(ids) + self.config.max_new_tokens
        if need > self.pair.max_positions:
            raise MCSDError(
                f"prompt ({len(ids)} tokens) plus max_new_tokens ({self.config.max_new_tokens}) "
                f"is {need}, beyond the models' {self.pair.max_positions} positions; shorten the "
                f"prompt or lower max_new_tokens")
        return ids

    @torch.inference_mode()
    def generate(self, prompt: str | list[int], seed: int | None = None,
                 on_commit: Callable[[list[int]], int | None] | None = None) -> GenerationResult:
        """Decode one prompt. `on_commit(tokens)`, if given, sees each step's committed tokens;
        returning a count keeps only that many of them and ends the generation (stopping
        criteria, streaming)."""
        ids = self.encode(prompt)
        cfg = self.config
        self._generator.manual_seed(cfg.seed if seed is None else seed)
        self.stopper.reset()
        stats, steps = DecodeStats(), []
        t_start = time.perf_counter()
        st = _State(committed=list(ids), n_prompt=len(ids), t_cache=DynamicCache(),
                    d_cache=DynamicCache(), t_pending=[], d_pending=[])
        logits = self._prefill(st, stats)
        stats.prefill_time = time.perf_counter() - t_start
        if not self.tree.depth:  # AR: the prefill's last logits give the first token
            steps.append(self._first_token(st, stats, logits))
            _apply_commit_hook(st, steps[-1], on_commit)
        while not st.done:
            steps.append(self._step(st, stats))
            _apply_commit_hook(st, steps[-1], on_commit)
        stats.wall_time = time.perf_counter() - t_start
        new = st.committed[st.n_prompt:]
        stats.new_tokens = len(new)
        text = self.pair.tokenizer.decode(new) if self.pair.tokenizer is not None else None
        return GenerationResult(new, text, steps, stats, cfg.lossless)

    # ----------------------------------------------------------------- forwards
    def _forward(self, model, cache: DynamicCache, ids: torch.Tensor, pos: torch.Tensor,
                 block: torch.Tensor, stats: DecodeStats, keep: int = 0, hidden: bool = False,
                 prefill: bool = False):
        """One forward of `ids` at positions `pos` over `cache`, timed (and, after the prefill,
        counted) into `stats`. `block` is the additive mask of the new tokens over the last
        `block.shape[1]` keys; every earlier cache entry is visible."""
        ctx = cache_len(cache) + block.shape[0] - block.shape[1]
        mask = torch.cat([self._ctx[: block.shape[0], :ctx], block], -1) if ctx else block
        if self._sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=ids[None], position_ids=pos[None], attention_mask=mask[None, None],
                    past_key_values=cache, use_cache=True, logits_to_keep=keep,
                    output_hidden_states=hidden)
        if self._sync:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        is_target = model is self.pair.target
        if is_target:
            stats.target_time += dt
        else:
            stats.draft_time += dt
        if not prefill:  # the prefill is timed apart (DecodeStats.prefill_time)
            if is_target:
                stats.target_calls += 1
            else:
                stats.draft_calls += 1
            if self.forward_log is not None:
                self.forward_log.append(("target" if is_target else "draft", ids.shape[0], dt))
        return out

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        t = self.config.temperature or 1.0
        return torch.softmax(logits.float() / t, dim=-1)

    def _causal_block(self, n: int) -> torch.Tensor:
        if n <= self._causal.shape[0]:
            return self._causal[:n, :n]
        return causal_bias(n, self.pair.dtype, self.pair.device)  # a long prompt's prefill

    def _prefill(self, st: _State, stats: DecodeStats) -> torch.Tensor | None:
        """Both models take the prompt but its last token, which stays pending. The target takes
        it too when it must supply the first roots (target-init) or the first token (AR, which
        has no tree to verify); returns the target's last logits then."""
        ids = st.committed
        dev = self.pair.device
        prompt = torch.tensor(ids, device=dev)
        positions = torch.arange(len(ids), device=dev)
        n_t = len(ids) if self._target_init or not self.tree.depth else len(ids) - 1
        logits = None
        if n_t:
            out = self._forward(self.pair.target, st.t_cache, prompt[:n_t], positions[:n_t],
                                self._causal_block(n_t), stats, keep=1, prefill=True)
            logits = out.logits[0, -1:]
            if self._target_init:
                st.root_probs = self._probs(logits)
                stats.target_calls += 1
        st.t_pending = ids[n_t:]
        if self.tree.depth:
            n_d = len(ids) - 1
            if n_d:
                self._forward(self.pair.draft, st.d_cache, prompt[:n_d], positions[:n_d],
                              self._causal_block(n_d), stats, keep=1, prefill=True)
            st.d_pending = ids[n_d:]
        return logits

    def _first_token(self, st: _State, stats: DecodeStats, logits: torch.Tensor) -> StepRecord:
        """AR: commit the first token from the prefill's last logits, as a step would."""
        if self.config.temperature == 0:
            token = int(logits[0].argmax())
        else:
            token = int(V.sample(self._probs(logits), self._generator)[0])
        st.committed.append(token)
        st.t_pending = [token]
        st.done = token in self._eos or self.config.max_new_tokens == 1
        stats.target_calls += 1
        st.trajectory.update(0, 1, 0)
        self.stopper.update(0, 0)
        return StepRecord(drafted=0, accepted=0, committed=1, tree_size=0,
                          target_cache=cache_len(st.t_cache), draft_cache=0, target_pending=1,
                          draft_pending=0)

    # ----------------------------------------------------------------- one step
    def _step(self, st: _State, stats: DecodeStats) -> StepRecord:
        """Draft, verify, commit: one target forward."""
        remaining = self.config.max_new_tokens - (len(st.committed) - st.n_prompt)
        # A step commits up to s + 1 tokens (s with target-init): never draft past the budget.
        s_cap = min(self.tree.depth, remaining if self._target_init else remaining - 1)
        root_pos = len(st.committed) - 1
        draft = self._draft(st, stats, root_pos, s_cap)
        logits = self._target_forward(st, stats, draft, root_pos)
        verdict = self._verify(st, draft, logits)
        committed = self._commit(st, draft, verdict, remaining)
        return self._account(st, stats, draft, verdict, committed)

    # -- 1. draft
    def _draft(self, st: _State, stats: DecodeStats, root_pos: int, s_cap: int) -> _Draft:
        """Draft up to `s_cap` depths, asking the stopper after each one before forwarding it."""
        draft = _Draft(torch.empty(1 + self.tree.num_nodes, dtype=torch.long,
                                   device=self.pair.device))
        draft.tokens[0] = st.committed[-1]
        if s_cap <= 0:
            return draft
        if self._target_init:
            self._add_layer(draft, self._target_roots(st))
        else:
            q, hidden = self._draft_pending(st, stats, draft, root_pos, extra=0)
            self._add_layer(draft, self._propose(q, hidden, 1, None))
        while draft.depth < s_cap and self.stopper.should_continue(DraftFrontier(
                draft.layers[-1], draft.depth, self.tree.depth, self.tt, st.trajectory)):
            q, hidden = self._draft_forward_frontier(st, stats, draft, root_pos)
            self._add_layer(draft, self._propose(q, hidden, draft.depth + 1,
                                                 draft.layers[-1].log_path))
        return draft

    def _propose(self, q: torch.Tensor, hidden: torch.Tensor | None, d: int,
                 parent_log_path: torch.Tensor | None) -> DraftLayer:
        """Depth `d`'s candidates from its parents' draft distributions q [m, V]."""
        cfg, k = self.config, self.config.k_config[d - 1]
        top = None
        if cfg.temperature == 0:  # one top-k pass gives the candidates and the features'
            values, toks = q.topk(max(k, TOP_K_MASS), dim=-1)
            top, toks = values[:, :TOP_K_MASS], toks[:, :k]
        elif cfg.verify == "mcss-replacement":
            toks = V.sample_with_replacement(q, k, self._generator)
        else:
            toks = V.sample_without_replacement(q, k, self._generator)
        prob = q.gather(1, toks).reshape(-1)
        log_path = prob.clamp_min(1e-30).log()
        if parent_log_path is not None:
            log_path = log_path + parent_log_path.repeat_interleave(k)
        return DraftLayer(toks.reshape(-1), q, hidden, prob, log_path, top)

    def _target_roots(self, st: _State) -> DraftLayer:
        """Target-init: the first layer from the target's own distribution at the root."""
        k, p = self.config.k_config[0], st.root_probs
        if self.config.temperature == 0:
            toks = p.topk(k, dim=-1).indices
        else:
            toks = V.sample_without_replacement(p, k, self._generator)
        prob = p.gather(1, toks).view(-1)
        return DraftLayer(toks.view(-1), p, None, prob, prob.clamp_min(1e-30).log(), None)

    def _add_layer(self, draft: _Draft, layer: DraftLayer) -> None:
        draft.layers.append(layer)
        draft.tokens[self.tree.depth_slice(draft.depth)] = layer.tokens

    def _draft_pending(self, st: _State, stats: DecodeStats, draft: _Draft, root_pos: int,
                       extra: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed the draft its pending tokens, plus the first `extra` tree nodes (target-init roots)
        in the same forward; returns q (and the hidden state) at the last pending token, or at
        the roots."""
        dev = self.pair.device
        m = len(st.d_pending)
        pending = torch.tensor(st.d_pending, dtype=torch.long, device=dev)
        first = root_pos - m + 1
        ids, pos, block = pending, torch.arange(first, first + m, device=dev), self._causal_block(m)
        keep = extra or 1
        if extra:
            ids = torch.cat([pending, draft.tokens[1 : 1 + extra]])
            pos = torch.cat([pos, self.tt.depth[1 : 1 + extra] + root_pos])
            block = self._causal_block(m + extra).clone()
            block[m:, m:] = self.tt.bias[1 : 1 + extra, 1 : 1 + extra]
        out = self._forward(self.pair.draft, st.d_cache, ids, pos, block, stats, keep=keep,
                            hidden=self._needs_hidden)
        st.d_pending = []
        draft.cache_base = cache_len(st.d_cache) - extra
        hidden = out.hidden_states[-1][0, -keep:] if self._needs_hidden else None
        return self._probs(out.logits[0, -keep:]), hidden

    def _draft_forward_frontier(self, st: _State, stats: DecodeStats, draft: _Draft,
                                root_pos: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the draft over the deepest drafted depth; returns its nodes' distributions (and
        hidden states): the next depth's proposals."""
        d = draft.depth
        draft.forwarded = d
        if d == 1 and self._target_init:  # the roots go in with the pending tokens
            return self._draft_pending(st, stats, draft, root_pos, extra=self.tree.sizes[0])
        rows = self.tree.depth_slice(d)
        out = self._forward(self.pair.draft, st.d_cache, draft.tokens[rows],
                            self.tt.depth[rows] + root_pos, self.tt.bias[rows, 1 : rows.stop],
                            stats, hidden=self._needs_hidden)
        hidden = out.hidden_states[-1][0] if self._needs_hidden else None
        return self._probs(out.logits[0]), hidden

    # -- 2. one target forward over (the pending root and) the tree
    def _target_forward(self, st: _State, stats: DecodeStats, draft: _Draft,
                        root_pos: int) -> torch.Tensor:
        c, lo = self.tree.cum[draft.depth], int(self._target_init)
        out = self._forward(self.pair.target, st.t_cache, draft.tokens[lo : 1 + c],
                            root_pos + self.tt.depth[lo : 1 + c],
                            self.tt.bias[lo : 1 + c, lo : 1 + c], stats)
        return out.logits[0]

    # -- 3. verify
    def _verify(self, st: _State, draft: _Draft, logits: torch.Tensor) -> _Verdict:
        """Each row's accepted child and next token, then the deepest node whose whole path was
        accepted: one walk on the device, one host copy."""
        tt, c = self.tt, self.tree.cum[draft.depth]
        tokens = draft.tokens[: 1 + c]
        greedy = self.config.temperature == 0
        probs = None
        if not greedy or self.recorder is not None or self._target_init:
            probs = self._probs(logits)
        if self._target_init:  # row 0, the root: the target's distribution from the last step
            probs = torch.cat([st.root_probs, probs])
        if greedy:
            nxt = logits.argmax(-1)
            if self._target_init:
                nxt = torch.cat([st.root_probs.argmax(-1), nxt])
            match = tokens[1:] == nxt[tt.parent[1 : 1 + c]]
        else:
            match, nxt = self._verify_sampled(probs, draft)
        if self._target_init:  # every root the target can produce is a candidate; the longest wins
            match[: self.tree.sizes[0]] = draft.layers[0].prob > 0
        acc = ~(tt.path_matrix[1 : 1 + c, 1 : 1 + c] & ~match).any(-1)
        score = torch.where(torch.cat([acc.new_ones(1), acc]), tt.score[: 1 + c], -1)
        best = score.argmax()
        host = torch.cat([best.view(1), nxt[best].view(1), tokens]).tolist()
        path = tt.paths[host[0]]
        return _Verdict(path=path, accepted=len(path) - int(self._target_init), best=host[0],
                        bonus=host[1], tokens=host[2:], probs=probs)

    def _verify_sampled(self, probs: torch.Tensor, draft: _Draft,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row accepted child and next token for the sampling verifiers."""
        tree, tt = self.tree, self.tt
        c = tree.cum[draft.depth]
        rank_rows, next_rows = [], []
        for d, layer in enumerate(draft.layers, 1):
            if d == 1 and self._target_init:  # the roots are the target's own: nothing to test
                zero = torch.zeros(1, dtype=torch.long, device=probs.device)
                rank_rows.append(zero)
                next_rows.append(zero)
                continue
            rows = slice(0, 1) if d == 1 else tree.depth_slice(d - 1)
            cands = layer.tokens.view(-1, tree.k_config[d - 1])
            rank, nxt = V.verify_children(probs[rows], layer.proposal, cands, self.config.verify,
                                          self._generator)
            rank_rows.append(rank)
            next_rows.append(nxt)
        leaves = tree.depth_slice(draft.depth) if draft.depth else slice(0, 1)
        next_rows.append(V.sample(probs[leaves], self._generator))
        rank = torch.cat(rank_rows) if rank_rows else probs.new_zeros(0, dtype=torch.long)
        match = tt.sibling_rank[1 : 1 + c] == rank[tt.parent[1 : 1 + c]]
        return match, torch.cat(next_rows)

    # -- 4. commit, then cut both caches to the accepted path
    def _commit(self, st: _State, draft: _Draft, v: _Verdict, remaining: int) -> list[int]:
        """Commit the path (and the bonus token), clipped at max_new_tokens, commit_limit and EOS.
        When clipped, the caches keep the committed part of the path and its last token becomes
        the pending one. Returns the committed tokens."""
        cfg, lo = self.config, int(self._target_init)
        new = [v.tokens[j] for j in v.path] + ([] if lo else [v.bonus])
        new = new[: min(remaining, cfg.commit_limit or remaining)]
        path, bonus = v.path, [] if lo else [v.bonus]
        if not lo and len(new) <= len(path):
            path, bonus = path[: len(new) - 1], [new[-1]]
        for i, t in enumerate(new):
            if t in self._eos:
                new = new[: i + 1]
                st.done = True
                break
        st.committed.extend(new)
        if len(st.committed) - st.n_prompt >= cfg.max_new_tokens:
            st.done = True

        # The target saw the pending root (none with target-init) and nodes 1..c.
        base = cache_len(st.t_cache) - (1 + self.tree.cum[draft.depth] - lo)
        keep_path(st.t_cache, base + 1 - lo, [base + j - lo for j in path])
        st.t_pending = bonus
        if lo:  # the next roots come from the target's distribution after the path
            st.root_probs = v.probs[v.best : v.best + 1]
        if self.tree.depth:  # the draft saw the nodes of depths 1..forwarded
            depth, seen = self.tt.depths, draft.forwarded
            if seen:
                keep_path(st.d_cache, draft.cache_base,
                          [draft.cache_base + j - 1 for j in path if depth[j] <= seen])
            st.d_pending += [v.tokens[j] for j in path if depth[j] > seen] + bonus
        return new

    # -- 5. account: recorder, trajectory, stopper, statistics
    def _account(self, st: _State, stats: DecodeStats, draft: _Draft, v: _Verdict,
                 committed: list[int]) -> StepRecord:
        s, c = draft.depth, self.tree.cum[draft.depth]
        roots = self.tree.sizes[0] if self._target_init and s else 0  # the target's, not drafted
        drafted_depth = s - 1 if roots else s
        if self.recorder is not None:
            self.recorder.on_step(self._trace(st, draft, v))
        st.trajectory.update(v.accepted, len(committed), drafted_depth)
        self.stopper.update(drafted_depth, v.accepted)
        stats.drafted_tokens += c - roots
        stats.accepted_tokens += v.accepted
        if drafted_depth:
            stats.drafting_steps += 1
            stats.acceptance_sum += v.accepted / drafted_depth
        return StepRecord(drafted=s, accepted=v.accepted, committed=len(committed), tree_size=c,
                          target_cache=cache_len(st.t_cache), draft_cache=cache_len(st.d_cache),
                          target_pending=len(st.t_pending), draft_pending=len(st.d_pending))

    def _trace(self, st: _State, draft: _Draft, v: _Verdict) -> StepTrace:
        tt, s = self.tt, draft.depth
        c = self.tree.cum[s]
        layers = draft.layers
        empty = v.probs.new_zeros(0)
        feats = [layer.node_features(tt.static_features[self.tree.depth_slice(d)])
                 for d, layer in enumerate(layers, 1)]
        hidden = None
        if self._needs_hidden and s:
            draft_model = self.pair.draft
            hidden = torch.cat([
                h if (h := layer.hidden()) is not None else  # target-init roots: zeros
                torch.zeros(layer.prob.shape[0], draft_model.config.hidden_size,
                            dtype=draft_model.dtype, device=draft_model.device)
                for layer in layers])
        return StepTrace(
            step=st.trajectory.steps, tokens=draft.tokens[: 1 + c],
            node_features=torch.cat(feats) if s else empty,
            trajectory=st.trajectory.values(),
            target_prob=v.probs[tt.parent[1 : 1 + c], draft.tokens[1 : 1 + c]],
            draft_prob=torch.cat([layer.prob for layer in layers]) if s else empty,
            hidden=hidden, path=v.path, accepted=v.accepted, drafted=s)


class ARDecoder(MCSDDecoder):
    """Autoregressive decoding of the target alone, through the same loop and statistics."""

    def __init__(self, pair: Pair, config: DecodeConfig | None = None) -> None:
        config = config or DecodeConfig()
        super().__init__(pair, replace(config, k_config=(), init="draft"))
