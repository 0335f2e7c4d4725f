"""Replay of batches (`train.replay.replay(batch_size=B)`): batch size 1 is the replay of one
sequence at a time, unchanged; hand-made walks whose batched steps, costs and decisions are
known; the step lookahead (`oracle` above batch size 1) and the bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_train_data import dense_rows

import replay as R
from mcsd_runtime.decisions.artifact import ArtifactSpec
from mcsd_runtime.decisions.builtin import StopperBase, make_stopper
from mcsd_runtime.decisions.features import NODE_FEATURES, Trajectory
from mcsd_runtime.decisions.learned import load_stopper, stopper_from
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import BatchCosts, CostProfile
from mcsd_runtime.pricing.step_model import FIRST_PENDING, step_forwards, step_outcome
from mcsd_runtime.tree import Tree
from replay.data import NO_NODES, _Frontier

FIXTURES = Path(__file__).parent / "fixtures" / "stoppers-b8df3aa"
PROFILE = CostProfile(tokens=[1, 8, 64], target_s=[1.0, 1.1, 2.0], draft_s=[0.2, 0.22, 0.4],
                      step_overhead_s=0.05, depth_overhead_s=0.01,
                      batches={4: BatchCosts(target_s=[1.5, 2.5, 9.0], draft_s=[0.3, 0.4, 1.0],
                                             step_overhead_s=0.08, depth_overhead_s=0.02)})


@pytest.fixture(scope="module")
def data() -> R.ReplayData:
    return R.ReplayData(dense_rows())


def reference_replay(data: R.ReplayData, stopper, profile: CostProfile,
                     decision_s: float = 0.0) -> dict:
    """The replay of one sequence at a time as it was before batches (commit 65a02a8), kept
    here as the reference batch size 1 must reproduce; since then a stopper may also draft
    nothing at a step (`should_draft`)."""
    res = R.ReplayResult(stopper="reference", mode=data.mode)
    tree, depth = data.tree, data.depth
    for p in data.prompts.values():
        stopper.reset()
        traj, pending, t = Trajectory(), FIRST_PENDING, 0
        while t < p.new_tokens:
            step = p.by_position.get(t)
            s = 0
            if step and stopper.should_draft(_Frontier(0, depth, NO_NODES, traj.values(), None,
                                                       step.accepted, (p.key, t, 0))):
                s = 1
                while s < step.cap:
                    fr = _Frontier(s, depth, step.nodes[s - 1], traj.values(), None,
                                     step.accepted, (p.key, step.position, s))
                    go = stopper.should_continue(fr)
                    res.decisions += fr.read
                    if not go:
                        break
                    s += 1
            out = step_outcome(step.accepted if step else 0, s, pending, p.new_tokens - t)
            forwards = step_forwards(tree, s, pending)
            res.cost_s += profile.step_seconds(tree, s, pending)
            res.draft_forwards += len(forwards.draft)
            res.tokens += out.committed
            res.steps += 1
            res.accepted += out.accepted
            res.drafted_depth += s
            res.drafted_tokens += forwards.target - 1
            res.target_tokens += forwards.target
            if s:
                res.acceptance_sum += out.accepted / s
                res.drafting_steps += 1
            traj.update(out.accepted, out.committed, s)
            stopper.update(s, out.accepted)
            t += out.committed
            pending = out.pending
    res.cost_s += decision_s * res.decisions
    return res.as_dict()


SAME = ("tokens", "steps", "accepted", "drafted_depth", "drafted_tokens", "target_tokens",
        "draft_forwards", "decisions", "cost_s", "acceptance_sum", "drafting_steps")


@pytest.mark.parametrize("spec", ["static:1", "static:3", "heuristic", "confidence:0.3",
                                  "cumprod:0.9", "entropy", "switch:0.7:3:2", "learned",
                                  "learned-gated", "learned-skip"])
def test_batch_size_one_is_the_replay_of_one_sequence_at_a_time(data, spec):
    """Every count and the seconds, to the last bit, for built-in and learned stoppers (the
    learned one decides through `batch_continue` at batch size 1)."""
    def build():
        if spec == "learned":
            return load_stopper(FIXTURES / "lightgbm", threshold=0.3)
        if spec == "learned-gated":
            return load_stopper(FIXTURES / "lightgbm", threshold=0.2, min_depth=3,
                                min_depth_gate=0.5)
        if spec == "learned-skip":
            return load_stopper(FIXTURES / "lightgbm", threshold=0.3, skip_rate=0.7)
        return make_stopper(spec)

    data = data.subset(list(data.prompts)[: len(data.prompts) // 2])  # half: 9 prompts
    got = R.replay(data, build(), PROFILE, decision_s=1e-4).as_dict()
    want = reference_replay(data, build(), PROFILE, decision_s=1e-4)
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}
    assert got["batch_steps"] == got["steps"] and got["batch_size"] == 1
    if spec.startswith("learned"):
        assert 0 < got["decisions"] < got["drafted_depth"]  # it decided, and skipped some
    if "skip" in spec or spec.startswith("switch"):
        assert 0 < got["drafting_steps"] < got["steps"]  # some steps drafted nothing


def test_batch_size_one_oracle_is_unchanged(data):
    plan = R.optimal_plan(data, PROFILE)
    got = R.replay(data, "oracle", PROFILE).as_dict()
    want = reference_replay(data, R.PlanStopper(plan), PROFILE)
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}


# ------------------------------------------------------------------ hand-made walks
def walk_data(lengths: dict[str, list[int]], k_config: tuple[int, ...],
              new_tokens: dict[str, int], budget: dict[str, int] | None = None,
              ) -> R.ReplayData:
    """A dense replay by hand: prompt -> accepted length of the full-depth step at each
    position. An output the budget ended (`budget` absent or equal to its length) has no step
    at its last position, where the budget leaves nothing to draft; one that ended early, as at
    an EOS (`budget[key]` > `new_tokens[key]`), has a step at every position, drafted as deep as
    the budget allows (`budget - t - 1`), its commits clipped at the output's end."""
    tree = Tree(k_config)
    data = object.__new__(R.ReplayData)
    data.tree, data.depth, data.mode, data.prompts = tree, tree.depth, "exact", {}
    for key, accepted in lengths.items():
        n = new_tokens[key]
        room = (budget or {}).get(key, n)
        assert room >= n and len(accepted) == (n if room > n else n - 1), key
        steps = []
        for t in range(len(accepted)):
            cap = min(tree.depth, room - t - 1)
            nodes = [np.full((tree.sizes[d], len(NODE_FEATURES)), t + 0.01 * d, np.float32)
                     for d in range(cap)]
            steps.append(R.Step(t, accepted[t], cap, nodes))
        data.prompts[key] = R.Prompt(key, steps, {s.position: s for s in steps}, n)
    return data


