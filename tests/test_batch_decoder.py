"""Batched decoding (`generate_batch`) is lossless per row: greedy rows equal the same prompt
decoded alone and the target's own greedy decoding, sampled rows follow the target (under
static, adaptive, learned and whole-batch depth decisions), and rows that draft their own trees
(row mode, static stoppers) equal the prompt alone step for step, sampled ones too.

The batch's own mechanics are checked against a replay from the rows' step records
(`schedule`, `replay_max`): which rows share each step, the depth every step drafts, whom the
stopper is asked about, and the batch's counts."""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_decoder_greedy import prompts, reference
from test_decoder_sampling import (
    ALPHA,
    DRAFTS,
    N_CHECKED,
    PROMPT,
    VOCAB,
    exact_joint,
    micro_pair,
    p_value,
    residual_from_p,
    unguarded_verify,
)

from conftest import make_pair
from mcsd_runtime.decisions.artifact import ArtifactSpec, BatchSetting
from mcsd_runtime.decisions.builtin import StopperBase, make_stopper
from mcsd_runtime.decisions.features import DECISION_FEATURES, SCHEMA_VERSION
from mcsd_runtime.decisions.learned import stopper_from
from mcsd_runtime.decode import speculative_sampling as V
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError

CASES = [((4, 2, 2, 1), "static"), ((4, 2, 2, 1), "heuristic"), ((2, 3), "static:1"),
         ((1, 1, 1, 1), "confidence:0.3"), ((3, 1, 1, 1, 1, 1), "cumprod:0.8")]


@pytest.fixture(scope="module")
def refs(pair):
    return [(p, reference(pair, p, 20)) for p in prompts(pair.vocab_size, n=11, seed=5)]


def schedule(out, batch_size: int) -> list[list[tuple[int, int]]]:
    """The steps of a `generate_batch` call, replayed from its rows' step counts: for each batch
    step, its rows in batch order as (prompt index, the row's step index). Queued prompts take
    the free slots in their order, finished rows leave, the others keep their order."""
    n_steps = [len(r.steps) for r in out]
    queue, rows, done, steps = deque(range(len(n_steps))), [], [0] * len(n_steps), []
    while queue or rows:
        while queue and len(rows) < batch_size:
            rows.append(queue.popleft())
        steps.append([(i, done[i]) for i in rows])
        for i in rows:
            done[i] += 1
        rows = [i for i in rows if done[i] < n_steps[i]]
    return steps


def caps(out, live: list[tuple[int, int]], depth: int, max_new: int) -> list[int]:
    """Each live row's deepest draft at that step: the tree's depth, or one less than the
    tokens its budget has left (a step commits up to depth + 1)."""
    return [min(depth, max_new - sum(s.committed for s in out[i].steps[:j]) - 1)
            for i, j in live]


def replay_max(out, batch_size: int, depth: int, max_new: int, decide):
    """A batch_depth='max' batch replayed from its rows' records: at every step depth 1, then
    one more while some row may go deeper and `decide(depth, rows asked)` says so; a row drafts
    the batch's depth capped by its own. Returns the decisions asked, (depth, rows asked, rows
    in the step), and each row's drafted depths."""
    calls, drafted = [], [[] for _ in out]
    for live in schedule(out, batch_size):
        cap = caps(out, live, depth, max_new)
        d = 1 if max(cap) > 0 else 0
        while 0 < d < max(cap):
            asked = sum(c > d for c in cap)
            calls.append((d, asked, len(live)))
            if not decide(d, asked):
                break
            d += 1
        for (i, _), c in zip(live, cap, strict=True):
            drafted[i].append(max(0, min(d, c)))
    return calls, drafted


def row_steps(steps) -> list[tuple[int, ...]]:
    """What a row's step records share with the prompt decoded alone when its trees are the
    same (the draft may have seen more of a batch's deeper tree: its cache can be longer)."""
    return [(s.drafted, s.accepted, s.committed, s.tree_size, s.target_cache, s.target_pending)
            for s in steps]


