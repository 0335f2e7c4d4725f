"""Small tests that pin one-line behaviours a mutation audit found unguarded (docs/mutants.md,
rows 11 on): ragged layouts, packing thresholds, the verification budget's ties, clamps and
prices, the ragged replay's rules and the budget trainer's tuning split. Each builds the
smallest object that has the interface: stub profiles and frontiers, a few tensors, hand-made
chain collections, and one tiny pair where only a decode shows the behaviour."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_decoder_greedy import reference
from test_ragged import SkipEveryOther, ragged_ready
from test_ragged_replay import PROFILE, chain_rows

from conftest import make_pair
from mcsd_runtime.decisions.budget import draft_rows, verify_counts
from mcsd_runtime.decisions.contract import Frontier, StepStart
from mcsd_runtime.decisions.features import DECISION_FEATURES, TRAJECTORY_FEATURES
from mcsd_runtime.decisions.verify_budget import (
    ACCEPT_RECENT,
    DraftProbability,
    LearnedSurvival,
    VerifyBudget,
)
from mcsd_runtime.decode import ragged as R
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
from mcsd_runtime.decode.engine import Engine
from mcsd_runtime.models.attention import NAME, register
from mcsd_runtime.pricing.profile import RaggedCosts
from mcsd_runtime.pricing.step_model import FIRST_PENDING, step_forwards
from mcsd_runtime.tree import Tree
from replay.data import ReplayData
from replay.ragged import Budget, ragged_replay, scaled_draft
from replay.runs import sequence_ids

CPU = torch.device("cpu")
DRAFT_PROB = DECISION_FEATURES.index("draft_prob")


# ------------------------------------------------------------------ ragged layouts
def test_a_bucketed_size_rounds_the_total_up_to_the_bucket() -> None:
    """`Ragged(bucket=B).size` is the total rounded *up* to a multiple of B, and the index
    holds exactly that many slots (11 real tokens in buckets of 8: 16, not 8)."""
    layout = R.Ragged([5, 5, 1], 5, CPU, bucket=8)
    assert layout.total == 11
    assert layout.size == 16 == layout.index.numel()
    assert R.Ragged([4, 4], 4, CPU, bucket=8).size == 8  # an exact multiple stays as it is
    assert R.Ragged([1], 1, CPU, bucket=8).size == 8  # never under one bucket


def test_the_scratch_slot_lies_past_the_grid() -> None:
    """A bucketed layout's padding tokens read zeros from, and write to, a scratch slot past
    the rows x width grid: never a real slot. Packing reads the real slots then zeros; unpacking
    leaves the real slots to the real tokens (whatever the padding tokens carry) and zeros in
    the grid's padding."""
    layout = R.Ragged([1, 2], 2, CPU, bucket=4)
    grid = torch.tensor([[1, 2], [3, 4]])
    packed = layout.pack(grid)
    assert packed.tolist() == [[1, 3, 4, 0]]
    assert layout.unpack(packed).tolist() == [[1, 0], [3, 4]]
    # the model's output at a padding token is not zero: it must not land on a real slot
    out = torch.tensor([[1, 3, 4, 99]])
    assert layout.unpack(out).tolist() == [[1, 0], [3, 4]]


def test_a_draft_without_mcsd_sdpa_keeps_the_batch_padded() -> None:
    """The ragged layout needs *both* models on `mcsd_sdpa`: a target on it and a draft on
    plain sdpa give one warning and padded forwards (a draft-free tree reads the target only),
    and such a batch decodes the target's own tokens."""
    register()
    pair = make_pair()  # both on sdpa
    pair.target.config._attn_implementation = NAME
    cfg = DecodeConfig(k_config=(2, 1), max_new_tokens=6, batch_layout="ragged")

    def dec(depth: int) -> SimpleNamespace:
        return SimpleNamespace(config=cfg, pair=pair, tree=SimpleNamespace(depth=depth))

    with pytest.warns(RuntimeWarning, match="mcsd_sdpa.*not sdpa"):
        assert not R.packing_for(dec(2), 3).ragged
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert R.packing_for(dec(0), 3).ragged  # no draft forwards: the target decides alone

    ps = [[5, 6, 7], [1, 2], [9, 4, 9, 4]]
    refs = [reference(pair, p, 6) for p in ps]
    with pytest.warns(RuntimeWarning, match="mcsd_sdpa"):
        out = MCSDDecoder(pair, cfg, stopper="heuristic").generate_batch(ps, batch_size=3)
    assert [r.token_ids for r in out] == refs


