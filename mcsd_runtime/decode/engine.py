"""The decode loop: one step engine for one sequence (`generate`) or many (`generate_batch`).

A step, over every row of the batch at once (`Engine.step`, one numbered phase each):

0. plan: a row whose context repeats itself (prompt lookup, `DecodeConfig.lookup`) will verify
   the tokens that followed the repeat as a chain, drafting nothing (on the draft's tree when
   its first depths are a chain, else on a chain tree of its own, `Decoding.chain`, beside the
   other rows' trees in the same forward); a row the planner says not to draft at all this
   step verifies an empty tree, as autoregressive decoding does; both keep
   their pending draft tokens for later; then one upload for all rows;
1. propose: the others' pending draft tokens go in, depth 1 is proposed; then, while the
   planner says so, the frontier goes through the draft (one forward for all rows, tree
   attention) and the next depth is proposed (`drafting.TreeDrafter`); then the copied chains
   and a learned width's cuts (`proposers`);
2. one target forward over every row's pending root and tree (a 4D mask, shared or one per
   row where rows lie on different trees; explicit position ids);
3. verify each row's tree on the device, the accepted path and the token after it, then one
   host copy of all rows' verdicts (`verifying.Verifier`);
4. commit each row's tokens, clipped at EOS and at max_new_tokens, and cut both caches to the
   accepted paths;
5. account: recorder, trajectory, stopper, statistics (`accounting.Accounts`).

Cache convention: each model's cache holds the committed tokens except its *pending* ones, which
it takes in first at its next forward. The target's pending token is the previous step's bonus
token; the draft may also lag by accepted nodes of the
last depth, which it never forwarded. Caches are `RowCache`s: a row keeps its committed prefix,
the rest is masked and compacted away after every step. A finished row (EOS, max_new_tokens)
leaves, and the next queued prompt is prefilled into the free slot (continuous batching,
`admission.Admission`).

A feature draft (`mcsd_runtime.distill.feature`) reads the target's final state one position
back: the target's forwards return their states, each row keeps those of its pending draft
tokens, and the draft takes every accepted token again with the target's state (no tree slot of
the draft is kept: its guessed states never stay in its cache); a drafted node reads the draft's
own state at its parent.

Decisions: every decision inside a step goes through one `Planner` (`planning.StepPlanner`):
what each row copies and which rows draft at all (phase 0), which draft each next depth and the
first depth's width (phase 1), how much each verifies, and each row's outcome (phase 5).
Stoppers plan through one adapter (`planning.RowPlanner`): padded forwards make a shallower
tree no cheaper, so every row is drafted to the batch's depth, capped by the new tokens it may
still commit, one depth more while the stopper's `batch_continue(frontiers)` says so, or else
while ANY row's own stopper (a copy of the given one) does; `DecodeConfig(batch_depth="row")`
gives each row exactly the tree its own stopper chooses; a batch of one asks the decoder's
stopper itself. A verification budget is the decoder's planner (`MCSDDecoder(planner=...)`),
choosing every row's tree across the batch.

Layout (`DecodeConfig.batch_layout`): padded, every forward runs each row at the batch's widest;
ragged (`ragged.Ragged`), the target's, the draft's depths and its first forward carry each
row's own tokens only, packed into one sequence, so a row that drafts or verifies less costs
less. Which rows took part in which draft forward is `Drafted.seen`'s business; the caches keep
their padded bookkeeping.

Randomness: each row draws with its own generator (seeded like `generate`); nodes past a row's own
depth draw from a spare one. A sampled row's draws therefore equal those of the prompt decoded
alone whenever its trees do: in row mode, or when every row stops where it would alone (a static
stopper). In the default max mode an adaptive stopper may draft a row deeper than it would go
alone; its draws then differ, while its output still follows the target's distribution.

Host syncs per step, each marked `# sync:`: the verdicts of all rows (one copy), and whatever a
stopper reads to decide (`DraftFrontier`). On a GPU with `DecodeConfig(profile=True)` forwards are
also synchronized to be timed.

Proposers other than the draft's depths (`mcsd_runtime.decode.proposers`, one interface): prompt
lookup's chains (`PromptLookup`) and a learned width's cut of the first depth (`WidthCut`). Each
returns each row's proposal, which the row then verifies (`Drafted.take`).

Target-initialized candidates (the paper's, NOT lossless: `init="target"`) have an engine of
their own (`target_init.TargetInitEngine`, chosen by `MCSDDecoder.engine`), whose phases
override this one's where the target supplies the first layer; nothing here knows of them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mcsd_runtime.decisions.builtin import NoDraftStopper
from mcsd_runtime.decisions.contract import StepStart
from mcsd_runtime.decode.accounting import Accounts, CommitHook
from mcsd_runtime.decode.admission import Admission
from mcsd_runtime.decode.cache import StepCache
from mcsd_runtime.decode.drafting import TreeDrafter
from mcsd_runtime.decode.graphs import ForwardOut
from mcsd_runtime.decode.planning import CopyRule, StepPlanner, open_step, planner_for
from mcsd_runtime.decode.proposers import PromptLookup, Proposer, Proposing, WidthCut
from mcsd_runtime.decode.ragged import packing_for
from mcsd_runtime.decode.records import DecodeStats, GenerationResult
from mcsd_runtime.decode.step_state import Decoding, Draft, Drafted, Row, RowState, Timing, Verdict
from mcsd_runtime.decode.verifying import Verifier
from mcsd_runtime.transfer import upload


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


class Engine:
    """One `generate` / `generate_batch` call of `dec` at batch size `batch_size`."""

    def __init__(self, dec: Decoding, batch_size: int,
                 on_commit: CommitHook | None = None) -> None:
        self.dec, self.batch_size = dec, batch_size
        self.cfg, self.tree, self.tt, self.pair = dec.config, dec.tree, dec.tt, dec.pair
        self.dev, self.dtype = dec.pair.device, dec.pair.dtype
        # a feature draft reads the target's states: the target hands them over at every
        # forward, and the draft takes each accepted token again with the target's state
        self.features = bool(self.tree.depth) and bool(
            getattr(self.pair.draft, "is_feature_draft", False))
        self.packing = packing_for(dec, batch_size)
        self.stopper = dec.stopper.for_batch(batch_size) if batch_size > 1 else dec.stopper
        # which rows draft, extend and verify: the stoppers' (through one adapter) or a budget's;
        # with prompt lookup's copies and a learned width, one planner for every decision
        inner = planner_for(dec.planner, self.stopper, batch_size, self.cfg.batch_depth)
        self.stats = DecodeStats()
        # a learned copy length reads the target's confidence in the tokens it commits
        self.wants_conf = dec.copy_length is not None
        # ...and, trained beside a draft, weighs copying against the stopper's drafted step
        beside_draft = (dec.copy_length is not None and dec.copy_length.draft_costs is not None
                        and self.tree.depth > 0 and not isinstance(self.stopper, NoDraftStopper))
        self.planner = StepPlanner(inner, CopyRule(self.cfg, dec.copy_length, beside_draft),
                                   dec.width)
        self.lookup = PromptLookup(dec)
        # after the draft's depths, in this order: prompt lookup's chains, the learned width
        self.proposers: list[Proposer] = [self.lookup, WidthCut(dec, self.planner.width)]
        self.accounts = Accounts(dec, self.stats, self.planner, [self.lookup], on_commit)
        self.drafter, self.admission, self.verifier = self.phases()

    def phases(self) -> tuple[TreeDrafter, Admission, Verifier]:
        """The draft, admission and verify phases (a subclass's own: `target_init`)."""
        dec, b = self.dec, self.batch_size
        return (TreeDrafter(dec, self.forward, self.planner, self.features, self.packing),
                Admission(dec, self.forward, self.stopper, b, self.features, self.lookup,
                          self.accounts, self.stats),
                Verifier(self.cfg, dec.probs, dec.recorder is not None, self.wants_conf))

    # ------------------------------------------------------------------ the loop
    def run(self, prompts: list[list[int]], seeds: list[int],
            on_result: Callable[[int, GenerationResult], None] | None = None) -> BatchResult:
        queue = deque(range(len(prompts)))
        results: list[GenerationResult | None] = [None] * len(prompts)
        rows: list[Row] = []
        tc, dc = self.dec.forwards.caches(self.batch_size, self.capacity(prompts))
        t_start = time.perf_counter()
        while queue or rows:
            if queue and len(rows) < self.batch_size:
                take = [queue.popleft() for _ in range(min(len(queue),
                                                           self.batch_size - len(rows)))]
                rows += self.admission.admit(take, prompts, seeds, tc, dc)
                rows = self.retire(rows, results, tc, dc, on_result)
            if rows:
                self.step(rows, tc, dc)
                rows = self.retire(rows, results, tc, dc, on_result)
        self.stats.wall_time = time.perf_counter() - t_start
        self.stats.forwards = self.dec.forwards.kind
        done = [r for r in results if r is not None]
        assert len(done) == len(results), "the loop ends when every prompt has retired"
        self.stats.new_tokens = sum(len(r.token_ids) for r in done)
        return BatchResult(done, self.stats, self.batch_size)

    def capacity(self, prompts: list[list[int]]) -> int:
        """Cache slots a row can need: its prompt, its tokens, and a step's forwards past them
        (pending tokens, a tree or a copied chain, and the root)."""
        step = self.tree.num_nodes + self.tree.depth + self.cfg.lookup + 4
        return max(map(len, prompts)) + self.cfg.max_new_tokens + 2 * step

    def retire(self, rows: list[Row], results: list, tc: StepCache, dc: StepCache,
               on_result: Callable[[int, GenerationResult], None] | None) -> list[Row]:
        """Finished rows leave the batch (and its caches); returns the rows that stay."""
        if not any(r.st.done for r in rows):
            return rows
        now = time.perf_counter()
        for r in rows:
            if r.st.done:
                results[r.index] = self.result(r, now)
                if on_result is not None:
                    on_result(r.index, results[r.index])
        keep = [i for i, r in enumerate(rows) if not r.st.done]
        tc.select(keep)
        if self.tree.depth:
            dc.select(keep)
        return [rows[i] for i in keep]

    # ------------------------------------------------------------------ one step
    def step(self, rows: list[Row], tc: StepCache, dc: StepCache) -> None:
        """Plan every row's step, propose all rows' trees, verify them in one target forward,
        commit each row, account."""
        # 0. plan: each row's tokens left, copied chain and draft depth cap; one upload
        remaining, copied, caps = self.plan(rows)
        inputs, at = self.upload(rows, copied, caps)
        timing = Timing()

        # 1. propose: the draft's depths, then the copied chains and the cut widths
        tokens, d, drafts = self.propose(rows, inputs, at, copied, caps, dc, timing)

        # 2. one target forward over every row's pending root and tree
        target_base = tc.length
        counts = [1 + dr.size for dr in drafts]  # each row's own tokens
        out = self.forward(self.pair.target, tc, *self.tree_inputs(tokens, inputs, d, drafts),
                           None, timing, hidden=self.features, counts=counts)

        # 3. verify every row on the device, then one host copy for all of them
        verdicts = self.verifier.verify([r.st for r in rows], drafts, out.logits)

        # 4. per row: commit, and cut both caches to the kept entries
        outcomes = self.commit_rows(rows, verdicts, drafts, d, remaining, out, target_base,
                                    tc, dc)

        # 5. account
        self.accounts.account(rows, outcomes, timing, tc, dc)

    def plan(self, rows: list[Row]) -> tuple[list[int], list[list[int]], list[int]]:
        """Each row's tokens left (max_new_tokens less those committed), the chain prompt lookup
        copies for it (or []) and the depth its tree may reach (0: verify no tree), as
        `planning.open_step` decides them."""
        remaining = self.remaining(rows)
        copied, caps = open_step(self.planner, [r.st for r in rows], remaining, self.tree.depth,
                                 lambda caps: self.starts(rows, caps))
        return remaining, copied, caps

    def remaining(self, rows: list[Row]) -> list[int]:
        """Each row's tokens left: max_new_tokens less those it committed."""
        return [self.cfg.max_new_tokens - (len(r.st.committed) - r.st.n_prompt) for r in rows]

    def starts(self, rows: list[Row], caps: list[int]) -> list[StepStart]:
        """What the planner sees of each row before its step."""
        return [StepStart(self.tree.depth, r.st.trajectory.values(), c, len(r.st.d_pending),
                          r.st) for c, r in zip(caps, rows, strict=True)]

    def propose(self, rows: list[Row], inputs: torch.Tensor, at: int, copied: list[list[int]],
                caps: list[int], dc: StepCache, timing: Timing,
                ) -> tuple[torch.Tensor, Drafted, list[Draft]]:
        """Every row's tree: the draft's depths (`TreeDrafter`), then prompt lookup's chains
        and a learned width's cut. Returns the tree tokens [rows, n] (the root first), the
        draft phase's record and each row's `Draft`."""
        tt = self.tt
        width = 1 + max(self.tree.num_nodes, *map(len, copied))
        tokens = torch.zeros(len(rows), width, dtype=torch.long, device=self.dev)
        tokens[:, 0] = inputs[:, 1]
        d = self.drafter.draft(rows, tokens, inputs, caps, dc, timing)
        step = Proposing(d, inputs[:, at:], [len(c) for c in copied])
        for proposer in self.proposers:
            for i, proposal in enumerate(proposer.propose(step)):
                if proposal is not None:
                    d.take(i, proposal)
                    nodes = torch.cat([layer.tokens for layer in proposal.layers])
                    tokens[i, 1 : 1 + nodes.shape[0]] = nodes
        # each row's tree: the draft's, a copied chain's own (`Decoding.chain`) or a cut width's
        drafts = [Draft(tokens[i], d.layers[i][: d.depths[i]], d.seen(i), d.cache_base,
                        d.copied[i], tt=d.trees.get(i, tt))
                  for i in range(len(rows))]
        return tokens, d, drafts

    def commit_rows(self, rows: list[Row], verdicts: list[Verdict], drafts: list[Draft],
                    d: Drafted, remaining: list[int], out: ForwardOut, target_base: int,
                    tc: StepCache, dc: StepCache) -> list[tuple[Draft, Verdict, list[int]]]:
        """Commit each row's verdict and keep, in both caches, the entries of what it
        committed. Returns each row's (draft, verdict, committed tokens)."""
        keep_t, keep_d, outcomes = [], [], []
        states = out.hidden if self.features else None  # a feature draft's: the target's
        for i, r in enumerate(rows):
            v = verdicts[i]
            new, path = self.commit(r.st, v, remaining[i], d.seen(i), drafts[i])
            if states is not None:  # the new pending tokens' states: the root's, then the path's
                r.st.d_feats.append(states[i, [0, *path]])
            keep_t.append(self.target_keep(target_base, path))
            keep_d.append(self.draft_keep(d, i, path))
            outcomes.append((drafts[i], v, new))
        tc.compact(keep_t)
        if self.tree.depth:
            dc.compact(keep_d)
        return outcomes

    def target_keep(self, base: int, path: list[int]) -> list[int]:
        """The target cache slots a row keeps of the step's forward (which began at `base`):
        its root's and its accepted path's."""
        return [base] + [base + j for j in path]

    def tree_inputs(self, tokens: torch.Tensor, inputs: torch.Tensor, d: Drafted,
                    drafts: list[Draft]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The target's ids, positions and tree mask [rows or 1, n, n] for every row's root and
        tree: the draft's tree's slice when all rows lie on it, else each row's own tree,
        padded (a padding slot sees the root only and nobody sees it)."""
        tt = self.tt
        if all(dr.tt is tt for dr in drafts):
            c = 1 + self.tree.cum[d.depth]
            return tokens[:, :c], inputs[:, :1] + tt.depth[:c][None], tt.bias[:c, :c][None]
        w = 1 + max(dr.size for dr in drafts)
        offsets = torch.zeros(len(drafts), w, dtype=torch.long, device=self.dev)
        block = torch.full((len(drafts), w, w), torch.finfo(self.dtype).min, dtype=self.dtype,
                           device=self.dev)
        block[:, :, 0] = 0
        for i, dr in enumerate(drafts):
            n = min(w, dr.tt.tree.num_nodes + 1)
            offsets[i, :n] = dr.tt.depth[:n]
            block[i, :n, :n] = dr.tt.bias[:n, :n]
        return tokens[:, :w], inputs[:, :1] + offsets, block

    def upload(self, rows: list[Row], copied: list[list[int]], caps: list[int],
               ) -> tuple[torch.Tensor, int]:
        """[rows, 3 + m + n] on the device, in one copy: each row's root position, its last
        committed token, its count of pending draft tokens to feed (ragged: none for a row that
        drafts nothing, which keeps them), those tokens, then its copied chain (each
        right-padded); and where the chains start (3 + m)."""
        m = max(len(r.st.d_pending) for r in rows)
        n = max(map(len, copied))
        feeds = self.drafter.feeds(rows, caps)
        host = [[len(r.st.committed) - 1, r.st.committed[-1], feed,
                 *r.st.d_pending, *[0] * (m - len(r.st.d_pending)), *chain,
                 *[0] * (n - len(chain))]
                for r, chain, feed in zip(rows, copied, feeds, strict=True)]
        # one upload a step (pinned, non-blocking on CUDA: no sync)
        return upload(host, self.dev, torch.long), 3 + m

    def draft_keep(self, d: Drafted, i: int, path: list[int]) -> list[int]:
        """Row i's draft cache slots to keep: its pending tokens, if they went in this step, and
        the accepted nodes the draft has seen."""
        slots = [d.pending_base + k for k in range(d.pending[i])] if d.fed else []
        seen = d.seen(i)  # 0 for a copied chain, whose path may run past the draft's tree
        return slots + [d.cache_base + j - 1 for j in path if seen and self.tt.depths[j] <= seen]

    def commit(self, st: RowState, v: Verdict, remaining: int, forwarded: int,
               draft: Draft) -> tuple[list[int], list[int]]:
        """Commit the path (and the bonus token), clipped at max_new_tokens, commit_limit and
        EOS, and set both models' pending tokens (`forwarded`: the deepest depth the draft has
        seen). When clipped, the caches keep the committed part of the path and its last token
        becomes the pending one. Returns the committed tokens and the path the caches keep."""
        path, bonus = v.path, self.bonus(v)
        new = [v.tokens[j] for j in path] + bonus
        new = new[: min(remaining, self.cfg.commit_limit or remaining)]
        if bonus and len(new) <= len(path):
            path, bonus = path[: len(new) - 1], [new[-1]]
        for i, t in enumerate(new):
            if t in self.dec.eos:
                new = new[: i + 1]
                st.done = True
                break
        st.committed.extend(new)
        if len(st.committed) - st.n_prompt >= self.cfg.max_new_tokens:
            st.done = True
        st.t_pending = bonus
        if self.tree.depth:
            st.d_pending += [v.tokens[j] for j in path if draft.tt.depths[j] > forwarded] + bonus
        return new, path

    def bonus(self, v: Verdict) -> list[int]:
        """The token a row commits after its accepted path: the target's next one."""
        return [v.bonus]

    # ------------------------------------------------------------------ forwards, results
    def forward(self, model, cache: StepCache, ids: torch.Tensor,
                pos: torch.Tensor, block: torch.Tensor, valid: torch.Tensor | None,
                timing: Timing, keep: int = 0, hidden: bool = False, prefill: bool = False,
                prev: torch.Tensor | None = None, counts: list[int] | None = None,
                ) -> ForwardOut:
        """One forward of ids [rows, n] at positions pos over `cache` (through the decoder's
        `forwards`: eager or fixed-shape), timed into `timing`. `block` [rows or 1, n, nb]
        masks the new tokens over the last nb keys (the new ones and the nb - n before them);
        `valid` [rows, n]: which new slots rows may attend to later (None: all); `prev`
        [rows, n, H]: a feature draft's input states; `counts`: each row's real tokens, a
        prefix of its n (with a ragged layout only those go through the model)."""
        sync = self.dec.sync_forwards
        mask = cache.mask(block, self.dtype)
        layout = self.packing.layout(counts, ids.shape[1])
        if sync:
            torch.cuda.synchronize()  # sync: timing forwards on a GPU (profile=True)
        t0 = time.perf_counter()
        out = self.dec.forwards(model, cache, ids, pos, mask, keep, hidden, prev, layout)
        if sync:
            torch.cuda.synchronize()  # sync: as above
        dt = time.perf_counter() - t0
        cache.appended(ids.shape[1], valid)
        is_target = model is self.pair.target
        if is_target:
            timing.target += dt
        else:
            timing.draft += dt
            timing.draft_calls += not prefill
        return out

    def result(self, r: Row, now: float) -> GenerationResult:
        new = r.st.committed[r.st.n_prompt:]
        r.stats.new_tokens = len(new)
        r.stats.wall_time = now - r.admitted
        r.stats.forwards = self.dec.forwards.kind
        tok = self.pair.tokenizer
        text = tok.decode(new) if tok is not None else None
        # one sequence's ids decode to a str (transformers types `decode` as str | list[str])
        return GenerationResult(new, text, r.steps, r.stats, self.cfg.lossless)  # type: ignore[arg-type]