@pytest.fixture(scope="module")
def alone(pair, refs):
    """`alone(k_config, stopper)`: each prompt of `refs` decoded alone by that case's decoder,
    decoded once for the module (both batch sizes below compare with it)."""
    done: dict = {}

    def get(k_config, stopper) -> list[list[int]]:
        if (k_config, stopper) not in done:
            dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, max_new_tokens=20),
                              stopper=stopper)
            done[k_config, stopper] = [dec.generate(p).token_ids for p, _ in refs]
        return done[k_config, stopper]

    return get


@pytest.mark.parametrize(("k_config", "stopper"), CASES)
@pytest.mark.parametrize("batch_size", [3, 8])
def test_greedy_rows_equal_alone_and_target(pair, refs, alone, k_config, stopper, batch_size):
    dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, max_new_tokens=20), stopper=stopper)
    out = dec.generate_batch([p for p, _ in refs], batch_size=batch_size)
    assert len(out) == len(refs)
    for (_, ref), res, own in zip(refs, out, alone(k_config, stopper), strict=True):
        assert res.token_ids == ref
        assert res.token_ids == own
    check_batch_stats(out, batch_size, dec.tree.cum)


def check_batch_stats(out, batch_size: int, cum: list[int]) -> None:
    """The batch's counts are its rows' (tokens, drafted and accepted nodes), one target call
    and as many draft calls as the deepest row's depth per batch step; each row counts the
    batch steps it was in; rows admitted together share that admission's prefill seconds, and
    the batch's are the sum of its admissions'."""
    steps, st = schedule(out, batch_size), out.stats
    assert st.new_tokens == sum(len(r.token_ids) for r in out)
    assert st.target_calls == len(steps)
    assert st.tau == st.new_tokens / len(steps)
    depth = [max(out[i].steps[j].drafted for i, j in live) for live in steps]
    assert st.draft_calls == sum(depth)
    for i, r in enumerate(out):
        assert r.stats.new_tokens == len(r.token_ids) == sum(s.committed for s in r.steps)
        assert r.stats.target_calls == len(r.steps)
        assert r.stats.draft_calls == sum(d for live, d in zip(steps, depth, strict=True)
                                          if any(k == i for k, _ in live))
        assert r.stats.drafted_tokens == sum(cum[s.drafted] for s in r.steps)
        assert r.stats.accepted_tokens == sum(s.accepted for s in r.steps)
    assert st.drafted_tokens == sum(r.stats.drafted_tokens for r in out)
    assert st.accepted_tokens == sum(r.stats.accepted_tokens for r in out)
    admissions = [[i for i, j in live if j == 0] for live in steps]
    admissions = [group for group in admissions if group]
    assert len(admissions[0]) == min(batch_size, len(out))
    for group in admissions:
        assert len({out[i].stats.prefill_time for i in group}) == 1
    assert st.prefill_time == sum(out[g[0]].stats.prefill_time for g in admissions) > 0
    assert st.decode_time > 0 and all(r.stats.decode_time > 0 for r in out)
    assert max(r.stats.wall_time for r in out) <= st.wall_time


def test_ar_batches_equal_the_target(pair, refs):
    dec = ARDecoder(pair, DecodeConfig(max_new_tokens=20))
    out = dec.generate_batch([p for p, _ in refs], batch_size=4)
    assert [r.token_ids for r in out] == [ref for _, ref in refs]
    assert all(s.drafted == 0 and s.committed == 1 for r in out for s in r.steps)
    check_batch_stats(out, 4, dec.tree.cum)
    assert out.stats.draft_calls == 0


def test_rows_finish_at_different_steps_on_eos_inside_accepted_paths():
    """A target with an EOS token: rows stop where alone they stop, often inside an accepted
    path, and the freed slots take the next prompts."""
    eos_pair = make_pair(vocab=16, eos=3, seed=2, noise=0.01)
    ps = prompts(16, n=9, seed=1)
    dec = MCSDDecoder(eos_pair, DecodeConfig(k_config=(2, 2, 1), max_new_tokens=30))
    alone = [dec.generate(p) for p in ps]
    out = dec.generate_batch(ps, batch_size=4)
    assert [r.token_ids for r in out] == [r.token_ids for r in alone]
    assert [r.token_ids for r in out] == [reference(eos_pair, p, 30)[: len(r.token_ids)]
                                         for p, r in zip(ps, out, strict=True)]
    ended = [r for r in out if r.token_ids[-1] == 3]
    lengths = {len(r.token_ids) for r in ended}
    assert len(ended) >= 3 and len(lengths) >= 2  # EOS rows, ending at different lengths
    # EOS inside an accepted path: the step that committed it accepted more than it committed
    assert any(r.steps[-1].accepted + 1 > r.steps[-1].committed for r in ended)