def test_forwards_filling_exactly_three_quarters_are_packed() -> None:
    """`packs` admits a forward whose real tokens fill *at most* RAGGED_FILL (3/4) of the grid:
    12 tokens in a 4 x 4 grid pack, 13 do not; the prices (`CostProfile.as_run`) follow the
    same boundary."""
    assert R.Ragged.needed([3, 3, 3, 3], 4)  # 12 of 16
    assert not R.Ragged.needed([3, 3, 3, 4], 4)  # 13 of 16
    dear = replace(PROFILE, ragged={4: RaggedCosts(target=[[4, 9.0], [32, 9.0]],
                                                   draft=[[1, 9.0], [32, 9.0]])})
    assert dear.as_run("target_s", [4, 4, 4, 0]) == 9.0  # 12 of 16: packed
    assert dear.as_run("target_s", [4, 4, 4, 1]) == PROFILE.target(4, 4)  # 13 of 16: padded


# ------------------------------------------------------------------ the draft's forwards
class _SkipEveryOtherLow(SkipEveryOther):
    """`SkipEveryOther` going deeper while the frontier's first candidate has draft
    probability >= 0.1 (the tiny random pair's drafts are flat): rows stop at 1 to 4."""

    def should_continue(self, frontier: Frontier) -> bool:
        return bool(frontier.decision_features()[0, DRAFT_PROB] >= 0.1)


