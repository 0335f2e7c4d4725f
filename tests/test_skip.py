"""Steps without a draft: the skip gate's rule, the break-even acceptance rate of a cost profile,
and the `switch` stopper spec."""

from __future__ import annotations

import pytest

from mcsd_runtime.decisions.builtin import SwitchStopper, make_stopper
from mcsd_runtime.decisions.contract import StepStart
from mcsd_runtime.decisions.features import TRAJECTORY_FEATURES, Trajectory
from mcsd_runtime.decisions.skip import SkipGate, break_even_rate
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.tree import Tree

RECENT = TRAJECTORY_FEATURES.index("accept_rate_recent")


def start(rate: float) -> StepStart:
    traj = [0.0] * len(TRAJECTORY_FEATURES)
    traj[RECENT] = rate
    return StepStart(4, traj)


def test_the_gate_skips_below_the_rate_and_probes():
    gate = SkipGate(0.5, probe=3)
    decisions = []
    for _ in range(8):  # acceptance stays low: a draft every 4th step (after 3 without)
        go = gate.should_draft(start(0.2)._trajectory)
        decisions.append(go)
        gate.update(1 if go else 0)
    assert decisions == [False, False, False, True, False, False, False, True]
    assert SkipGate(0.5).should_draft(start(0.5)._trajectory)  # at the rate: draft
    assert SkipGate(0.0).should_draft(start(0.0)._trajectory)  # rate 0: always draft
    gate.reset()
    assert gate.idle == 0


def test_a_step_without_a_draft_leaves_the_rates_as_they_were():
    traj = Trajectory()
    traj.update(accepted=2, committed=3, drafted=4)
    before = traj.values()[2:]
    traj.update(accepted=0, committed=1, drafted=0)
    assert traj.values()[2:] == before


def test_break_even_rate_by_hand():
    """A chain (1,): AR costs 1 + 0.1 = 1.1 s a token; depth 1 costs 1.6 (two tokens verified)
    + 0.2 (one draft forward over 2 pending) + 0.1 = 1.9 s for 1 + a tokens: it pays from
    a = 1.9 / 1.1 - 1 = 0.7273."""
    profile = CostProfile(tokens=[1, 2], target_s=[1.0, 1.6], draft_s=[0.2, 0.2],
                          step_overhead_s=0.1)
    assert break_even_rate(profile, Tree((1,))) == pytest.approx(1.9 / 1.1 - 1, abs=1e-9)
    flat = CostProfile(tokens=[1, 8], target_s=[1.0, 1.0], draft_s=[0.0, 0.0])
    assert break_even_rate(flat, Tree((1, 1))) == pytest.approx(0.0, abs=1e-9)
    hopeless = CostProfile(tokens=[1, 2], target_s=[1.0, 3.0], draft_s=[1.0, 1.0])
    assert break_even_rate(hopeless, Tree((1,))) == 1.0


def test_switch_specs():
    s = make_stopper("switch:0.6:2:5")
    assert isinstance(s, SwitchStopper)
    assert (s.skip.rate, s.depth, s.skip.probe) == (0.6, 2, 5)
    assert make_stopper("switch").skip.rate == 0.5
    assert not s.should_draft(start(0.3)) and s.should_draft(start(0.7))
    for bad, message in (("switch:2", "acceptance rate in"), ("switch:0.5:1.5", "DEPTH"),
                         ("switch:0.5:2:0", "probe 0"), ("switch:0.5:2:2.5", "PROBE"),
                         ("switch:a", "must be numbers")):
        with pytest.raises(MCSDError, match=message):
            make_stopper(bad)
    with pytest.raises(MCSDError, match="needs a tree of at least 3 depths"):
        make_stopper("switch:0.5:3", k_config=(2, 1))


def test_copies_for_the_rows_of_a_batch_share_no_state():
    import copy

    s = make_stopper("switch:0.6:2:5")
    a, b = copy.copy(s), copy.copy(s)
    a.reset()
    b.reset()
    a.update(0, 0)
    assert (a.skip.idle, b.skip.idle) == (1, 0)


def test_eval_names_a_switch_with_its_parameters():
    from mcsd_runtime.evaluate.methods import explicit_label

    assert explicit_label("switch:0.762:1:16", (1, 1, 1)) == "switch:0.762:1:16"
    assert explicit_label("switch", (1, 1)) == "switch:0.5"


def test_skip_rates_stay_rates_when_break_even_is_high():
    """A break-even rate above 1/1.2 puts 1.2x of it above 1: the grid clips it to 1, which
    SkipGate accepts (a profile measured on a busy machine once made training fail)."""
    import replay as R

    class Data:
        tree = Tree((1,))

    costly = CostProfile(tokens=[1, 2], target_s=[1.0, 1.75], draft_s=[0.2, 0.2],
                         step_overhead_s=0.1)
    assert 1 / 1.2 < break_even_rate(costly, Tree((1,))) < 1
    rates = R.skip_rates(Data(), costly)
    assert max(rates) == 1.0 and all(SkipGate(r).rate == r for r in rates)