def test_row_depth_gives_each_row_its_own_steps(pair, refs):
    """batch_depth='row': every row's steps (depths, accepted, committed, target cache) equal
    those of the prompt decoded alone (the draft may have seen more of the path: its cache can
    be longer); 'max' drafts deeper and needs no more steps."""
    cfg = DecodeConfig(k_config=(3, 2, 1, 1), max_new_tokens=20)
    ps = [p for p, _ in refs]
    alone = MCSDDecoder(pair, cfg, stopper="heuristic")
    solo = [alone.generate(p).steps for p in ps]
    row = MCSDDecoder(pair, DecodeConfig(**{**vars(cfg), "batch_depth": "row"}),
                      stopper="heuristic").generate_batch(ps, batch_size=4)
    own = lambda steps: [(s.drafted, s.accepted, s.committed, s.tree_size, s.target_cache,  # noqa: E731
                          s.target_pending) for s in steps]
    assert [own(r.steps) for r in row] == [own(st) for st in solo]
    deep = MCSDDecoder(pair, cfg, stopper="heuristic").generate_batch(ps, batch_size=4)
    assert sum(s.drafted for r in deep for s in r.steps) > sum(s.drafted for st in solo
                                                               for s in st)
    assert sum(len(r.steps) for r in deep) <= sum(len(st) for st in solo)


def test_cache_holds_each_row_exactly(pair, refs):
    """After every step a row's caches hold its committed tokens but the pending ones."""
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(4, 2, 2, 1), max_new_tokens=20),
                      stopper="heuristic")
    ps = [p for p, _ in refs]
    for prompt, res in zip(ps, dec.generate_batch(ps, batch_size=5), strict=True):
        total = len(prompt)
        for s in res.steps:
            total += s.committed
            assert s.target_cache == total - s.target_pending
            assert s.draft_cache == total - s.draft_pending


class Counting(StopperBase):
    """Counts how many sequences asked it, through `copy` (one copy per row)."""

    def __init__(self) -> None:
        self.inner, self.copies = make_stopper("heuristic"), [0]

    def __copy__(self):
        new = Counting()
        new.inner, new.copies = copy.copy(self.inner), self.copies
        self.copies[0] += 1
        return new

    def reset(self) -> None:
        self.inner.reset()

    def should_continue(self, frontier) -> bool:
        return self.inner.should_continue(frontier)

    def update(self, drafted: int, accepted: int) -> None:
        self.inner.update(drafted, accepted)


class BatchVote(StopperBase):
    """A batch decision: continue while at least `n` rows are asked; records what it saw."""

    def __init__(self, n: int) -> None:
        self.n, self.seen, self.sizes = n, [], []

    def for_batch(self, batch_size: int) -> BatchVote:
        self.sizes.append(batch_size)
        return self

    def should_continue(self, frontier) -> bool:
        raise AssertionError("a batch decision never asks rows one by one")

    def batch_continue(self, frontiers) -> bool:
        self.seen.append((frontiers[0].depth, len(frontiers)))
        return len(frontiers) >= self.n


def test_each_row_runs_its_own_stopper_copy(pair, refs):
    stopper = Counting()
    ps = [p for p, _ in refs]
    out = MCSDDecoder(pair, DecodeConfig(max_new_tokens=20), stopper=stopper).generate_batch(
        ps, batch_size=4)
    assert stopper.copies[0] == len(ps)
    assert [r.token_ids for r in out] == [ref for _, ref in refs]


