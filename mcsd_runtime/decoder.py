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
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from mcsd_runtime import metrics
from mcsd_runtime import verify as V
from mcsd_runtime.constants import INITS, VERIFIERS
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.features import (
    NODE_FEATURES,
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
    k_config: tuple[int, ...] = (4, 2, 2, 1)  # () decodes autoregressively
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


def _host(t: torch.Tensor) -> np.ndarray:
    """A device tensor as a host array (a view on CPU)."""
    return t.detach().cpu().numpy()


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


class _Frontier:
    """The stopper's view of the depth just drafted, before it goes through the draft;
    features are computed only if asked for."""

    def __init__(self, draft_step: _DraftStep, depth: int, max_depth: int) -> None:
        self.draft_step, self.depth, self.max_depth = draft_step, depth, max_depth

    def features(self) -> torch.Tensor:
        return self.draft_step.features(self.depth)

    def decision_features(self) -> np.ndarray:
        """DECISION_FEATURES of the frontier nodes, float64 on the host: no pass over the
        vocabulary beyond drafting's own (greedy), one small copy per depth."""
        return self.draft_step.decision_features(self.depth)

    def hidden(self) -> torch.Tensor:
        """The draft's hidden state that proposed each frontier node (stoppers with
        `uses_hidden`)."""
        return self.draft_step.hidden_at(self.depth)


class MCSDDecoder:
    """Greedy or sampled multi-candidate speculative decoding of one sequence at a time."""

    def __init__(self, pair: Pair, config: DecodeConfig | None = None,
                 stopper: Stopper | str | None = None, recorder=None) -> None:
        self.pair = pair
        self.config = config or DecodeConfig()
        self.stopper = make_stopper(stopper, self.config.k_config)
        self.recorder = recorder
        self.tree = Tree(self.config.k_config)
        self.tt = TreeTensors.build(self.tree, pair.device, pair.dtype)
        if self.tree.depth and max(self.config.k_config) > pair.vocab_size:
            raise MCSDError(f"k-config {self.config.k_config} asks for more candidates than the "
                            f"vocabulary has ({pair.vocab_size})")
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

    # ----------------------------------------------------------------- forwards
    def _forward(self, model, cache: DynamicCache, ids: torch.Tensor, pos: torch.Tensor,
                 block: torch.Tensor, keep: int = 0, hidden: bool = False):
        """One forward of `ids` at positions `pos` over `cache`. `block` is the additive mask of the
        new tokens over the last `block.shape[1]` keys; every earlier cache entry is visible."""
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
        if self.forward_log is not None and ctx:
            name = "target" if model is self.pair.target else "draft"
            self.forward_log.append((name, ids.shape[0], dt))
        return out, dt

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        t = self.config.temperature or 1.0
        return torch.softmax(logits.float() / t, dim=-1)

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
        dev = self.pair.device
        prompt_t = torch.tensor(ids, device=dev)
        positions = torch.arange(len(ids), device=dev)
        # Prefill: the target takes the whole prompt when it must supply the first roots, or the
        # first token (AR: no tree to verify, so no reason to hold the last prompt token back).
        ar = not self.tree.depth
        n_t = len(ids) if cfg.init == "target" or ar else len(ids) - 1
        if n_t:
            out, dt = self._forward(self.pair.target, st.t_cache, prompt_t[:n_t], positions[:n_t],
                                    self._causal_block(n_t), keep=1)
            stats.target_time += dt
            if cfg.init == "target":
                st.root_probs = self._probs(out.logits[0, -1:])
                stats.target_calls += 1
        st.t_pending = ids[n_t:]
        if self.tree.depth:
            n_d = len(ids) - 1
            if n_d:
                _, dt = self._forward(self.pair.draft, st.d_cache, prompt_t[:n_d],
                                      positions[:n_d], self._causal_block(n_d), keep=1)
                stats.draft_time += dt
            st.d_pending = ids[n_d:]
        stats.prefill_time = time.perf_counter() - t_start
        if ar:
            steps.append(self._first_token(st, stats, out.logits[0, -1:]))
            _apply_commit_hook(st, steps[-1], on_commit)
        while not st.done:
            steps.append(self._step(st, stats))
            _apply_commit_hook(st, steps[-1], on_commit)
        stats.wall_time = time.perf_counter() - t_start
        new = st.committed[st.n_prompt:]
        stats.new_tokens = len(new)
        text = self.pair.tokenizer.decode(new) if self.pair.tokenizer is not None else None
        return GenerationResult(new, text, steps, stats, cfg.lossless)

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
        st.trajectory.update(0, 1)
        self.stopper.update(0, 0)
        return StepRecord(drafted=0, accepted=0, committed=1, tree_size=0,
                          target_cache=cache_len(st.t_cache), draft_cache=0, target_pending=1,
                          draft_pending=0)

    def _causal_block(self, n: int) -> torch.Tensor:
        if n <= self._causal.shape[0]:
            return self._causal[:n, :n]
        return causal_bias(n, self.pair.dtype, self.pair.device)  # a long prompt's prefill

    # ----------------------------------------------------------------- one step
    def _step(self, st: _State, stats: DecodeStats) -> StepRecord:
        cfg, tree, tt = self.config, self.tree, self.tt
        target_init = cfg.init == "target"
        remaining = cfg.max_new_tokens - (len(st.committed) - st.n_prompt)
        # A step commits up to s+1 tokens (s with target-init): never draft past the budget.
        s_cap = min(tree.depth, remaining if target_init else remaining - 1)
        root_pos = len(st.committed) - 1
        trace = self.recorder is not None

        # 1. Draft, depth by depth.
        ds = _DraftStep(self, st, stats, root_pos, trace)
        s = ds.run(s_cap)
        c = tree.cum[s]

        # 2. One target forward over (pending root +) the tree.
        tokens = ds.tokens[: 1 + c]
        lo = 1 if target_init else 0
        out, dt = self._forward(self.pair.target, st.t_cache, tokens[lo:],
                                root_pos + tt.depth[lo : 1 + c], tt.bias[lo : 1 + c, lo : 1 + c])
        stats.target_time += dt
        stats.target_calls += 1
        logits = out.logits[0]
        t_cache_before = cache_len(st.t_cache) - (1 + c - lo)

        # 3. Verify: each row's accepted child and next token, then the deepest accepted node.
        greedy = cfg.temperature == 0
        probs = None
        if not greedy or trace or target_init:
            probs = self._probs(logits)
            if target_init:
                probs = torch.cat([st.root_probs, probs])
        parent = tt.parent[1 : 1 + c]
        if greedy:
            arg = logits.argmax(-1)
            if target_init:
                arg = torch.cat([st.root_probs.argmax(-1), arg])
            match, nxt = tokens[1:] == arg[parent], arg
        else:
            match, nxt = self._verify_sampled(probs, ds, s)
        if target_init:  # every root the target can produce is a candidate; the longest wins
            match[: tree.sizes[0]] = ds.prob[1] > 0
        acc = ~(tt.path_matrix[1 : 1 + c, 1 : 1 + c] & ~match).any(-1)
        score = torch.where(torch.cat([acc.new_ones(1), acc]), tt.score[: 1 + c], -1)
        best = score.argmax()
        host = torch.cat([best.view(1), nxt[best].view(1), tokens]).tolist()
        best_i, bonus, tok_host = host[0], host[1], host[2:]
        path = tt.paths[best_i]
        accepted = len(path) - (1 if target_init else 0)
        new_tokens = [tok_host[j] for j in path] + ([] if target_init else [bonus])

        # 4. Commit, clipped at EOS, max_new_tokens and commit_limit. When clipped, the caches keep
        # the committed part of the path and its last token becomes the pending one.
        new_tokens = new_tokens[: min(remaining, cfg.commit_limit or remaining)]
        verified_path = path
        if not target_init and len(new_tokens) <= len(path):
            path, bonus = path[: len(new_tokens) - 1], new_tokens[-1]
        for i, t in enumerate(new_tokens):
            if t in self._eos:
                new_tokens = new_tokens[: i + 1]
                st.done = True
                break
        st.committed.extend(new_tokens)
        if len(st.committed) - st.n_prompt >= cfg.max_new_tokens:
            st.done = True

        # 5. Cut both caches to the accepted path; the rest becomes pending.
        if target_init:
            keep_path(st.t_cache, t_cache_before, [t_cache_before + j - 1 for j in path])
            st.t_pending = []
            st.root_probs = probs[best_i : best_i + 1]
        else:
            keep_path(st.t_cache, t_cache_before + 1, [t_cache_before + j for j in path])
            st.t_pending = [bonus]
        ds.commit(path, tok_host, [] if target_init else [bonus])

        drafted_depth = s - 1 if target_init and s else s
        if trace:
            self.recorder.on_step(ds.make_trace(st.trajectory.steps, probs, verified_path,
                                                accepted, s))
        st.trajectory.update(accepted, len(new_tokens))
        self.stopper.update(drafted_depth, accepted)
        stats.drafted_tokens += c - (tree.sizes[0] if target_init and s else 0)
        stats.accepted_tokens += accepted
        if drafted_depth:
            stats.drafting_steps += 1
            stats.acceptance_sum += accepted / drafted_depth
        return StepRecord(drafted=s, accepted=accepted, committed=len(new_tokens), tree_size=c,
                          target_cache=cache_len(st.t_cache), draft_cache=cache_len(st.d_cache),
                          target_pending=len(st.t_pending), draft_pending=len(st.d_pending))

    def _verify_sampled(self, probs: torch.Tensor, ds: _DraftStep, s: int,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row accepted child and next token for the sampling verifiers."""
        tree, tt = self.tree, self.tt
        c = tree.cum[s]
        rank_rows, next_rows = [], []
        for d in range(1, s + 1):
            rows = slice(0, 1) if d == 1 else tt.tree.depth_slice(d - 1)
            cands = ds.tokens[tt.tree.depth_slice(d)].view(-1, tree.k_config[d - 1])
            q = ds.q_by_depth[d - 1]
            if q is None:  # target-init roots: proposed by the target itself
                rank_rows.append(torch.zeros(1, dtype=torch.long, device=probs.device))
                next_rows.append(torch.zeros(1, dtype=torch.long, device=probs.device))
                continue
            rank, nxt = V.verify_children(probs[rows], q, cands, self.config.verify,
                                          self._generator)
            rank_rows.append(rank)
            next_rows.append(nxt)
        leaves = tt.tree.depth_slice(s) if s else slice(0, 1)
        next_rows.append(V.sample(probs[leaves], self._generator))
        rank = torch.cat(rank_rows) if rank_rows else probs.new_zeros(0, dtype=torch.long)
        match = tt.sibling_rank[1 : 1 + c] == rank[tt.parent[1 : 1 + c]]
        return match, torch.cat(next_rows)


class _DraftStep:
    """The draft phase of one step: tokens, draft distributions and (lazily) features per depth."""

    def __init__(self, dec: MCSDDecoder, st: _State, stats: DecodeStats, root_pos: int,
                 trace: bool) -> None:
        self.dec, self.st, self.stats, self.root_pos, self.trace = dec, st, stats, root_pos, trace
        tree = dec.tree
        dev = dec.pair.device
        self.tokens = torch.empty(1 + tree.num_nodes, dtype=torch.long, device=dev)
        self.tokens[0] = st.committed[-1]
        self.q_by_depth: list[torch.Tensor | None] = [None] * (tree.depth + 1)  # children's q
        self.prob: list[torch.Tensor | None] = [None] * (tree.depth + 1)  # q(x) per node, depth d
        self.log_path: list[torch.Tensor | None] = [None] * (tree.depth + 1)
        self.hidden: list[torch.Tensor | None] = [None] * (tree.depth + 1)
        self.feats: list[torch.Tensor | None] = [None] * (tree.depth + 1)
        self.top: list[torch.Tensor | None] = [None] * (tree.depth + 1)  # top-k of the proposal
        self.host: list[np.ndarray | None] = [None] * (tree.depth + 1)
        self.forwarded = 0  # deepest depth whose nodes are in the draft cache
        self.cache_base = 0  # draft cache length where depth-1 nodes start
        self.want_hidden = (trace and getattr(dec.recorder, "wants_hidden", False)) or getattr(
            dec.stopper, "uses_hidden", False)

    # -- drafting
    def run(self, s_cap: int) -> int:
        """Draft up to `s_cap` depths, asking the stopper after each; returns the depth drafted."""
        dec = self.dec
        if s_cap <= 0:
            return 0
        if dec.config.init == "target":
            self._set_depth(1, *self._roots())
        else:
            q0 = self._forward_pending(extra=0)
            self.q_by_depth[0] = q0
            self._set_depth(1, *self._children(q0, 1))
        d = 1
        while d < s_cap and dec.stopper.should_continue(_Frontier(self, d, dec.tree.depth)):
            self._forward_depth(d)
            self._set_depth(d + 1, *self._children(self.q_by_depth[d], d + 1))
            d += 1
        return d

    def _roots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Target-init: the first layer from the target's own distribution at the root."""
        dec, k = self.dec, self.dec.config.k_config[0]
        p = self.st.root_probs
        if dec.config.temperature == 0:
            toks = p.topk(k, dim=-1).indices
        else:
            toks = V.sample_without_replacement(p, k, dec._generator)
        return toks.view(-1), p.gather(1, toks).view(-1)

    def _children(self, q: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidates for depth `d` from the parents' draft distributions q [n, V]."""
        dec, k = self.dec, self.dec.config.k_config[d - 1]
        if dec.config.temperature == 0:  # one top-k pass gives the candidates and the features'
            top = q.topk(max(k, TOP_K_MASS), dim=-1)
            self.top[d] = top.values[:, :TOP_K_MASS]
            toks = top.indices[:, :k]
        elif dec.config.verify == "mcss-replacement":
            toks = V.sample_with_replacement(q, k, dec._generator)
        else:
            toks = V.sample_without_replacement(q, k, dec._generator)
        return toks.reshape(-1), q.gather(1, toks).reshape(-1)

    def _set_depth(self, d: int, toks: torch.Tensor, prob: torch.Tensor) -> None:
        tt = self.dec.tt
        self.tokens[tt.tree.depth_slice(d)] = toks
        self.prob[d] = prob
        logp = prob.clamp_min(1e-30).log()
        if d > 1:
            k = tt.tree.k_config[d - 1]
            logp = logp + self.log_path[d - 1].repeat_interleave(k)
        self.log_path[d] = logp

    def _forward_pending(self, extra: int) -> torch.Tensor:
        """Feed the draft its pending tokens, plus the first `extra` tree nodes (target-init
        roots) in the same forward; returns q at the last pending token, or at the roots."""
        dec, st = self.dec, self.st
        dev = dec.pair.device
        m = len(st.d_pending)
        pend = torch.tensor(st.d_pending, dtype=torch.long, device=dev)
        first = self.root_pos - m + 1
        block = dec._causal_block(m + extra)
        if extra:
            ids = torch.cat([pend, self.tokens[1 : 1 + extra]])
            pos = torch.cat([torch.arange(first, first + m, device=dev),
                             dec.tt.depth[1 : 1 + extra] + self.root_pos])
            block = block.clone()
            block[m:, m:] = dec.tt.bias[1 : 1 + extra, 1 : 1 + extra]
            keep = extra
        else:
            ids, pos, keep = pend, torch.arange(first, first + m, device=dev), 1
        out, dt = dec._forward(dec.pair.draft, st.d_cache, ids, pos, block, keep=keep,
                               hidden=self.want_hidden)
        self.stats.draft_time += dt
        self.stats.draft_calls += 1
        st.d_pending = []
        self.cache_base = cache_len(st.d_cache) - extra
        if self.want_hidden:
            self.hidden[1 if extra else 0] = out.hidden_states[-1][0, -keep:]
        return dec._probs(out.logits[0, -keep:])

    def _forward_depth(self, d: int) -> None:
        """Run the draft over the nodes of depth `d` (once), giving their children's q."""
        if self.forwarded >= d:
            return
        dec, tt = self.dec, self.dec.tt
        if d == 1 and dec.config.init == "target":
            self.q_by_depth[1] = self._forward_pending(extra=tt.tree.sizes[0])
        else:
            rows = tt.tree.depth_slice(d)
            out, dt = dec._forward(dec.pair.draft, self.st.d_cache, self.tokens[rows],
                                   tt.depth[rows] + self.root_pos,
                                   tt.bias[rows, 1 : rows.stop], hidden=self.want_hidden)
            self.stats.draft_time += dt
            self.stats.draft_calls += 1
            self.q_by_depth[d] = dec._probs(out.logits[0])
            if self.want_hidden:
                self.hidden[d] = out.hidden_states[-1][0]
        self.forwarded = d

    def proposal(self, d: int) -> torch.Tensor:
        """The distributions (one per parent) that proposed the nodes of depth `d`."""
        if d == 1 and self.dec.config.init == "target":
            return self.st.root_probs
        return self.q_by_depth[d - 1]

    def hidden_at(self, d: int, strict: bool = True) -> torch.Tensor:
        """The draft's last hidden state that proposed each node of depth `d` (its parent's);
        target-initialized roots have none: an error, or zeros when not `strict` (recording)."""
        if self.hidden[d - 1] is None:
            if not strict:
                draft = self.dec.pair.draft
                return torch.zeros(self.dec.tree.sizes[0], draft.config.hidden_size,
                                   dtype=draft.dtype, device=draft.device)
            raise MCSDError("the first layer of a target-initialized tree has no draft hidden "
                            "state: use init='draft' with hidden-state stoppers")
        return self.hidden[d - 1].repeat_interleave(self.dec.tree.k_config[d - 1], 0)

    def features(self, d: int) -> torch.Tensor:
        if self.feats[d] is None:
            tt = self.dec.tt
            self.feats[d] = node_features(tt.static_features[tt.tree.depth_slice(d)],
                                          self.prob[d], self.log_path[d], self.proposal(d),
                                          self.top[d])
        return with_trajectory(self.feats[d], self.st.trajectory)

    def decision_features(self, d: int) -> np.ndarray:
        if self.host[d] is None:  # one device -> host copy per depth: q(x), log path, top-k
            top = self.top[d]
            if top is None:  # sampled candidates: one top-k pass for the features
                top = self.proposal(d).topk(TOP_K_MASS, dim=-1).values
            n = self.prob[d].shape[0]
            if top.shape[0] != n:
                top = top.repeat_interleave(n // top.shape[0], 0)
            self.host[d] = _host(torch.cat([self.prob[d][:, None], self.log_path[d][:, None],
                                            top], 1))
        tt = self.dec.tt
        return decision_matrix(tt.static_host[tt.tree.depth_slice(d)], self.host[d],
                               self.st.trajectory.values())

    # -- after verification
    def commit(self, path: list[int], tok_host: list[int], bonus: list[int]) -> None:
        """Cut the draft cache to the accepted nodes it has seen; the rest becomes pending."""
        st, tt = self.st, self.dec.tt
        if not self.dec.tree.depth:
            return
        depth = tt.depths
        seen = [j for j in path if depth[j] <= self.forwarded]
        if self.forwarded:
            keep_path(st.d_cache, self.cache_base, [self.cache_base + j - 1 for j in seen])
        st.d_pending = st.d_pending + [tok_host[j] for j in path if depth[j] > self.forwarded]
        st.d_pending += bonus

    def make_trace(self, step: int, probs: torch.Tensor, path: list[int], accepted: int,
                   s: int) -> StepTrace:
        tt = self.dec.tt
        c = tt.tree.cum[s]
        depths = range(1, s + 1)
        empty = probs.new_zeros(0)
        feats = [self.features(d)[:, : len(NODE_FEATURES)] for d in depths]
        hidden = None
        if self.want_hidden and s:
            hidden = torch.cat([self.hidden_at(d, strict=False) for d in depths])
        return StepTrace(
            step=step, tokens=self.tokens[: 1 + c],
            node_features=torch.cat(feats) if s else empty,
            trajectory=self.st.trajectory.values(),
            target_prob=probs[tt.parent[1 : 1 + c], self.tokens[1 : 1 + c]],
            draft_prob=torch.cat([self.prob[d] for d in depths]) if s else empty,
            hidden=hidden,
            path=path, accepted=accepted, drafted=s)


class ARDecoder(MCSDDecoder):
    """Autoregressive decoding of the target alone, through the same loop and statistics."""

    def __init__(self, pair: Pair, config: DecodeConfig | None = None) -> None:
        config = config or DecodeConfig()
        super().__init__(pair, DecodeConfig(**(asdict(config) | {"k_config": (), "init": "draft"})))
