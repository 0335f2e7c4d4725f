"""The verification budget as a decoder's planner (`decisions.verify_budget`): in the decoder it
takes the steps `replay.ragged` replays for the same rule (tokens, steps, drafted depths,
verified tokens, batch steps), its rows stay the target's own, and a profile is required to name
one."""

from __future__ import annotations

import json
import math

import pytest
from test_ragged import ragged_ready
from test_train_data import K_CONFIG, MAX_NEW, dense_rows, prompts

import replay.data as R
from conftest import make_pair
from mcsd_runtime.cli import build_parser, run_parser
from mcsd_runtime.decisions.builtin import make_decision, make_stopper
from mcsd_runtime.decisions.features import NODE_FEATURES
from mcsd_runtime.decisions.manifest import load_decision
from mcsd_runtime.decisions.verify_budget import DraftProbability, OnlineAcceptance, VerifyBudget
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import BatchCosts, CostProfile
from replay.ragged import Budget, ragged_replay
from train.cli import register

CHAIN = (1, 1, 1, 1)
DRAFT_PROB = NODE_FEATURES.index("draft_prob")
# a draft forward costs a fifth of the target's at one token; a batch's tokens cost the target
# more as they grow, so the rule drafts some rows some steps, never all of them always
PROFILE = CostProfile(tokens=[1, 8, 64], target_s=[1.0, 1.2, 3.0], draft_s=[0.2, 0.22, 0.4],
                      step_overhead_s=0.02, depth_overhead_s=0.01,
                      batches={4: BatchCosts(target_s=[1.6, 4.0, 20.0], draft_s=[0.3, 0.5, 1.5],
                                             step_overhead_s=0.03, depth_overhead_s=0.01)})


@pytest.fixture(scope="module")
def data() -> R.ReplayData:
    return R.ReplayData(dense_rows("chain", CHAIN))


@pytest.fixture(scope="module")
def pair():
    return ragged_ready(make_pair(noise=0.02))  # test_train_data's pair, on mcsd_sdpa


@pytest.fixture(scope="module")
def ar_outputs(pair) -> list[list[int]]:
    """The AR decoder's greedy output of each of `prompts()` (what every budget must decode)."""
    ar = ARDecoder(pair, DecodeConfig(max_new_tokens=MAX_NEW))
    return [ar.generate(p).token_ids for p in prompts()]


ESTIMATES = {"survival:1": lambda: DraftProbability(1.0),
             "survival:0.5": lambda: DraftProbability(0.5),
             "survival-online:0.2": lambda: OnlineAcceptance(0.2)}