def test_batch_continue_decides_for_all_rows(pair, refs):
    vote = BatchVote(3)
    ps = [p for p, _ in refs]
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(2, 2, 2), max_new_tokens=20), stopper=vote)
    out = dec.generate_batch(ps, batch_size=4)
    assert vote.sizes == [4]
    assert {n for _, n in vote.seen} >= {1, 4}  # the full batch, then its tail
    # every step's depth follows the vote: deeper while >= 3 rows may still go deeper
    calls, drafted = replay_max(out, 4, 3, 20, lambda _d, asked: asked >= 3)
    assert vote.seen == [(d, asked) for d, asked, _ in calls]
    assert [[s.drafted for s in r.steps] for r in out] == drafted
    assert {d for row in drafted for d in row} >= {1, 2, 3}
    assert [r.token_ids for r in out] == [ref for _, ref in refs]


class Scripted(StopperBase):
    """A whole-batch decision that answers its script, call after call; records the depth
    and the number of rows of every call."""

    def __init__(self, answers: list[bool]) -> None:
        self.answers, self.calls, self.sizes = answers, [], []

    def for_batch(self, batch_size: int) -> Scripted:
        self.sizes.append(batch_size)
        return self

    def should_continue(self, frontier) -> bool:
        raise AssertionError("a batch decision never asks rows one by one")

    def batch_continue(self, frontiers) -> bool:
        assert len({f.depth for f in frontiers}) == 1
        self.calls.append((frontiers[0].depth, len(frontiers)))
        return self.answers[len(self.calls) - 1]


def test_each_step_drafts_the_depth_batch_continue_says(pair, refs):
    """A scripted batch decision: every step drafts exactly as deep as it said (capped by each
    row's tree and budget), and it is asked after each depth about exactly the rows that may
    go deeper: rows at their cap (a nearly spent budget) are left out."""
    answers = (torch.rand(500, generator=torch.Generator().manual_seed(4)) < 0.7).tolist()
    script = Scripted(answers)
    ps = [p for p, _ in refs]
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(2, 2, 1, 1), max_new_tokens=20),
                      stopper=script)
    out = dec.generate_batch(ps, batch_size=4)
    assert script.sizes == [4]
    said = iter(answers)
    calls, drafted = replay_max(out, 4, 4, 20, lambda _d, _n: next(said))
    assert script.calls == [(d, asked) for d, asked, _ in calls], "asked other rows or depths"
    assert [[s.drafted for s in r.steps] for r in out] == drafted, "drafted other depths"
    # the script stopped steps at every depth, and rows at their cap sat some decisions out
    assert {d for row in drafted for d in row} >= {1, 2, 3, 4}
    assert any(asked < live for _, asked, live in calls)
    assert [r.token_ids for r in out] == [ref for _, ref in refs]


class CapCheck(StopperBase):
    """Always drafts on; logs (depth, the row's cap) of every frontier it is asked about, the
    cap computed from the frontier: the tree's depth, or the budget the row has left."""

    def __init__(self, max_new: int, log: list) -> None:
        self.max_new, self.log = max_new, log

    def should_continue(self, frontier) -> bool:
        generated = int(frontier.trajectory()[0])  # tokens_generated
        self.log.append((frontier.depth,
                         min(frontier.max_depth, self.max_new - generated - 1)))
        return True


@pytest.mark.parametrize("batch_depth", ["max", "row"])
def test_rows_at_their_cap_are_not_asked(pair, refs, batch_depth):
    """Each row's own stopper is asked after each depth below its cap, and never at it: a row
    whose budget is nearly spent does not vote while the others draft deeper."""
    log: list[tuple[int, int]] = []
    ps = [p for p, _ in refs]
    cfg = DecodeConfig(k_config=(2, 2, 1, 1), max_new_tokens=13, batch_depth=batch_depth)
    out = MCSDDecoder(pair, cfg, stopper=CapCheck(13, log)).generate_batch(ps, batch_size=4)
    assert [r.token_ids for r in out] == [ref[:13] for _, ref in refs]
    assert all(depth < cap for depth, cap in log), "a row at its cap was asked"
    calls, drafted = replay_max(out, 4, 4, 13, lambda _d, _n: True)
    assert [d for d, _ in log] == [d for d, asked, _ in calls for _ in range(asked)]
    assert [[s.drafted for s in r.steps] for r in out] == drafted
    assert any(asked < live for _, asked, live in calls)  # some rows at their cap sat out