def test_the_draft_forwards_only_the_rows_still_drafting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ragged, each draft forward takes the tokens of the rows that draft it: a row's own
    pending tokens in the first, then its frontier at each depth it drafts past the first
    (`step_forwards`); a row that stopped, or drafts nothing this step, adds nothing. Lossless
    either way, so only the tokens through the draft's embedding inside decode steps
    (admissions' prefills left out) show it."""
    monkeypatch.setattr(R, "RAGGED_FILL", 1.0)  # every forward of rows that differ is packed
    seen: list[int] = []
    inside: list[bool] = []
    real_step = Engine.step

    def step(self: Engine, *args: object) -> None:
        inside.append(True)
        try:
            real_step(self, *args)
        finally:
            inside.pop()

    monkeypatch.setattr(Engine, "step", step)
    pair = ragged_ready(make_pair())
    hook = pair.draft.get_input_embeddings().register_forward_hook(
        lambda m, args, out: seen.append(args[0].numel() if inside else 0))
    k_config = (2, 1, 1, 1)
    cfg = DecodeConfig(k_config=k_config, max_new_tokens=16, batch_layout="ragged",
                       batch_depth="row")
    ps = [[5, 6, 7, 8], [1, 2, 3], [9, 4], [3], [7, 7, 7, 7, 7]]
    dec = MCSDDecoder(pair, cfg, stopper=_SkipEveryOtherLow())
    try:
        out = dec.generate_batch(ps, batch_size=3)
    finally:
        hook.remove()
    tree, expected = Tree(k_config), 0
    for r in out:
        pending = FIRST_PENDING
        for s in r.steps:
            expected += sum(step_forwards(tree, s.drafted, pending).draft)
            pending = s.draft_pending
    depths = [s.drafted for r in out for s in r.steps]
    assert 0 in depths and max(depths) > 1 and len(set(depths)) > 2  # rows differ
    assert sum(seen) == expected


# ------------------------------------------------------------------ the budget's rule
def test_budget_ties_keep_the_smaller_choice() -> None:
    """With flat costs a token of survival 0 adds nothing: no token is verified, no row drafts
    a forward that returns nothing (ties keep the smaller count, also within rounding)."""
    assert verify_counts([[0.0, 0.0]], lambda t: 1.0) == [0]
    assert verify_counts([[1e-14]], lambda t: 1.0) == [0]  # within rounding of a tie
    assert verify_counts([[0.0, 0.0], [0.0]], lambda t: 1.0, rate=2.0) == [0, 0]
    assert draft_rows([1.0, 1.0], [0.0, 0.0], lambda t, k: 0.0, lambda t: 1.0, 2, 2.0) == []
    assert draft_rows([1.0], [0.0], lambda t, k: 0.0, lambda t: 1.0, 1, 1.0, rate=1.0) == []


def test_an_acceptance_above_one_counts_as_one() -> None:
    """`draft_rows` clamps each row's predicted acceptance to [0, 1]: an estimate of 5 is worth
    one token (not five) and ranks level with an estimate of 1, the lower row first."""
    # a draft forward worth 1.5 tokens: one sure token does not pay for it, five would
    assert draft_rows([1.0], [5.0], lambda t, k: 0.75 if k else 0.0, lambda t: 0.0, 1, 1.0,
                      rate=2.0) == []
    # room for one row: both gains are 1, so the lower row drafts
    costs = {0: 0.0, 1: 0.5, 2: 1.6}
    assert draft_rows([1.0, 1.0], [1.0, 3.0], lambda t, k: costs[k], lambda t: 0.0, 2, 2.0,
                      rate=1.0) == [0]


class _LinearProfile:
    """A stub cost profile: overheads and ragged prices linear in the tokens they carry."""

    def overheads(self, rows: int) -> tuple[float, float]:
        return 0.5, 0.25

    def ragged_target(self, tokens: float, rows: int) -> float:
        return 1.0 + 0.01 * tokens

    def ragged_draft(self, tokens: float, rows: int, first: bool = False) -> float:
        return (0.1 if first else 0.0) + 0.01 * tokens


def test_a_paid_draft_forward_is_priced_at_its_fed_tokens() -> None:
    """Rows that draft feed the first draft forward their pending tokens: two rows of 3 pending
    tokens each that both draft leave the step paying its overhead, a first draft forward
    carrying 6 tokens over the batch, and one depth's overhead."""
    profile = _LinearProfile()
    traj = [0.0] * len(TRAJECTORY_FEATURES)
    traj[ACCEPT_RECENT] = 0.9
    budget = VerifyBudget(DraftProbability(1.0), profile, batch_size=2)
    starts = [StepStart(4, traj, cap=4, pending=3), StepStart(4, traj, cap=4, pending=3)]
    assert budget.plan(starts) == [True, True]
    step, depth = profile.overheads(2)
    assert budget.paid == pytest.approx(step + profile.ragged_draft(6, 2, first=True) + depth)


class _FixedScores:
    """A stub calibrated stopper: every node of every frontier scores `score`."""

    calibration = object()

    def __init__(self, score: float) -> None:
        self.score = score

    def calibrated_scores(self, frontiers: list) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(np.array([self.score, 0.1]), np.zeros(2)) for _ in frontiers]


def test_a_learned_childs_gain_never_exceeds_its_nodes_survival() -> None:
    """`LearnedSurvival`: a node's survival is what was predicted for it, and its child's gain
    the model's score capped by that survival (a child never outranks its parent)."""
    high = LearnedSurvival(_FixedScores(0.9), "budget")
    assert high.nodes([None, None], [0.5, 1.0], [1.0, 1.0]) == [(0.5, 0.5), (1.0, 0.9)]
    assert high.node(None, 0.5, 1.0) == (0.5, 0.5)
    assert LearnedSurvival(_FixedScores(0.2), "budget").node(None, 0.5, 1.0) == (0.5, 0.2)


# ------------------------------------------------------------------ prices and replay
def test_the_target_is_priced_at_the_depths_it_verifies() -> None:
    """`ragged_step_seconds`: a row that drafts 3 and verifies 1 pays the target for its root
    and one node, less than one that verifies all 3, by exactly the target's difference."""
    tree = Tree((1, 1, 1))
    cheap = PROFILE.ragged_step_seconds(tree, [(1, 3, 1)])
    dear = PROFILE.ragged_step_seconds(tree, [(1, 3, 3)])
    assert cheap < dear
    assert dear - cheap == pytest.approx(PROFILE.target(4) - PROFILE.target(2))