# target at B rows: 10 B per token per row beyond the first's 1; draft 1 per token per row
LINEAR = CostProfile(tokens=[1, 2, 4], target_s=[1.0, 2.0, 4.0], draft_s=[0.1, 0.2, 0.4],
                     batches={2: BatchCosts(target_s=[10.0, 20.0, 40.0],
                                            draft_s=[1.0, 2.0, 4.0])})


def test_continuous_batching_by_hand():
    """k = (1,), every draft accepted, static:1, B = 2, prompts of 3, 7 and 5 tokens: 5 steps
    of the batch. Step 1 drafts both rows from one pending token each (1 + 20); step 2 A has one
    token left (cap 0) while B drafts from 2 pending (2 + 20), A leaves, C takes its slot; steps
    3 and 4 draft C and B (2 + 20 each: the most pending of any drafting row); step 5 is C's last
    token alone, no drafting: one target forward of 1 token at 1 row (1)."""
    data = walk_data({"a": [1] * 2, "b": [1] * 6, "c": [1] * 4}, (1,), {"a": 3, "b": 7, "c": 5})
    r = R.replay(data, "static:1", LINEAR, batch_size=2)
    assert (r.tokens, r.batch_steps, r.steps) == (15, 5, 2 + 4 + 3)
    assert r.cost_s == pytest.approx(21 + 22 + 22 + 22 + 1)
    assert r.draft_forwards == 4 and r.drafted_depth == 1 + 3 + 2  # A, B, C drafting steps
    one = R.replay(data, "static:1", LINEAR)  # one at a time: 9 steps, costs at one row
    assert (one.tokens, one.batch_steps) == (15, 9)