class TraceRows:
    """A recorder that keeps the row of every step trace, in order."""

    needs_hidden = False

    def __init__(self) -> None:
        self.rows: list[int] = []

    def on_step(self, trace) -> None:
        self.rows.append(trace.row)


def test_queued_prompts_join_in_order_length_one_prompts_too(pair):
    """More prompts than rows, some of one token (nothing to prefill, alone or in a group):
    queued prompts take freed slots in their order (the recorder sees each step's rows in
    batch order, the results arrive as rows finish), and every row equals the prompt decoded
    alone and the target."""
    ps = prompts(pair.vocab_size, n=10, seed=8)
    for i in (1, 4, 6, 7, 9):
        ps[i] = ps[i][:1]
    rec, finished = TraceRows(), []
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(3, 2, 1), max_new_tokens=12),
                      stopper="heuristic", recorder=rec)
    out = dec.generate_batch(ps, batch_size=3, on_result=lambda i, _r: finished.append(i))
    steps = schedule(out, 3)
    assert rec.rows == [i for live in steps for i, _ in live], "rows entered in another order"
    assert finished == [i for live in steps for i, j in live if j == len(out[i].steps) - 1]
    alone = MCSDDecoder(pair, DecodeConfig(k_config=(3, 2, 1), max_new_tokens=12),
                        stopper="heuristic")
    for p, res in zip(ps, out, strict=True):
        assert res.token_ids == alone.generate(p).token_ids == reference(pair, p, 12)
    # length-1 prompts were prefilled beside longer ones, and alone into a running batch
    assert [len(ps[i]) for i, _ in steps[0]] == [11, 1, 6]
    assert [1] in [[len(ps[i]) for i, j in live if j == 0] for live in steps[1:]]


def test_batch_errors(pair):
    dec = MCSDDecoder(pair, DecodeConfig(max_new_tokens=4))
    with pytest.raises(MCSDError, match="batch_size"):
        dec.generate_batch([[1, 2]], batch_size=0)
    with pytest.raises(MCSDError, match="seeds"):
        dec.generate_batch([[1, 2], [3]], batch_size=2, seeds=[1])
    with pytest.raises(MCSDError, match="empty prompt"):
        dec.generate_batch([[1, 2], []], batch_size=2)
    with pytest.raises(MCSDError, match="init='draft'"):
        MCSDDecoder(pair, DecodeConfig(init="target")).generate_batch([[1], [2]], batch_size=2)
    with pytest.raises(MCSDError, match="batch_depth"):
        DecodeConfig(batch_depth="min")


# ---------------------------------------------------------------------------- sampling
def sampled_batch(pair, n: int = N_CHECKED, batch_size: int = 8, temperature: float = 1.0,
                  k_config: tuple[int, ...] = (3, 2), stopper="heuristic",
                  batch_depth: str = "max"):
    dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, temperature=temperature,
                                         max_new_tokens=3, batch_depth=batch_depth),
                      stopper=stopper)
    return dec.generate_batch([PROMPT] * n, batch_size=batch_size, seeds=list(range(n)))


def joint_counts(out) -> torch.Tensor:
    """How often each pair of first two tokens came out."""
    counts = torch.zeros(VOCAB * VOCAB)
    for res in out:
        x1, x2 = res.token_ids[:2]
        counts[x1 * VOCAB + x2] += 1
    return counts


def batch_counts(pair, **kw) -> torch.Tensor:
    return joint_counts(sampled_batch(pair, **kw))


def test_sampled_rows_follow_the_target_and_a_biased_verifier_fails(monkeypatch):
    micro = micro_pair()
    exact = exact_joint(micro, 1.0)
    assert p_value(batch_counts(micro), exact) > ALPHA
    monkeypatch.setattr(V, "verify_children", residual_from_p)
    assert p_value(batch_counts(micro), exact) < ALPHA


DRAFT_PROB = DECISION_FEATURES.index("draft_prob")


