"""Batched decoding (`MCSDDecoder.generate_batch`): up to B sequences per forward.

Each step drafts every row's tree depth by depth with one draft forward per depth for all rows,
verifies all trees with one target forward (a 4D mask per row, explicit position ids), then
verifies and commits each row on its own with its accepted length, exactly as the one-sequence
loop does (`MCSDDecoder._verify`, `_commit_tokens`). Caches are `RowCache`s: each row keeps its
committed prefix, the rest is masked and compacted away after every step. A row that finishes
(EOS, `max_new_tokens`) leaves the batch; with more prompts than B the next one is prefilled
and takes the free slot (continuous batching).

Depth decisions. Every row is drafted to the batch's depth (capped by its own token budget):
padded forwards make a shallower tree no cheaper, so the deeper nodes are free for every row.
After each depth the batch drafts one more if the stopper's `batch_continue(frontiers)` says so
(learned stoppers score all rows in one call), or else if ANY row's own stopper (a copy of the
given one, with its own state) says so. `DecodeConfig(batch_depth="row")` instead gives each row
exactly the tree it would draft alone. A stopper's `for_batch(B)`, when it has one, supplies the
stopper to run at batch size B.

Sampling. Each row samples with its own generator, seeded like `generate`, for the depths it
verifies (nodes past them come from a spare generator), so every row follows the target's
distribution. A sampled row equals that prompt decoded alone (`generate(prompt, seed=...)`,
token for token, step for step) when its trees are the ones it would draft alone: always with
`batch_depth="row"`, and in "max" mode when every row's stopper would choose the batch's depth
(a static stopper: each row drafts its fixed depth, up to its own budget). With an adaptive
stopper in "max" mode a row verifies deeper trees than alone, so it takes other draws and its
tokens differ from the prompt decoded alone (greedy rows still equal it).
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mcsd_runtime.decode_state import (
    DecodeStats,
    Draft,
    DraftFrontier,
    DraftLayer,
    GenerationResult,
    RowState,
    StepRecord,
    causal_bias,
)
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.features import TOP_K_MASS
from mcsd_runtime.row_cache import RowCache

if TYPE_CHECKING:
    from mcsd_runtime.decoder import MCSDDecoder


@dataclass
class BatchResult:
    """One `GenerationResult` per prompt, in the prompts' order (indexable and iterable like a
    list), and the batch's own statistics: tokens of all rows, one target call per step, and
    the batch's wall and prefill seconds (`stats.decode_time` excludes every admission's
    prefill)."""

    results: list[GenerationResult]
    stats: DecodeStats
    batch_size: int

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self):
        return iter(self.results)

    def __getitem__(self, i: int) -> GenerationResult:
        return self.results[i]


@dataclass
class _Row:
    index: int  # the prompt's position in the call
    st: RowState
    stats: DecodeStats = field(default_factory=DecodeStats)
    steps: list[StepRecord] = field(default_factory=list)
    admitted: float = 0.0


class BatchRun:
    """One `generate_batch` call of `dec` at batch size `batch_size`."""

    def __init__(self, dec: MCSDDecoder, batch_size: int) -> None:
        if dec.config.init != "draft":
            raise MCSDError("batched decoding supports init='draft' (lossless) only; decode "
                            "target-initialized runs one at a time (batch size 1)")
        self.dec, self.batch_size = dec, batch_size
        self.cfg, self.tree, self.tt = dec.config, dec.tree, dec.tt
        self.dev, self.dtype = dec.pair.device, dec.pair.dtype
        for_batch = getattr(dec.stopper, "for_batch", None)
        self.stopper = for_batch(batch_size) if for_batch is not None else dec.stopper
        self.batch_decide = (getattr(self.stopper, "batch_continue", None)
                             if self.cfg.batch_depth == "max" else None)
        self.stats = DecodeStats()
        # draws for nodes beyond a row's own depth, which it never verifies: kept off the row's
        # generator so that its draws stay those of the prompt decoded alone
        self.spare = torch.Generator(self.dev)
        self.spare.manual_seed(self.cfg.seed)

    # ------------------------------------------------------------------ the loop
    def run(self, prompts: list[list[int]], seeds: list[int],
            on_result: Callable[[int, GenerationResult], None] | None = None) -> BatchResult:
        queue = deque(range(len(prompts)))
        results: list[GenerationResult | None] = [None] * len(prompts)
        rows: list[_Row] = []
        tc, dc = RowCache(0, self.dev), RowCache(0, self.dev)
        t_start = time.perf_counter()
        while queue or rows:
            if queue and len(rows) < self.batch_size:
                take = [queue.popleft() for _ in range(min(len(queue),
                                                           self.batch_size - len(rows)))]
                rows += self._admit(take, prompts, seeds, tc, dc)
            self._step(rows, tc, dc)
            if any(r.st.done for r in rows):
                now = time.perf_counter()
                for r in rows:
                    if r.st.done:
                        results[r.index] = self._result(r, now)
                        if on_result is not None:
                            on_result(r.index, results[r.index])
                keep = [i for i, r in enumerate(rows) if not r.st.done]
                rows = [rows[i] for i in keep]
                tc.select(keep)
                if self.tree.depth:
                    dc.select(keep)
        self.stats.wall_time = time.perf_counter() - t_start
        self.stats.new_tokens = sum(len(r.token_ids) for r in results)
        return BatchResult(results, self.stats, self.batch_size)

    def _admit(self, take: list[int], prompts: list[list[int]], seeds: list[int],
               tc: RowCache, dc: RowCache) -> list[_Row]:
        """Prefill the prompts `take` (all but each one's last token, which stays pending for
        both models) and append their rows to the batch's caches."""
        t0 = time.perf_counter()
        rows = []
        for i in take:
            ids = prompts[i]
            gen = torch.Generator(self.dev)
            gen.manual_seed(seeds[i])
            stopper = copy.copy(self.stopper)
            stopper.reset()
            st = RowState(committed=list(ids), n_prompt=len(ids), t_cache=None, d_cache=None,
                          t_pending=ids[-1:], d_pending=ids[-1:] if self.tree.depth else [],
                          generator=gen, stopper=stopper)
            rows.append(_Row(i, st, admitted=t0))
        lens = [len(prompts[i]) - 1 for i in take]
        n = max(lens)
        ids = torch.zeros(len(take), n, dtype=torch.long, device=self.dev)
        for r, i in enumerate(take):
            ids[r, : lens[r]] = torch.tensor(prompts[i][:-1], device=self.dev)
        pos = torch.arange(n, device=self.dev).expand(len(take), -1)
        valid = pos < torch.tensor(lens, device=self.dev)[:, None]
        block = causal_bias(n, self.dtype, self.dev)[None]
        models = [(self.dec.pair.target, tc)]
        if self.tree.depth:
            models.append((self.dec.pair.draft, dc))
        for model, cache in models:
            new = RowCache(len(take), self.dev)
            if n:
                self._forward(model, new, ids, pos, block, valid, keep=1)
                new.settle(lens)  # each row's prefix: its prompt but the last token
            cache.extend(new)
        dt = time.perf_counter() - t0
        self.stats.prefill_time += dt
        for r in rows:
            r.stats.prefill_time = dt
        return rows

    # ------------------------------------------------------------------ one step
    def _step(self, rows: list[_Row], tc: RowCache, dc: RowCache) -> None:
        """Draft all rows' trees, verify them in one target forward, commit each row."""
        dec, cfg, tree, tt = self.dec, self.cfg, self.tree, self.tt
        n_rows = len(rows)
        remaining = [cfg.max_new_tokens - (len(r.st.committed) - r.st.n_prompt) for r in rows]
        caps = [min(tree.depth, m - 1) for m in remaining]
        root_pos = torch.tensor([len(r.st.committed) - 1 for r in rows], device=self.dev)
        tokens = torch.zeros(n_rows, 1 + tree.num_nodes, dtype=torch.long, device=self.dev)
        tokens[:, 0] = torch.tensor([r.st.committed[-1] for r in rows], device=self.dev)
        times = {"target": 0.0, "draft": 0.0, "draft_calls": 0}

        # 1. draft, depth by depth
        layers: list[list[DraftLayer]] = [[] for _ in rows]
        depths = [0] * n_rows  # each row's tree depth
        depth = forwarded = cache_base = pending_base = 0
        pending = [len(r.st.d_pending) for r in rows]
        if max(caps) > 0:
            pending_base = dc.length
            q, hidden = self._draft_pending(rows, dc, root_pos, times)
            cache_base = dc.length
            self._add_layers(layers, tokens,
                             self._propose(q[:, None], hidden, 1, None, rows, caps))
            depth = 1
            open_rows = [c > 0 for c in caps]
            while depth < max(caps) and self._continue(rows, layers, depth, caps, open_rows,
                                                       depths):
                nodes = tree.depth_slice(depth)
                out = self._forward(dec.pair.draft, dc, tokens[:, nodes],
                                    root_pos[:, None] + tt.depth[nodes][None],
                                    tt.bias[nodes, 1 : nodes.stop][None], None, times=times,
                                    hidden=dec._needs_hidden)
                forwarded = depth
                q = dec._probs(out.logits)
                h = out.hidden_states[-1] if dec._needs_hidden else None
                parent = torch.stack([rl[-1].log_path for rl in layers])
                own = [caps[i] if open_rows[i] else depths[i] for i in range(n_rows)]
                self._add_layers(layers, tokens,
                                 self._propose(q, h, depth + 1, parent, rows, own))
                depth += 1
            for i in range(n_rows):
                if open_rows[i]:
                    depths[i] = depth
        depths = [max(0, min(d, c)) for d, c in zip(depths, caps, strict=True)]

        # 2. one target forward over every row's pending root and tree
        c = tree.cum[depth]
        target_base = tc.length
        out = self._forward(dec.pair.target, tc, tokens[:, : 1 + c],
                            root_pos[:, None] + tt.depth[: 1 + c][None],
                            tt.bias[: 1 + c, : 1 + c][None], None, times=times)
        logits = out.logits

        # 3. per row: verify, commit, and the cache entries to keep
        keep_t, keep_d, verdicts = [], [], []
        for i, r in enumerate(rows):
            s = depths[i]
            draft = Draft(tokens[i], layers[i][:s], forwarded, cache_base)
            v = dec._verify(r.st, draft, logits[i, : 1 + tree.cum[s]])
            new, path, _ = dec._commit_tokens(r.st, v, remaining[i], forwarded)
            keep_t.append([target_base] + [target_base + j for j in path])
            keep_d.append([pending_base + k for k in range(pending[i])]
                          + [cache_base + j - 1 for j in path if tt.depths[j] <= forwarded]
                          if depth else [])
            verdicts.append((draft, v, new))
        tc.compact(keep_t)
        if self.tree.depth:
            dc.compact(keep_d)

        # 4. account
        self.stats.target_calls += 1
        self.stats.draft_calls += times["draft_calls"]
        for i, r in enumerate(rows):
            draft, v, new = verdicts[i]
            rs = r.stats
            rs.target_calls += 1
            rs.draft_calls += times["draft_calls"]
            rs.target_time += times["target"]
            rs.draft_time += times["draft"]
            dec._learn(r.st, draft, v, new, rs, self.stats, row=r.index)
            r.steps.append(StepRecord(
                drafted=draft.depth, accepted=v.accepted, committed=len(new),
                tree_size=tree.cum[draft.depth], target_cache=tc.lens[i],
                draft_cache=dc.lens[i] if self.tree.depth else 0,
                target_pending=len(r.st.t_pending),
                draft_pending=len(r.st.d_pending)))
        self.stats.target_time += times["target"]
        self.stats.draft_time += times["draft"]

    def _draft_pending(self, rows: list[_Row], dc: RowCache, root_pos: torch.Tensor,
                       times: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed every row its pending draft tokens (right-padded); returns q [rows, V] (and the
        hidden state [rows, 1, H]) at each row's last pending token."""
        dec = self.dec
        counts = [len(r.st.d_pending) for r in rows]
        m = max(counts)
        ids = torch.zeros(len(rows), m, dtype=torch.long, device=self.dev)
        for i, r in enumerate(rows):
            ids[i, : counts[i]] = torch.tensor(r.st.d_pending, device=self.dev)
            r.st.d_pending = []
        n = torch.tensor(counts, device=self.dev)
        offsets = torch.arange(m, device=self.dev)[None]
        pos = root_pos[:, None] - n[:, None] + 1 + offsets.clamp(max=n[:, None] - 1)
        block = causal_bias(m, self.dtype, self.dev)[None]
        out = self._forward(dec.pair.draft, dc, ids, pos, block, offsets < n[:, None],
                            times=times, keep=m, hidden=dec._needs_hidden)
        last = (n - 1)[:, None, None]
        logits = out.logits.gather(1, last.expand(-1, 1, out.logits.shape[-1]))[:, 0]
        hidden = None
        if dec._needs_hidden:
            h = out.hidden_states[-1]
            hidden = h.gather(1, last.expand(-1, 1, h.shape[-1]))
        return dec._probs(logits), hidden

    def _continue(self, rows: list[_Row], layers: list[list[DraftLayer]], depth: int,
                  caps: list[int], open_rows: list[bool], depths: list[int]) -> bool:
        """After `depth`, draft one more? Asks the rows that may still go deeper."""
        ask = [i for i in range(len(rows)) if open_rows[i] and depth < caps[i]]
        if not ask:
            return False
        frontiers = [DraftFrontier(layers[i][depth - 1], depth, self.tree.depth, self.tt,
                                   rows[i].st.trajectory) for i in ask]
        if self.batch_decide is not None:
            return bool(self.batch_decide(frontiers))
        votes = [rows[i].st.stopper.should_continue(f) for i, f in zip(ask, frontiers, strict=True)]
        if self.cfg.batch_depth == "row":
            for i, vote in zip(ask, votes, strict=True):
                if not vote:
                    open_rows[i], depths[i] = False, depth
        return any(votes)

    def _propose(self, q: torch.Tensor, hidden: torch.Tensor | None, d: int,
                 parent_log_path: torch.Tensor | None, rows: list[_Row],
                 own: list[int]) -> list[DraftLayer]:
        """Depth `d`'s candidates for every row from q [rows, m, V]: the one-sequence rule
        (`MCSDDecoder._propose`), the top-k of all rows in one call when greedy. Sampled rows
        draw with their own generator up to their own depth `own[i]`."""
        cfg, k = self.cfg, self.cfg.k_config[d - 1]
        if cfg.temperature != 0:
            return [self.dec._propose(q[i], None if hidden is None else hidden[i], d,
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

    def _add_layers(self, layers: list[list[DraftLayer]], tokens: torch.Tensor,
                    new: list[DraftLayer]) -> None:
        d = len(layers[0]) + 1
        tokens[:, self.tree.depth_slice(d)] = torch.stack([layer.tokens for layer in new])
        for row_layers, layer in zip(layers, new, strict=True):
            row_layers.append(layer)

    # ------------------------------------------------------------------ forwards, results
    def _forward(self, model, cache: RowCache, ids: torch.Tensor, pos: torch.Tensor,
                 block: torch.Tensor, valid: torch.Tensor | None, times: dict | None = None,
                 keep: int = 0, hidden: bool = False):
        """One forward of ids [rows, n] at positions pos over `cache`, timed into `times` (none:
        the prefill). `valid` [rows, n]: which new slots rows may attend to later (None: all)."""
        sync = self.dec._sync
        mask = cache.mask(block, self.dtype)
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=ids, position_ids=pos, attention_mask=mask,
                    past_key_values=cache.cache, use_cache=True, logits_to_keep=keep,
                    output_hidden_states=hidden)
        if sync:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        cache.appended(valid if valid is not None
                       else torch.ones(ids.shape, dtype=torch.bool, device=self.dev))
        if times is not None:
            name = "target" if model is self.dec.pair.target else "draft"
            times[name] += dt
            times["draft_calls"] += name == "draft"
        return out

    def _result(self, r: _Row, now: float) -> GenerationResult:
        new = r.st.committed[r.st.n_prompt:]
        r.stats.new_tokens = len(new)
        r.stats.wall_time = now - r.admitted
        tok = self.dec.pair.tokenizer
        return GenerationResult(new, tok.decode(new) if tok is not None else None, r.steps,
                                r.stats, self.cfg.lossless)