def test_rows_get_the_batchs_depth_for_free():
    """Rows accept 3 and 0 at every step of a chain of depth 3. The deep row's stopper wants
    depth 3, the flat row's depth 1: with ANY the batch drafts 3, so the flat row's tree is 3
    deep as well wherever its budget allows (it accepts nothing of it); a batch_continue stopper
    that says no keeps both at depth 1."""
    class Wants(StopperBase):
        def should_continue(self, frontier):
            return frontier.oracle_accepted > 0  # row 0 (accepts 3) wants more, row 1 not

    data = walk_data({"deep": [3] * 48, "flat": [0] * 12}, (1, 1, 1), {"deep": 49, "flat": 13})
    r = R.replay(data, Wants(), LINEAR, batch_size=2)
    deep = R.replay(data.subset(["deep"]), Wants(), LINEAR)
    flat = R.replay(data.subset(["flat"]), Wants(), LINEAR)
    assert r.tokens == deep.tokens + flat.tokens == 62
    assert deep.drafted_depth == 12 * 3 and flat.drafted_depth == 12  # alone: 1 (0 at the end)
    # together the flat row drafts 3 at positions 0..9, then its cap: 2, 1, 0
    assert r.drafted_depth == 36 + 10 * 3 + 2 + 1
    assert r.accepted == deep.accepted + flat.accepted  # the flat row's extra depths are wasted

    calls: list[int] = []

    class Never(StopperBase):
        def should_continue(self, frontier):
            raise AssertionError("a batch stopper is asked once for the batch")

        def batch_continue(self, frontiers):
            calls.append(len(frontiers))
            return False

    r = R.replay(data, Never(), LINEAR, batch_size=2)
    assert r.drafted_depth == r.steps - 2  # depth 1, but 0 at each prompt's last token
    # one call per step: both rows while the flat one's cap is 2 or more (positions 0..10)
    assert calls[:11] == [2] * 11 and set(calls[11:]) == {1}
    assert r.decisions == 0  # it never read a frontier: no decision cost


def test_only_rows_that_can_draft_deeper_are_asked():
    """A row whose budget caps it below the batch's depth is not asked (its cap), and the
    batch drafts on for the others."""
    asked: list[list[str]] = []

    class Record(StopperBase):
        def should_continue(self, frontier):
            return True

        def batch_continue(self, frontiers):
            asked.append(sorted(f.key[0] for f in frontiers))
            return True

    data = walk_data({"long": [3] * 20, "short": [3] * 3}, (1, 1, 1), {"long": 21, "short": 4})
    R.replay(data, Record(), LINEAR, batch_size=2)
    # step 1: short (4 tokens) has cap 3, asked at depths 1 and 2; then 0 after committing 4
    assert asked[:2] == [["long", "short"], ["long", "short"]]
    assert all(a == ["long"] for a in asked[2:])


def test_replay_refuses_batch_sizes_beyond_the_profile(data):
    with pytest.raises(MCSDError, match="batch size.s. 1, 4: 5 rows lie outside"):
        R.replay(data, "static:2", PROFILE, batch_size=5)
    with pytest.raises(MCSDError, match="at least 1"):
        R.replay(data, "static:2", PROFILE, batch_size=0)


# ------------------------------------------------------------------ step lookahead and bound
def test_the_bound_is_the_oracle_at_batch_size_one(data):
    assert R.oracle_bound(data, PROFILE, 1) == pytest.approx(
        R.replay(data, "oracle", PROFILE).throughput, rel=1e-9)


@pytest.mark.parametrize("batch_size", [2, 4])
def test_no_schedule_beats_the_bound(data, batch_size):
    """Static depths, built-ins, the step lookahead (`oracle` above batch size 1) and random
    batch plans replay below the bound; the step lookahead beats every static depth."""
    bound = R.oracle_bound(data, PROFILE, batch_size)
    oracle = R.replay(data, "oracle", PROFILE, batch_size=batch_size).throughput
    statics = [R.replay(data, f"static:{d}", PROFILE, batch_size=batch_size).throughput
               for d in range(1, data.depth + 1)]
    assert max(statics) <= oracle * (1 + 1e-9) and oracle <= bound
    for spec in ("heuristic", "confidence:0.2", "cumprod:0.9", "oracle-accepted"):
        assert R.replay(data, spec, PROFILE, batch_size=batch_size).throughput <= bound

    rng = np.random.default_rng(0)

    class Random(StopperBase):
        def should_continue(self, frontier):
            return bool(rng.random() < 0.6)

    for _ in range(10):
        assert R.replay(data, Random(), PROFILE, batch_size=batch_size).throughput <= bound


