"""The verification budget as a stopper (`stop.verify_budget`): in the decoder it takes the steps
`replay.ragged` replays for the same rule (tokens, steps, drafted depths, verified tokens, batch
steps), its rows stay the target's own, and a profile is required to name one."""

from __future__ import annotations

import pytest
from test_ragged import ragged_ready
from test_train_data import MAX_NEW, dense_rows, prompts

import replay.data as R
from conftest import make_pair
from mcsd_runtime.costmodel.profile import BatchCosts, CostProfile
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.stop.builtin import make_stopper
from mcsd_runtime.stop.verify_budget import DraftProbability, VerifyBudget
from replay.ragged import ragged_replay

CHAIN = (1, 1, 1, 1)
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


@pytest.mark.parametrize("power", [1.0, 0.5])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_the_decoder_takes_the_replayed_steps(data, pair, power, batch_size):
    r = ragged_replay(data, f"survival:{power:g}", PROFILE, batch_size=batch_size)
    order = [int(key.rsplit("/p", 1)[1]) for key in data.prompts]
    cfg = DecodeConfig(k_config=CHAIN, max_new_tokens=MAX_NEW, batch_layout="ragged",
                       batch_depth="row")
    dec = MCSDDecoder(pair, cfg, stopper=VerifyBudget(DraftProbability(power), PROFILE))
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
    ar = ARDecoder(pair, DecodeConfig(max_new_tokens=MAX_NEW))
    assert [g.token_ids for g in out] == [ar.generate(p).token_ids for p in ps]


def test_a_budget_needs_a_cost_profile(tmp_path):
    with pytest.raises(MCSDError, match="cost profile"):
        make_stopper("survival:1")
    with pytest.raises(MCSDError, match="no cost profile"):
        make_stopper(f"survival:1@{tmp_path / 'missing.json'}")
    with pytest.raises(MCSDError, match="Q"):
        make_stopper(f"survival:x@{tmp_path / 'missing.json'}")
    path = tmp_path / "cost.json"
    PROFILE.save(path)
    budget = make_stopper(f"survival:0.5@{path}")
    assert isinstance(budget, VerifyBudget) and budget.estimate.power == 0.5
    assert budget.for_batch(4).batch_size == 4