class FirstCandidate(StopperBase):
    """Drafts on while the frontier's first (sampled) candidate has draft probability >= 0.5:
    rows of one prompt draft different depths, as their draws go."""

    def should_continue(self, frontier) -> bool:
        return bool(frontier.decision_features()[0, DRAFT_PROB] >= 0.5)


class FirstRowDecides(FirstCandidate):
    """A whole-batch decision (`batch_continue`): the first asked row's frontier decides."""

    def for_batch(self, batch_size: int) -> FirstRowDecides:
        return self

    def should_continue(self, frontier) -> bool:
        raise AssertionError("a batch decision never asks rows one by one")

    def batch_continue(self, frontiers) -> bool:
        return FirstCandidate.should_continue(self, frontiers[0])


@pytest.fixture(scope="module")
def lightgbm_folder(tmp_path_factory):
    """A tiny LightGBM stopper for (3, 2) trees, trained here on made-up rows to score a node
    high when it is its parent's first candidate and has draft probability above 0.5."""
    import lightgbm as lgb

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(600, len(DECISION_FEATURES)))
    rank = DECISION_FEATURES.index("sibling_rank")
    x[:, rank] = rng.integers(0, 3, 600)
    y = ((x[:, rank] == 0) & (x[:, DRAFT_PROB] > 0.5)).astype(float)
    booster = lgb.train({"objective": "binary", "num_leaves": 4, "verbose": -1, "seed": 0,
                         "num_threads": 1, "min_data_in_leaf": 5},
                        lgb.Dataset(x, y, feature_name=list(DECISION_FEATURES)),
                        num_boost_round=20)
    folder = tmp_path_factory.mktemp("lightgbm")
    booster.save_model(str(folder / "model.txt"))
    ArtifactSpec(kind="lightgbm", schema_version=SCHEMA_VERSION,
                 feature_names=DECISION_FEATURES, aggregation="max", threshold=0.5,
                 k_config=(3, 2)).write(folder)
    return folder


# kind -> (batch depth, batch size); the stopper is built in the test
ADAPTIVE = {"lightgbm-row": ("row", 64), "lightgbm-batch": ("max", 16),
            "batch_continue": ("max", 64)}


@pytest.mark.parametrize("kind", list(ADAPTIVE))
def test_sampled_rows_under_adaptive_depths_follow_the_target(kind, lightgbm_folder,
                                                              monkeypatch):
    """Sampled batches whose rows draft depths chosen on their draws stay exact: a learned
    (LightGBM) stopper asked row by row (row mode), the same stopper deciding for the batch
    (its `batch` table: continue while the asked rows' mean score is >= 0.5, one model call),
    a whole-batch `batch_continue`. The biased verifier fails the same test."""
    if kind == "batch_continue":
        stopper = FirstRowDecides()
    else:
        table = {8: BatchSetting(threshold=0.5, aggregation="max", row_aggregation="mean")}
        stopper = stopper_from(ArtifactSpec.read(lightgbm_folder), lightgbm_folder,
                               batch=table)
    batch_depth, batch_size = ADAPTIVE[kind]
    micro = micro_pair()
    exact = exact_joint(micro, 1.0)
    out = sampled_batch(micro, batch_size=batch_size, stopper=stopper, batch_depth=batch_depth)
    first = [r.steps[0].drafted for r in out]
    assert set(first) == {1, 2} and 0.1 < first.count(1) / len(first) < 0.9
    assert p_value(joint_counts(out), exact) > ALPHA
    monkeypatch.setattr(V, "verify_children", residual_from_p)
    out = sampled_batch(micro, batch_size=batch_size, stopper=stopper, batch_depth=batch_depth)
    assert p_value(joint_counts(out), exact) < ALPHA


