"""Cost profiles: interpolation, files, measurement on a tiny pair."""

from __future__ import annotations

import json
import statistics

import pytest

from conftest import make_pair
from mcsd_runtime.cost import (
    CostProfile,
    calibrate,
    fit_overheads,
    measure,
    monotone,
    static_runs,
)
from mcsd_runtime.errors import MCSDError


def test_interpolation_and_round_trip(tmp_path):
    p = CostProfile(tokens=[1, 4, 8], target_s=[1.0, 1.3, 2.1], draft_s=[0.1, 0.2, 0.4],
                    step_overhead_s=0.01)
    assert p.target(1) == 1.0 and p.target(4) == pytest.approx(1.3)
    assert p.target(6) == pytest.approx(1.7) and p.draft(2) == pytest.approx(0.1 + 0.1 / 3)
    assert p.target(12) == pytest.approx(2.1 + 0.2 * 4)  # extrapolated from the last two
    p.save(tmp_path / "p.json")
    q = CostProfile.load(tmp_path / "p.json")
    assert q == p


def test_bad_profiles_refused(tmp_path):
    with pytest.raises(MCSDError):
        CostProfile(tokens=[2, 1], target_s=[1, 1], draft_s=[1, 1])
    with pytest.raises(MCSDError):
        CostProfile(tokens=[1], target_s=[1, 2], draft_s=[1])
    (tmp_path / "x.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(MCSDError, match="not a cost profile"):
        CostProfile.load(tmp_path / "x.json")
    with pytest.raises(MCSDError, match="cannot read"):
        CostProfile.load(tmp_path / "missing.json")


def test_measure_tiny_pair():
    p = measure(make_pair(), tokens=(1, 2, 8), context=16, rounds=2)
    assert p.tokens == [1, 2, 8] and all(t > 0 for t in p.target_s + p.draft_s)
    assert p.target_s == sorted(p.target_s) and p.draft_s == sorted(p.draft_s)
    assert p.pair["target_config"]


def test_monotone_fit():
    assert monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert monotone([7.59, 9.55, 6.01, 5.74]) == sorted(monotone([7.59, 9.55, 6.01, 5.74]))


def test_fit_overheads_recovers_known_costs():
    runs = [{"steps": s, "drafted": d, "decode_s": 1.0 + 0.002 * s + 0.0005 * d,
             "forward_s": 1.0} for s, d in ((10, 10), (8, 16), (6, 24), (5, 40))]
    step, depth = fit_overheads(runs)
    assert step == pytest.approx(0.002, rel=1e-6) and depth == pytest.approx(0.0005, rel=1e-6)


def test_static_runs_calibrate_the_profile():
    pair = make_pair()
    runs, forwards = static_runs(pair, [[1, 2, 3], [4, 5]], (1, 1, 1), max_new_tokens=6)
    assert sorted((r["prompt"], r["depth"]) for r in runs) == [(i, d) for i in (0, 1)
                                                                for d in (1, 2, 3)]
    assert all(r["tokens"] == 6 and r["decode_s"] > r["forward_s"] > 0 for r in runs)
    assert {2, 3, 4} <= {n for name, n in forwards if name == "target"}  # root + 1..3 nodes
    profile = measure(pair, tokens=(1, 2, 3, 4), context=16, rounds=1)
    cal = calibrate(profile, runs, forwards, min_samples=1)
    seen = [statistics.median(forwards[("target", n)]) if ("target", n) in forwards else t
            for n, t in zip(profile.tokens, profile.target_s, strict=True)]
    assert cal.target_s == pytest.approx(monotone(seen))  # the decoder's own medians, monotone
    assert cal.target_s == sorted(cal.target_s) and cal.step_overhead_s > 0
    assert set(cal.static["tokens_per_s"]) == {"static:1", "static:2", "static:3"}


def test_step_seconds_counts_the_forwards_of_a_step():
    from mcsd_runtime.tree import Tree

    p = CostProfile(tokens=[1, 8], target_s=[1.0, 1.7], draft_s=[0.1, 0.8], step_overhead_s=0.01,
                    depth_overhead_s=0.001)
    tree = Tree((2, 1))  # depth 1: 2 nodes, depth 2: 2 nodes
    # stopped at depth 2 with 2 pending: draft over 2 pending + depth 1 (2 nodes), target 1+4
    assert p.step_seconds(tree, 2, 2) == pytest.approx(0.2 + 0.2 + 1.4 + 0.01 + 0.002)
    assert p.step_seconds(tree, 0, 3) == pytest.approx(1.0 + 0.01)


def test_paired_speedup_geomean_and_ci():
    from mcsd_runtime.metrics import paired_speedup

    ref = [100.0, 200.0, 50.0, 80.0]
    r = paired_speedup([110.0, 220.0, 55.0, 88.0], ref)
    assert r["geomean"] == pytest.approx(1.1) and r["ci_low"] == pytest.approx(1.1)
    noisy = paired_speedup([105.0, 230.0, 52.0, 80.0], ref)
    assert noisy["ci_low"] < noisy["geomean"] < noisy["ci_high"] and noisy["n"] == 4
    with pytest.raises(ValueError):
        paired_speedup([1.0], [1.0, 2.0])
