"""Replay on a pair whose outputs end in EOS, through the pipeline's own path (collect run ->
load_runs -> prepare/fit/choose): every prompt's replayed tokens, target calls and draft
forwards equal the decoder's, including an output whose EOS is the last token but one."""

from __future__ import annotations

import copy
import warnings

import pytest
from test_train_data import prompts

import replay as R
from collect.run import CollectJob, collect_prompts
from conftest import make_pair
from mcsd_runtime.decisions.builtin import StopperBase, make_stopper
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
from mcsd_runtime.pricing.profile import BatchCosts, CostProfile
from mcsd_runtime.prompts.sets import Prompt
from replay.runs import load_runs
from train.node_model import fit, prepare
from train.stop.config import TrainConfig
from train.stop.pipeline import choose

EOS, K, MAX_NEW = 36, (2, 2, 1), 12  # this pair ends prompt 8's output in EOS at token 11 of 12
CONFIG = TrainConfig(aggregations=("max",), decision_us=0.0, progress=False)
PROFILE = CostProfile(tokens=[1, 8, 64], target_s=[1.0, 1.1, 2.0], draft_s=[0.2, 0.22, 0.4],
                      step_overhead_s=0.05)
STOPPERS = ["static:1", "static:2", "static:3", "heuristic", "confidence:0.3", "oracle"]


def quiet(*_: object) -> None:
    pass


class PlanByPosition(StopperBase):
    """A replay stop plan as a decoder stopper: the planned depth at each output position
    (the trajectory's first value, tokens generated so far)."""

    def __init__(self, depths: dict[int, int]) -> None:
        self.depths = depths

    def should_draft(self, start) -> bool:  # depth 0: no draft at that position
        return self.depths.get(int(start.trajectory()[0]), 1) > 0

    def should_continue(self, frontier) -> bool:
        return frontier.depth < self.depths[int(frontier.trajectory()[0])]


@pytest.fixture(scope="module")
def eos_pair():
    return make_pair(eos=EOS)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("eos")


@pytest.fixture(scope="module")
def chosen(eos_pair, root):
    """The pipeline's choice (its ReplayData) on a dense collection of the EOS pair (in
    root/run; the fitted model in root/model)."""
    job = CollectJob(prompts=[Prompt(id=f"p{i}", text=ids, source="test")
                              for i, ids in enumerate(prompts())],
                     out=str(root / "run"), config=DecodeConfig(k_config=K, max_new_tokens=MAX_NEW),
                     dense=True, progress=False, run_id="eos")
    collect_prompts(job, eos_pair)
    df, manifests = load_runs([root / "run"])
    prep = prepare(df, manifests, CONFIG, quiet)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit(prep, CONFIG, root / "model", quiet)
    return choose(prep, manifests, root / "model", CONFIG, PROFILE, quiet)


def test_the_collection_holds_an_output_ending_in_eos_before_the_budget(eos_pair):
    """Guard: the case the replay once miscounted is present (else the next test proves
    nothing)."""
    ends = []
    for ids in prompts():
        out = MCSDDecoder(eos_pair, DecodeConfig(k_config=K, max_new_tokens=MAX_NEW)
                          ).generate(ids).token_ids
        ends.append((len(out), out[-1] == EOS))
    assert (MAX_NEW - 1, True) in ends
    assert (MAX_NEW, False) in ends  # and budget-capped outputs beside it


@pytest.mark.parametrize("spec", STOPPERS)
def test_replay_matches_the_decoder_per_prompt_when_outputs_end_in_eos(eos_pair, chosen, spec):
    data = chosen.data
    assert data.mode == "exact"
    plan = R.optimal_plan(data, PROFILE) if spec == "oracle" else None
    for i, ids in enumerate(prompts()):
        key = f"eos/p{i}"
        r = R.replay(data.subset([key]), R.PlanStopper(plan) if plan else spec, PROFILE)
        stopper = (PlanByPosition({pos: s for (k, pos), s in plan.items() if k == key})
                   if plan else spec)
        st = MCSDDecoder(eos_pair, DecodeConfig(k_config=K, max_new_tokens=MAX_NEW),
                         stopper=stopper).generate(ids).stats
        assert (r.tokens, r.steps, r.draft_forwards, r.drafted_tokens) == (
            st.new_tokens, st.target_calls, st.draft_calls, st.drafted_tokens), key