def test_batch_oracles_need_exact_replay():
    est = R.ReplayData(dense_rows(), mode="estimate")
    with pytest.raises(MCSDError, match="exact replay"):
        R.oracle_bound(est, PROFILE, 2)
    with pytest.raises(MCSDError, match="exact replay"):
        R.replay(est, "oracle", PROFILE, batch_size=2)


# ------------------------------------------------------------------ against the decoder
@pytest.mark.parametrize("batch_size", [3, 8])
@pytest.mark.parametrize("spec", ["static:2", "heuristic", "confidence:0.3", "learned-mean"])
def test_batched_replay_matches_generate_batch(data, spec, batch_size):
    """The dense collection's prompts through `generate_batch` in the replay's order: the same
    tokens, steps of the batch, draft forwards and drafted tokens (greedy, exact replay); the
    learned stopper decides through batch_continue with a mean over rows from its table."""
    from test_train_data import K_CONFIG, MAX_NEW, prompts, small_pair

    from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder

    def build():
        if spec == "learned-mean":
            folder = FIXTURES / "lightgbm"
            return stopper_from(ArtifactSpec.read(folder), folder, batch={
                batch_size: {"threshold": 0.25, "aggregation": "max", "row_aggregation": "mean"}})
        return make_stopper(spec)

    wide = CostProfile(tokens=[1, 64], target_s=[1.0, 2.0], draft_s=[0.1, 0.2],
                       batches={8: BatchCosts(target_s=[3.0, 9.0], draft_s=[0.2, 0.5])})
    data = data.subset(list(data.prompts)[:12])  # 12 prompts: rows still join as others end
    r = R.replay(data, build(), wide, batch_size=batch_size)
    order = [int(key.rsplit("/p", 1)[1]) for key in data.prompts]
    dec = MCSDDecoder(small_pair(), DecodeConfig(k_config=K_CONFIG, max_new_tokens=MAX_NEW),
                      stopper=build())
    out = dec.generate_batch([prompts()[i] for i in order], batch_size=batch_size)
    st = out.stats
    assert (r.tokens, r.batch_steps, r.draft_forwards, r.drafted_tokens) == (
        st.new_tokens, st.target_calls, st.draft_calls, st.drafted_tokens)
    assert r.steps == sum(len(g.steps) for g in out) and r.accepted == st.accepted_tokens
    if spec == "learned-mean":  # it really decides: between the shallowest and deepest trees
        shallow, deep = (R.replay(data, f"static:{d}", wide, batch_size=batch_size)
                         for d in (1, 4))
        assert r.decisions > 0 and shallow.drafted_depth < r.drafted_depth < deep.drafted_depth


def test_the_end_to_end_check_at_a_batch_size(data, monkeypatch):
    """replay.check decodes the prompts together with generate_batch and replays them at that
    batch size: the same tokens, one row per stopper, measured speeds positive."""
    from test_train_data import MAX_NEW, prompts, small_pair

    from replay import check

    ids = {f"run0/p{i}": p for i, p in enumerate(prompts())}
    monkeypatch.setattr(check, "_prompt_ids", lambda d, m, limit: [
        (k, ids[k]) for k in sorted(d.prompts)[:limit]])
    wide = CostProfile(tokens=[1, 64], target_s=[1e-3, 2e-3], draft_s=[1e-4, 2e-4],
                       batches={4: BatchCosts(target_s=[2e-3, 5e-3], draft_s=[2e-4, 4e-4])})
    out = check.stopper_check(data, [{"max_new_tokens": MAX_NEW}], wide,
                                 {"static:1": "static:1", "static:3": "static:3"}, limit=6,
                                 pair=small_pair(), batch_size=4, repeats=2)
    assert out["batch_size"] == 4 and out["prompts"] == 6
    for row in out["per_stopper"].values():
        assert row["tokens_replayed"] == row["tokens_measured"] and row["measured"] > 0
    assert "at batch size 4" in check.format_check(out)