@pytest.fixture(scope="module")
def chains() -> ReplayData:
    df = chain_rows([0, 4, 1, 3, 2, 4], new_tokens=16)
    return ReplayData(df, k_config="1,1,1,1",
                      new_tokens={f"r/{k}": 16 for k in df["prompt_id"].unique()})


def test_a_reused_budget_rule_takes_each_replays_profile(chains: ReplayData) -> None:
    """One budget rule replayed under a profile and then under one whose draft costs ten times
    as much drafts, the second time, what a fresh rule drafts under it (and less than the
    first time)."""
    rule = Budget(DraftProbability(1.0))
    dear = scaled_draft(PROFILE, 10.0)
    first = ragged_replay(chains, rule, PROFILE, 4)
    again = ragged_replay(chains, rule, dear, 4)
    fresh = ragged_replay(chains, Budget(DraftProbability(1.0)), dear, 4)
    assert (again.drafted_depth, again.steps, again.cost_s) == (
        fresh.drafted_depth, fresh.steps, fresh.cost_s)
    assert again.drafted_depth < first.drafted_depth


# ------------------------------------------------------------------ the budget trainer
def test_training_free_rules_are_tuned_on_validation_prompts(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`mcsd train --decision budget` reports each training-free rule at the setting that is
    best on the *validation* prompts (their tokens/s in `all`), replayed on the test prompts,
    which share no prompt with them: validation prompts that never accept choose the shallowest
    static depth, test prompts that always accept would choose a deeper one."""
    import mcsd_runtime.decisions.learned as learned
    from train.budget.config import BudgetConfig
    from train.budget.trainer import BudgetTrainer, Fitted, Runs
    from train.node_model import Prepared
    from train.stop.config import TrainConfig

    df = chain_rows([0, 0, 4, 4], new_tokens=12)  # p00, p01: accept nothing; p02, p03: all
    df["accepted_length"] = df["drafted_depth"].where(df["prompt_id"] >= "p02", 0)
    df["on_accepted_path"] = df["depth"] <= df["accepted_length"]
    seq = sequence_ids(df)
    masks = {"train": np.zeros(len(df), bool), "val": seq.isin(["r/p00", "r/p01"]).to_numpy(),
             "test": seq.isin(["r/p02", "r/p03"]).to_numpy()}
    prep = Prepared(df, masks, {}, {}, {}, {}, (1, 1, 1, 1))
    manifests = [{"run_id": "r", "output_lengths": {f"p0{i}": 12 for i in range(4)}}]
    monkeypatch.setattr(learned, "stopper_from", lambda spec, folder: _FixedScores(0.5))
    config = BudgetConfig(out=tmp_path / "b", runs=(tmp_path,),
                          training=TrainConfig(label="hard", batch_sizes=(2,)))
    log: list[str] = []
    chosen = BudgetTrainer(config, PROFILE, log.append).choose(
        Runs(prep, manifests), Fitted(None, None, object(), tmp_path))
    val = ReplayData(df[masks["val"]], k_config="1,1,1,1")
    test = ReplayData(df[masks["test"]], k_config="1,1,1,1")
    assert not set(val.prompts) & set(test.prompts)
    ragged = chosen.replay[2]["families"]["ragged static"]
    specs = [f"static:{s}" for s in range(1, 5)]
    assert ragged["all"] == pytest.approx(
        {s: ragged_replay(val, s, PROFILE, 2).throughput for s in specs})
    assert ragged["best"] == "static:1"
    assert ragged["tokens_per_s"] == pytest.approx(
        ragged_replay(test, "static:1", PROFILE, 2).throughput)
    best_on_test = max(specs, key=lambda s: ragged_replay(test, s, PROFILE, 2).throughput)
    assert best_on_test != "static:1"  # the test prompts would choose another
    assert "chosen on 2 validation prompts" in "\n".join(log)