def test_domain_check_replays_the_decoders_output_lengths(eos_pair, chosen, root):
    """`mcsd train --domains` replays another collection through the same lengths."""
    from mcsd_runtime.decisions.learned import stopper_from
    from train.stop.domains import check_domain

    result = check_domain(root / "run", stopper_from(chosen.spec, root / "model"), "static:3",
                          "heuristic", PROFILE, 0.0, peer="cumprod:0.7")
    peer = result["replay"]["peer"]["throughput"]
    assert result["learned_vs_peer"] == result["replay"]["learned"]["throughput"] / peer
    # depth decisions alone reach at least the best static and at most the oracle with skips
    assert 1 - 1e-9 <= result["oracle_drafting_vs_best_static"] <= (
        result["oracle_vs_best_static"] + 1e-9)
    for spec, key in (("static:1", "static:1"), ("static:3", "static:3"),
                      ("heuristic", "heuristic"), ("cumprod:0.7", "peer")):
        dec = MCSDDecoder(eos_pair, DecodeConfig(k_config=K, max_new_tokens=MAX_NEW),
                          stopper=spec)
        stats = [dec.generate(ids).stats for ids in prompts()]
        replayed = result["replay"][key]
        assert (replayed["tokens"], replayed["steps"]) == (
            sum(s.new_tokens for s in stats), sum(s.target_calls for s in stats)), spec


class Logged(StopperBase):
    """A stopper spec's stopper that logs each row's steps (drafted depth, accepted) as the
    replay runs them: every row's copy appends a fresh log to `logs` at its reset, in the order
    rows are admitted."""

    def __init__(self, spec: str, logs: list) -> None:
        self.inner, self.logs, self.log = make_stopper(spec), logs, []

    def __copy__(self) -> Logged:
        return Logged.__new__(Logged).__init_copy(self)

    def __init_copy(self, other: Logged) -> Logged:
        self.inner, self.logs, self.log = copy.deepcopy(other.inner), other.logs, []
        return self

    def reset(self) -> None:
        self.inner.reset()
        self.log = []
        self.logs.append(self.log)

    def should_continue(self, frontier) -> bool:
        return self.inner.should_continue(frontier)

    def update(self, drafted: int, accepted: int) -> None:
        self.inner.update(drafted, accepted)
        self.log.append((drafted, accepted))


@pytest.mark.parametrize("batch_size", [3, 4])
@pytest.mark.parametrize("spec", ["static:1", "static:3", "heuristic"])
def test_batched_replay_matches_generate_batch_when_outputs_end_in_eos(eos_pair, chosen, spec,
                                                                       batch_size):
    """The EOS collection's prompts through `generate_batch` in the replay's order: every row's
    steps (depth drafted, accepted) and committed tokens, and the batch's target calls, draft
    forwards, drafted and accepted tokens equal the replay at that batch size; rows whose
    output ended at EOS before the budget leave the batch early, and the next prompt takes
    their slot."""
    data = chosen.data
    logs: list[list] = []
    wide = CostProfile(tokens=[1, 64], target_s=[1.0, 2.0], draft_s=[0.1, 0.2],
                       batches={4: BatchCosts(target_s=[3.0, 9.0], draft_s=[0.2, 0.5])})
    r = R.replay(data, Logged(spec, logs), wide, batch_size=batch_size)
    order = [int(key.rsplit("/p", 1)[1]) for key in data.prompts]
    out = MCSDDecoder(eos_pair, DecodeConfig(k_config=K, max_new_tokens=MAX_NEW),
                      stopper=spec).generate_batch([prompts()[i] for i in order],
                                                   batch_size=batch_size)
    ends = [(len(g.token_ids), g.token_ids[-1] == EOS) for g in out]
    assert (MAX_NEW - 1, True) in ends and (MAX_NEW, False) in ends  # both kinds of ending
    assert [p.new_tokens for p in data.prompts.values()] == [n for n, _ in ends]
    assert [sum(s.committed for s in g.steps) for g in out] == [n for n, _ in ends]
    assert logs == [[(s.drafted, s.accepted) for s in g.steps] for g in out]
    st = out.stats
    assert (r.tokens, r.batch_steps, r.draft_forwards, r.drafted_tokens, r.accepted) == (
        st.new_tokens, st.target_calls, st.draft_calls, st.drafted_tokens, st.accepted_tokens)
    assert r.steps == sum(len(g.steps) for g in out) and r.batch_steps < r.steps
