"""Cost profiles: interpolation, files, measurement on a tiny pair."""

from __future__ import annotations

import json

import pytest

from conftest import make_pair
from mcsd_runtime.benchmarks.measure import (
    calibrate,
    fit_overheads,
    measure,
    static_runs,
)
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile


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
    assert p.pair["target_config"]


def test_measure_keeps_each_counts_median_even_where_more_tokens_cost_less(monkeypatch):
    """A kernel's blocking can make 4 tokens cheaper than 3 (SmolLM2 in fp32 on one CPU core):
    the profile keeps every count's median, so replay prices each depth as it runs."""
    from mcsd_runtime.benchmarks import measure as M

    fake = {1: [1.0, 1.2, 1.1], 2: [1.6, 1.5, 1.7], 3: [2.0, 2.1, 1.9], 4: [1.8, 1.7, 1.9]}
    monkeypatch.setattr(M, "_time_forwards", lambda pair, caches, sizes, tokens, *a: {
        (name, 1, n): [v * (0.1 if name == "draft" else 1) for v in fake[n]]
        for name in ("target", "draft") for n in tokens})
    p = measure(make_pair(), tokens=(1, 2, 3, 4), context=8, rounds=3)
    assert p.target_s == pytest.approx([1.1, 1.6, 2.0, 1.8])
    assert p.draft_s == pytest.approx([0.11, 0.16, 0.2, 0.18])


def test_fit_overheads_recovers_known_costs():
    runs = [{"steps": s, "drafted": d, "decode_s": 1.0 + 0.002 * s + 0.0005 * d,
             "forward_s": 1.0} for s, d in ((10, 10), (8, 16), (6, 24), (5, 40))]
    step, depth = fit_overheads(runs)
    assert step == pytest.approx(0.002, rel=1e-6) and depth == pytest.approx(0.0005, rel=1e-6)


def _decode_alike(pair, depth: int, prompt: list[int], **config):
    from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder

    config = DecodeConfig(k_config=(1, 1, 1), **config)
    dec = ARDecoder(pair, config) if not depth else MCSDDecoder(pair, config,
                                                                 stopper=f"static:{depth}")
    return dec.generate(prompt)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_runs_record_each_depths_decoding(temperature):
    """One run per prompt for AR (depth 0) and each static depth, with the decoder's own counts
    at the temperature asked for, and every forward logged by (model, tokens): depth d's target
    forward takes the root and d nodes."""
    pair = make_pair()
    prompts = [[1, 2, 3], [4, 5]]
    runs, forwards = static_runs(pair, prompts, (1, 1, 1), max_new_tokens=12, seed=3,
                                 temperature=temperature)
    assert sorted((r["prompt"], r["depth"]) for r in runs) == [(i, d) for i in (0, 1)
                                                                for d in (0, 1, 2, 3)]
    for r in runs:
        res = _decode_alike(pair, r["depth"], prompts[r["prompt"]], max_new_tokens=12, seed=3,
                            temperature=temperature)
        assert (r["steps"], r["drafted"], r["tokens"]) == (
            len(res.steps), sum(s.drafted for s in res.steps), res.stats.new_tokens)
        assert r["decode_s"] > r["forward_s"] > 0
        assert r["depth"] or r["steps"] == r["tokens"] and not r["drafted"]  # AR
    assert {2, 3, 4} <= {n for (name, n) in forwards if name == "target"}  # root + 1..3 nodes
    assert {name for name, _ in forwards} == {"target", "draft", "draft_first"}
    if temperature:  # sampled, not greedy: some run takes other steps than greedy decoding
        assert any((r["steps"], r["drafted"]) != (len(g.steps), sum(s.drafted for s in g.steps))
                   for r in runs for g in [_decode_alike(pair, r["depth"], prompts[r["prompt"]],
                                                         max_new_tokens=12)])