@pytest.mark.parametrize("draft_kind", ["one-hot", "sharp-T0.2"])
def test_batched_rows_stay_exact_under_degenerate_drafts(draft_kind, monkeypatch):
    """A one-hot draft, and a sharp draft at temperature 0.2: proposals with fewer non-zero
    tokens than the tree has slots, in batches; the unguarded verifier fails the same test."""
    _, temperature, k_config = DRAFTS[draft_kind]
    pair = micro_pair(draft_kind)
    exact = exact_joint(pair, temperature)
    assert p_value(batch_counts(pair, temperature=temperature, k_config=k_config), exact) > ALPHA
    monkeypatch.setattr(V, "verify_children", unguarded_verify)
    assert p_value(batch_counts(pair, temperature=temperature, k_config=k_config), exact) < ALPHA


@pytest.mark.parametrize(("batch_depth", "stopper", "temperature"), [
    ("max", "static", 0.8), ("max", "static:2", 0.8), ("max", "static", 0.0),
    ("row", "heuristic", 0.8), ("row", "confidence:0.3", 0.8)])
def test_rows_drafting_their_own_trees_equal_the_prompt_alone(pair, refs, batch_depth, stopper,
                                                               temperature):
    """Where each row drafts the trees it would alone (batch_depth='row', or a static stopper
    in 'max' mode) it is the prompt decoded alone: the same tokens, and the same steps (depth,
    accepted, committed, cache). A sampled row draws with its own generator, seeded like
    `generate`, only for the depths it verifies, whatever the batch around it."""
    cfg = DecodeConfig(k_config=(4, 2, 1), temperature=temperature, max_new_tokens=16,
                       batch_depth=batch_depth)
    dec = MCSDDecoder(pair, cfg, stopper=stopper)
    ps = [p for p, _ in refs]
    seeds = [11 * i for i in range(len(ps))]
    out = dec.generate_batch(ps, batch_size=4, seeds=seeds)
    alone = [dec.generate(p, seed=s) for p, s in zip(ps, seeds, strict=True)]
    assert [r.token_ids for r in out] == [a.token_ids for a in alone]
    assert [row_steps(r.steps) for r in out] == [row_steps(a.steps) for a in alone]
    if batch_depth == "row":  # the rows' own trees differ from step to step
        assert {s.drafted for a in alone for s in a.steps} >= {1, 2, 3}


class HiddenLog(StopperBase):
    """Reads the draft's hidden states (needs_hidden): logs each frontier's depth and hidden()
    in its own list (one per sequence: `reset` starts it) and decides on them."""

    needs_hidden = True

    def __init__(self, log: list) -> None:
        self.log, self.mine = log, []

    def reset(self) -> None:
        self.mine = []
        self.log.append(self.mine)

    def should_continue(self, frontier) -> bool:
        hidden = frontier.hidden()
        self.mine.append((frontier.depth, hidden.clone()))
        return bool(hidden[:, 0].max() > 0)


def test_a_stopper_reading_hidden_states_sees_each_row_its_own(pair, refs):
    """A stopper that reads the draft's hidden states (an MLP on them) sees in a batch, row by
    row, the hidden states the prompt alone gives it: rows of different pending lengths and
    depths gathered apart, never another row's or a padding slot's."""
    ps = [p for p, _ in refs]
    cfg = DecodeConfig(k_config=(2, 2, 2, 1), max_new_tokens=16)
    alone_log: list = []
    alone = MCSDDecoder(pair, cfg, stopper=HiddenLog(alone_log))
    solo = [alone.generate(p) for p in ps]
    log: list = []
    row = MCSDDecoder(pair, replace(cfg, batch_depth="row"), stopper=HiddenLog(log))
    out = row.generate_batch(ps, batch_size=4)
    assert len(log) == len(alone_log) == len(ps)
    for mine, theirs in zip(log, alone_log, strict=True):
        # up to the first difference, then the lengths
        for (d, h), (d_alone, h_alone) in zip(mine, theirs, strict=False):
            assert d == d_alone
            assert torch.allclose(h, h_alone, rtol=0, atol=1e-9), "another row's hidden state"
        assert len(mine) == len(theirs)
    assert [r.token_ids for r in out] == [r.token_ids for r in solo]
    assert [row_steps(r.steps) for r in out] == [row_steps(r.steps) for r in solo]
    decided = [h[:, 0].max() > 0 for mine in alone_log for _, h in mine]
    assert any(decided) and not all(decided)  # the hidden states steered the depths
