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
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from transformers import DynamicCache

from mcsd_runtime import verify as V
from mcsd_runtime.batch import BatchResult, BatchRun
from mcsd_runtime.decode_state import (
    DecodeConfig,
    DecodeStats,
    Draft,
    DraftFrontier,
    DraftLayer,
    GenerationResult,
    Recorder,
    RowState,
    StepRecord,
    StepTrace,
    Verdict,
    causal_bias,
)
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.features import TOP_K_MASS
from mcsd_runtime.kv import cache_len, keep_path
from mcsd_runtime.pair import Pair
from mcsd_runtime.stoppers import Stopper, make_stopper
from mcsd_runtime.tree import Tree, TreeTensors

__all__ = ["ARDecoder", "BatchResult", "DecodeConfig", "DecodeStats", "DraftFrontier", "DraftLayer",
           "GenerationResult", "MCSDDecoder", "Recorder", "StepRecord", "StepTrace",
           "causal_bias"]


def _apply_commit_hook(st: RowState, step: StepRecord,
                       on_commit: Callable[[list[int]], int | None] | None) -> None:
    if on_commit is None:
        return
    start = len(st.committed) - step.committed
    keep = on_commit(st.committed[start:])
    if keep is not None:
        del st.committed[start + keep:]
        step.committed, st.done = min(step.committed, keep), True