def test_static_runs_with_widths_time_every_narrower_first_depth():
    """`widths`: depth 1 also decoded on first depths 1..k-1, so that the target's forwards of
    2..k+1 tokens are all the decoder's own, and each width's throughput is kept apart."""
    from mcsd_runtime.benchmarks.measure import static_throughput

    pair = make_pair()
    runs, forwards = static_runs(pair, [[1, 2, 3]], (4, 2), max_new_tokens=10, widths=True)
    assert sorted((r["depth"], r.get("width", 0)) for r in runs) == [
        (0, 0), (1, 0), (1, 1), (1, 2), (1, 3), (2, 0)]
    assert {1, 2, 3, 4, 5} <= {n for (name, n) in forwards if name == "target"}
    assert set(static_throughput(runs)) == {"ar", "static:1", "static:2", "static:1 width 1",
                                            "static:1 width 2", "static:1 width 3"}
    plain, _ = static_runs(pair, [[1, 2, 3]], (4, 2), max_new_tokens=10)
    assert {r.get("width") for r in plain} == {None}


def test_profile_temperature_and_its_note():
    """The temperature the overheads were fitted at is read back; replays that sample against
    a greedy profile (or the reverse) get a note naming the fix, others none; decoder runs
    recorded without their temperature are refused."""
    base = dict(tokens=[1, 2], target_s=[1.0, 1.1], draft_s=[0.1, 0.11])
    assert CostProfile(**base).temperature is None  # not calibrated on the decoder
    greedy = CostProfile(**base, static={"k_config": [1, 1], "temperature": 0.0})
    assert greedy.temperature == 0.0 and greedy.temperature_note(0.0) is None
    assert "mcsd profile --temperature 0.7" in greedy.temperature_note(0.7)
    with pytest.raises(MCSDError, match="without their temperature"):
        CostProfile(**base, static={"k_config": [1, 1]})
    hot = CostProfile(**base, static={"k_config": [1, 1], "temperature": 0.7})
    assert hot.temperature_note(1.0) is None and "temperature 0.7" in hot.temperature_note(0)


def test_calibrate_takes_the_decoders_medians_and_fits_overheads():
    """Known inputs, hand-computed outputs: a token count's median replaces the measured
    latency once seen `min_samples` times, as it is (a forward over more tokens may cost less:
    a kernel's blocking); overheads are the
    per-step and per-depth seconds outside forwards; static tokens/s are per depth."""
    profile = CostProfile(tokens=[1, 2, 4, 8], target_s=[1.0, 2.0, 3.0, 4.0],
                          draft_s=[0.1, 0.2, 0.3, 0.4])
    forwards = {("target", 2): [2.7, 2.5, 2.6],  # median 2.6 replaces 2.0
                ("target", 4): [9.0],  # one sample: below min_samples, kept 3.0
                ("target", 8): [2.0, 2.0],  # 2.0 < 3.0: kept, not pooled
                ("target", 16): [5.0, 5.0],  # not a profiled token count: ignored
                ("draft", 1): [0.5, 0.7],  # 0.6, above the next two: kept
                ("draft_first", 2): [0.05, 0.05]}
    runs = [{"depth": d, "steps": s, "drafted": dr, "tokens": t, "forward_s": f,
             "decode_s": f + 0.002 * s + 0.0005 * dr}
            for d, s, dr, t, f in ((1, 10, 10, 20, 1.0), (2, 8, 16, 20, 0.9),
                                   (2, 7, 14, 18, 0.8), (3, 6, 18, 20, 1.2))]
    cal = calibrate(profile, runs, forwards, min_samples=2)
    assert cal.target_s == pytest.approx([1.0, 2.6, 3.0, 2.0])
    assert cal.draft_s == pytest.approx([0.6, 0.2, 0.3, 0.4])
    assert cal.draft_first_s == pytest.approx([0.1, 0.05, 0.3, 0.4])  # draft_s where unseen
    assert cal.step_overhead_s == pytest.approx(0.002) and cal.depth_overhead_s == pytest.approx(
        0.0005)
    assert cal.static["tokens_per_s"] == pytest.approx({
        "static:1": 20 / (1.0 + 0.025), "static:2": 38 / (0.9 + 0.024 + 0.8 + 0.021),
        "static:3": 20 / (1.2 + 0.021)})
    assert (cal.tokens, profile.target_s) == ([1, 2, 4, 8], [1.0, 2.0, 3.0, 4.0])  # a copy


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