@pytest.mark.parametrize("spec", list(ESTIMATES))
@pytest.mark.parametrize("batch_size", [1, 4])
def test_the_decoder_takes_the_replayed_steps(data, pair, ar_outputs, spec, batch_size):
    """The same rule (each a fresh estimate: the online one learns as it goes) in replay and
    in the decoder, on half of the collection's prompts (the learned budget below replays and
    decodes them all)."""
    data = data.subset(list(data.prompts)[: len(data.prompts) // 2])
    r = ragged_replay(data, Budget(ESTIMATES[spec]()), PROFILE, batch_size=batch_size)
    order = [int(key.rsplit("/p", 1)[1]) for key in data.prompts]
    cfg = DecodeConfig(k_config=CHAIN, max_new_tokens=MAX_NEW, batch_layout="ragged",
                       batch_depth="row")
    dec = MCSDDecoder(pair, cfg, planner=VerifyBudget(ESTIMATES[spec](), PROFILE))
    ps = [prompts()[i] for i in order]
    out = dec.generate_batch(ps, batch_size=batch_size)
    steps = [s for g in out for s in g.steps]
    assert (r.tokens, r.steps, r.batch_steps) == (out.stats.new_tokens, len(steps),
                                                  out.stats.target_calls)
    assert r.draft_forwards == out.stats.draft_calls
    assert r.target_tokens == sum(1 + s.tree_size for s in steps)
    assert r.accepted == out.stats.accepted_tokens
    # it decides: some steps draft nothing, some draft deep
    assert 0 < r.drafted_depth < r.steps * len(CHAIN)
    assert [g.token_ids for g in out] == [ar_outputs[i] for i in order]


def test_a_budget_needs_a_cost_profile(tmp_path):
    with pytest.raises(MCSDError, match="cost profile"):
        make_decision("survival:1")
    with pytest.raises(MCSDError, match="no cost profile"):
        make_decision(f"survival:1@{tmp_path / 'missing.json'}")
    with pytest.raises(MCSDError, match="Q"):
        make_decision(f"survival:x@{tmp_path / 'missing.json'}")
    path = tmp_path / "cost.json"
    PROFILE.save(path)
    budget = make_decision(f"survival:0.5@{path}")
    assert isinstance(budget, VerifyBudget) and budget.estimate.power == 0.5
    assert budget.for_batch(4).batch_size == 4
    assert make_decision(f"survival@{path}").estimate.power == 1.0
    online = make_decision(f"survival-online@{path}").estimate
    assert isinstance(online, OnlineAcceptance) and online.lr == 0.05


def test_a_budget_is_a_planner_not_a_stopper(tmp_path, pair):
    """A budget goes in the decoder's planner slot; the stopper slot refuses it, the planner
    slot a stopper, and a decoder refuses both at once."""
    path = tmp_path / "cost.json"
    PROFILE.save(path)
    spec = f"survival:1@{path}"
    with pytest.raises(MCSDError, match="planner="):
        make_stopper(spec)
    with pytest.raises(MCSDError, match="planner="):
        MCSDDecoder(pair, DecodeConfig(k_config=CHAIN), stopper=spec)
    with pytest.raises(MCSDError, match="is a stopper"):
        MCSDDecoder(pair, DecodeConfig(k_config=CHAIN), planner="static:2")
    with pytest.raises(MCSDError, match="not both"):
        MCSDDecoder(pair, DecodeConfig(k_config=CHAIN), stopper="static:2", planner=spec)
    dec = MCSDDecoder(pair, DecodeConfig(k_config=CHAIN), planner=spec)
    assert isinstance(dec.planner, VerifyBudget) and dec.planner.batch_size == 1


def test_the_online_estimate_learns_from_the_verdicts(data):
    """Replayed, vLLM's estimate moves off q (weight 1, bias 0) toward what was accepted: its
    predictions end closer to the truth than they began."""
    est = OnlineAcceptance(0.2)
    ragged_replay(data, Budget(est), PROFILE, batch_size=4)
    assert (est.w, est.b) != (1.0, 0.0)
    fresh = OnlineAcceptance(0.2)
    xs, ys = [], []
    for p in data.prompts.values():
        for step in p.steps:
            for d, nodes in enumerate(step.nodes, 1):
                q = min(max(float(nodes[0, DRAFT_PROB]), 1e-6), 1 - 1e-6)
                xs.append(max(-10.0, min(10.0, math.log(q / (1 - q)))))
                ys.append(float(d <= step.accepted))

    def logloss(e):
        return -sum(y * math.log(e.accept(x)) + (1 - y) * math.log(1 - e.accept(x))
                    for x, y in zip(xs, ys, strict=True)) / len(xs)

    assert logloss(est) < logloss(fresh)


# ------------------------------------------------------------------ the learned budget
def run_folder(tmp_path, name: str, k_config, rows=None) -> str:
    """A run folder of `rows` (by default a collection of its own, run id `name`)."""
    run = tmp_path / name
    run.mkdir()
    rows = dense_rows(name, k_config) if rows is None else rows
    rows.drop(columns=["hidden"]).to_parquet(run / "rows.parquet")
    (run / "manifest.json").write_text(json.dumps({"k_config": list(k_config)}))
    return str(run)


def test_a_learned_budget_trains_decodes_and_replays_alike(tmp_path, data, pair, ar_outputs,
                                                          capsys):
    """`mcsd train --decision budget` writes a budget folder whose report compares it with the
    padded statics, the training-free rules and the oracles at each batch size; loaded back, it
    decodes losslessly and takes the steps its replay takes."""
    profile = tmp_path / "cost.json"
    PROFILE.save(profile)
    out = tmp_path / "budget"
    parser = build_parser([register])
    argv = ["train", "--decision", "budget", "--runs", run_folder(tmp_path, "chain", CHAIN),
            "--cost-profile", str(profile), "--batch-size", "1,4", "--out", str(out),
            "--threads", "1"]
    assert run_parser(parser, argv) == 0, capsys.readouterr().err
    assert "of the oracle's gain" in capsys.readouterr().out
    assert json.loads((out / "decision.json").read_text())["decision"] == "budget"
    report = json.loads((out / "budget.json").read_text())["report"]
    assert set(report) == {"1", "4"}
    assert all(r["vs_best_padded"] > 0 and r["oracle_vs_best_padded"] >= 1 for r in
               report.values())
    budget = load_decision(out)
    assert isinstance(budget, VerifyBudget) and budget.decision == "budget"
    assert isinstance(make_decision(f"budget:{out}"), VerifyBudget)

    r = ragged_replay(data, Budget(budget.estimate), PROFILE, batch_size=4)
    order = [int(key.rsplit("/p", 1)[1]) for key in data.prompts]
    cfg = DecodeConfig(k_config=CHAIN, max_new_tokens=MAX_NEW, batch_layout="ragged",
                       batch_depth="row")
    ps = [prompts()[i] for i in order]
    got = MCSDDecoder(pair, cfg, planner=load_decision(out)).generate_batch(ps, batch_size=4)
    steps = [s for g in got for s in g.steps]
    assert (r.tokens, r.steps, r.batch_steps, r.draft_forwards) == (
        got.stats.new_tokens, len(steps), got.stats.target_calls, got.stats.draft_calls)
    assert r.target_tokens == sum(1 + s.tree_size for s in steps)
    assert 0 < r.drafted_depth < r.steps * len(CHAIN)
    assert [g.token_ids for g in got] == [ar_outputs[i] for i in order]


def test_budget_training_refuses_what_it_cannot_train(tmp_path, capsys):
    parser = build_parser([register])
    base = ["train", "--decision", "budget", "--out", str(tmp_path / "b")]
    assert run_parser(parser, [*base, "--runs", str(tmp_path)]) == 2
    assert "needs --cost-profile" in capsys.readouterr().err
    profile = tmp_path / "cost.json"
    PROFILE.save(profile)
    # a tree's runs: the train tests' shared collection (K_CONFIG, not a chain)
    tree = run_folder(tmp_path, "tree", K_CONFIG, dense_rows())
    assert run_parser(parser, [*base, "--runs", tree, "--cost-profile", str(profile),
                               "--batch-size", "4", "--threads", "1"]) == 2
    assert "chain" in capsys.readouterr().err
    assert run_parser(parser, [*base, "--runs", tree, "--cost-profile", str(profile),
                               "--label", "soft"]) == 2
    assert "--label is an option of --decision stop" in capsys.readouterr().err
    assert run_parser(parser, [*base, "--runs", tree, "--cost-profile", str(profile),
                               "--batch-size", "8"]) == 2
    assert "batch size" in capsys.readouterr().err.lower()