def _summed(stats: list[DecodeStats], wall_time: float) -> DecodeStats:
    """The statistics of sequences decoded one after the other, as one run."""
    total = DecodeStats()
    for st in stats:
        for name, value in vars(st).items():
            setattr(total, name, getattr(total, name) + value)
    total.wall_time = wall_time
    return total


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
        st = RowState(committed=list(ids), n_prompt=len(ids), t_cache=DynamicCache(),
                      d_cache=DynamicCache(), t_pending=[], d_pending=[],
                      generator=self._generator, stopper=self.stopper)
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

    @torch.inference_mode()
    def generate_batch(self, prompts: Sequence[str | list[int]], batch_size: int = 8,
                       seeds: Sequence[int] | None = None,
                       on_result: Callable[[int, GenerationResult], None] | None = None,
                       ) -> BatchResult:
        """Decode many prompts, up to `batch_size` of them per forward (`mcsd_runtime.batch`):
        one `GenerationResult` per prompt, in order, plus the batch's statistics. Greedy rows
        equal `generate` of the same prompt. Sampled rows follow the target's distribution,
        each drawing with its own generator (`seeds[i]`, default the config's seed); a sampled
        row equals `generate(prompt, seed=seeds[i])` with `batch_depth="row"` or a static
        stopper, not with an adaptive stopper in the default "max" mode, which verifies deeper
        trees than the prompt alone and so takes other draws. `on_result(i, result)`, if
        given, sees each prompt's result as soon as its row finishes (streaming, progress).
        Recorders see each step's trace with `trace.row = i`. `batch_size=1` decodes one prompt
        after the other with `generate`."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise MCSDError(f"batch_size must be a positive integer, got {batch_size!r}")
        ids = [self.encode(p) for p in prompts]
        if not ids:
            raise MCSDError("no prompts to decode")
        seeds = [self.config.seed] * len(ids) if seeds is None else [int(s) for s in seeds]
        if len(seeds) != len(ids):
            raise MCSDError(f"{len(seeds)} seeds for {len(ids)} prompts: give one per prompt")
        if batch_size == 1:
            t0 = time.perf_counter()
            results = []
            for i, (p, s) in enumerate(zip(ids, seeds, strict=True)):
                results.append(self.generate(p, seed=s))
                if on_result is not None:
                    on_result(i, results[-1])
            return BatchResult(results, _summed([r.stats for r in results],
                                                time.perf_counter() - t0), 1)
        return BatchRun(self, batch_size).run(ids, seeds, on_result)

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

    def _prefill(self, st: RowState, stats: DecodeStats) -> torch.Tensor | None:
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

    def _first_token(self, st: RowState, stats: DecodeStats, logits: torch.Tensor) -> StepRecord:
        """AR: commit the first token from the prefill's last logits, as a step would."""
        if self.config.temperature == 0:
            token = int(logits[0].argmax())
        else:
            token = int(V.sample(self._probs(logits), st.generator)[0])
        st.committed.append(token)
        st.t_pending = [token]
        st.done = token in self._eos or self.config.max_new_tokens == 1
        stats.target_calls += 1
        st.trajectory.update(0, 1, 0)
        st.stopper.update(0, 0)
        return StepRecord(drafted=0, accepted=0, committed=1, tree_size=0,
                          target_cache=cache_len(st.t_cache), draft_cache=0, target_pending=1,
                          draft_pending=0)

    # ----------------------------------------------------------------- one step
    def _step(self, st: RowState, stats: DecodeStats) -> StepRecord:
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
    def _draft(self, st: RowState, stats: DecodeStats, root_pos: int, s_cap: int) -> Draft:
        """Draft up to `s_cap` depths, asking the stopper after each one before forwarding it."""
        draft = Draft(torch.empty(1 + self.tree.num_nodes, dtype=torch.long,
                                   device=self.pair.device))
        draft.tokens[0] = st.committed[-1]
        if s_cap <= 0:
            return draft
        if self._target_init:
            self._add_layer(draft, self._target_roots(st))
        else:
            q, hidden = self._draft_pending(st, stats, draft, root_pos, extra=0)
            self._add_layer(draft, self._propose(q, hidden, 1, None, st.generator))
        while draft.depth < s_cap and st.stopper.should_continue(DraftFrontier(
                draft.layers[-1], draft.depth, self.tree.depth, self.tt, st.trajectory)):
            q, hidden = self._draft_forward_frontier(st, stats, draft, root_pos)
            self._add_layer(draft, self._propose(q, hidden, draft.depth + 1,
                                                 draft.layers[-1].log_path, st.generator))
        return draft

    def _propose(self, q: torch.Tensor, hidden: torch.Tensor | None, d: int,
                 parent_log_path: torch.Tensor | None, gen: torch.Generator) -> DraftLayer:
        """Depth `d`'s candidates from its parents' draft distributions q [m, V]."""
        cfg, k = self.config, self.config.k_config[d - 1]
        top = None
        if cfg.temperature == 0:  # one top-k pass gives the candidates and the features'
            values, toks = q.topk(max(k, TOP_K_MASS), dim=-1)
            top, toks = values[:, :TOP_K_MASS], toks[:, :k]
        elif cfg.verify == "mcss-replacement":
            toks = V.sample_with_replacement(q, k, gen)
        else:
            toks = V.sample_without_replacement(q, k, gen)
        prob = q.gather(1, toks).reshape(-1)
        log_path = prob.clamp_min(1e-30).log()
        if parent_log_path is not None:
            log_path = log_path + parent_log_path.repeat_interleave(k)
        return DraftLayer(toks.reshape(-1), q, hidden, prob, log_path, top)

    def _target_roots(self, st: RowState) -> DraftLayer:
        """Target-init: the first layer from the target's own distribution at the root."""
        k, p = self.config.k_config[0], st.root_probs
        if self.config.temperature == 0:
            toks = p.topk(k, dim=-1).indices
        else:
            toks = V.sample_without_replacement(p, k, st.generator)
        prob = p.gather(1, toks).view(-1)
        return DraftLayer(toks.view(-1), p, None, prob, prob.clamp_min(1e-30).log(), None)

    def _add_layer(self, draft: Draft, layer: DraftLayer) -> None:
        draft.layers.append(layer)
        draft.tokens[self.tree.depth_slice(draft.depth)] = layer.tokens

    def _draft_pending(self, st: RowState, stats: DecodeStats, draft: Draft, root_pos: int,
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

    def _draft_forward_frontier(self, st: RowState, stats: DecodeStats, draft: Draft,
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
    def _target_forward(self, st: RowState, stats: DecodeStats, draft: Draft,
                        root_pos: int) -> torch.Tensor:
        c, lo = self.tree.cum[draft.depth], int(self._target_init)
        out = self._forward(self.pair.target, st.t_cache, draft.tokens[lo : 1 + c],
                            root_pos + self.tt.depth[lo : 1 + c],
                            self.tt.bias[lo : 1 + c, lo : 1 + c], stats)
        return out.logits[0]

    # -- 3. verify
    def _verify(self, st: RowState, draft: Draft, logits: torch.Tensor) -> Verdict:
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
            match, nxt = self._verify_sampled(probs, draft, st.generator)
        if self._target_init:  # every root the target can produce is a candidate; the longest wins
            match[: self.tree.sizes[0]] = draft.layers[0].prob > 0
        acc = ~(tt.path_matrix[1 : 1 + c, 1 : 1 + c] & ~match).any(-1)
        score = torch.where(torch.cat([acc.new_ones(1), acc]), tt.score[: 1 + c], -1)
        best = score.argmax()
        host = torch.cat([best.view(1), nxt[best].view(1), tokens]).tolist()
        path = tt.paths[host[0]]
        return Verdict(path=path, accepted=len(path) - int(self._target_init), best=host[0],
                        bonus=host[1], tokens=host[2:], probs=probs)

    def _verify_sampled(self, probs: torch.Tensor, draft: Draft, gen: torch.Generator,
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
                                          gen)
            rank_rows.append(rank)
            next_rows.append(nxt)
        leaves = tree.depth_slice(draft.depth) if draft.depth else slice(0, 1)
        next_rows.append(V.sample(probs[leaves], gen))
        rank = torch.cat(rank_rows) if rank_rows else probs.new_zeros(0, dtype=torch.long)
        match = tt.sibling_rank[1 : 1 + c] == rank[tt.parent[1 : 1 + c]]
        return match, torch.cat(next_rows)

    # -- 4. commit, then cut both caches to the accepted path
    def _commit(self, st: RowState, draft: Draft, v: Verdict, remaining: int) -> list[int]:
        """Commit the accepted tokens (`_commit_tokens`), then cut both caches to them. Returns
        the committed tokens."""
        new, path, _ = self._commit_tokens(st, v, remaining, draft.forwarded)
        lo = int(self._target_init)
        # The target saw the pending root (none with target-init) and nodes 1..c.
        base = cache_len(st.t_cache) - (1 + self.tree.cum[draft.depth] - lo)
        keep_path(st.t_cache, base + 1 - lo, [base + j - lo for j in path])
        if lo:  # the next roots come from the target's distribution after the path
            st.root_probs = v.probs[v.best : v.best + 1]
        if self.tree.depth and draft.forwarded:  # the draft saw the nodes of depths 1..forwarded
            keep_path(st.d_cache, draft.cache_base,
                      [draft.cache_base + j - 1 for j in path
                       if self.tt.depths[j] <= draft.forwarded])
        return new

    def _commit_tokens(self, st: RowState, v: Verdict, remaining: int,
                       forwarded: int = 0) -> tuple[list[int], list[int], list[int]]:
        """Commit the path (and the bonus token), clipped at max_new_tokens, commit_limit and EOS,
        and set both models' pending tokens (`forwarded`: the deepest depth the draft has seen).
        When clipped, the caches keep the committed part of the path and its last token becomes
        the pending one. Returns the committed tokens, the path the caches keep and the target's
        pending tokens."""
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
        st.t_pending = bonus
        if self.tree.depth:
            st.d_pending += [v.tokens[j] for j in path if self.tt.depths[j] > forwarded] + bonus
        return new, path, bonus

    # -- 5. account: recorder, trajectory, stopper, statistics
    def _account(self, st: RowState, stats: DecodeStats, draft: Draft, v: Verdict,
                 committed: list[int]) -> StepRecord:
        self._learn(st, draft, v, committed, stats)
        s = draft.depth
        return StepRecord(drafted=s, accepted=v.accepted, committed=len(committed),
                          tree_size=self.tree.cum[s], target_cache=cache_len(st.t_cache),
                          draft_cache=cache_len(st.d_cache), target_pending=len(st.t_pending),
                          draft_pending=len(st.d_pending))

    def _learn(self, st: RowState, draft: Draft, v: Verdict, committed: list[int],
               *stats: DecodeStats, row: int = 0) -> None:
        """Tell the recorder, the trajectory, the stopper and each of `stats` how the step
        went."""
        s, c = draft.depth, self.tree.cum[draft.depth]
        roots = self.tree.sizes[0] if self._target_init and s else 0  # the target's, not drafted
        drafted_depth = s - 1 if roots else s
        if self.recorder is not None:
            self.recorder.on_step(self._trace(st, draft, v, row))
        st.trajectory.update(v.accepted, len(committed), drafted_depth)
        st.stopper.update(drafted_depth, v.accepted)
        for counts in stats:
            counts.drafted_tokens += c - roots
            counts.accepted_tokens += v.accepted
            if drafted_depth:
                counts.drafting_steps += 1
                counts.acceptance_sum += v.accepted / drafted_depth

    def _trace(self, st: RowState, draft: Draft, v: Verdict, row: int = 0) -> StepTrace:
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
            hidden=hidden, path=v.path, accepted=v.accepted, drafted=s, row=row)


class ARDecoder(MCSDDecoder):
    """Autoregressive decoding of the target alone, through the same loop and statistics."""

    def __init__(self, pair: Pair, config: DecodeConfig | None = None) -> None:
        config = config or DecodeConfig()
        super().__init__(pair, replace(config, k_config=(), init="draft"))
