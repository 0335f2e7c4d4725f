"""Cost profiles over batch sizes: interpolation between measured sizes, refusal outside them,
version-1 files as batch size 1, the batched measurement, and a step's seconds at B rows."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
from scipy.optimize import nnls

from conftest import make_pair
from mcsd_runtime.benchmarks.measure import measure
from mcsd_runtime.cli.args import parse_batch_sizes
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import BatchCosts, CostProfile
from mcsd_runtime.tree import Tree

PROFILE = CostProfile(tokens=[1, 8], target_s=[1.0, 2.0], draft_s=[0.1, 0.2],
                      step_overhead_s=0.01, depth_overhead_s=0.001,
                      batches={4: BatchCosts(target_s=[2.0, 6.0], draft_s=[0.2, 0.5],
                                             draft_first_s=[0.3, 0.6], step_overhead_s=0.03,
                                             depth_overhead_s=0.004),
                               8: BatchCosts(target_s=[3.0, 10.0], draft_s=[0.3, 0.9])})


def test_latency_between_batch_sizes_is_interpolated():
    p = PROFILE
    assert p.batch_sizes == [1, 4, 8]
    assert (p.target(1, rows=4), p.target(8, rows=8)) == (2.0, 10.0)
    assert p.target(8, rows=6) == pytest.approx(8.0)  # halfway between 6 and 10
    assert p.target(4, rows=2) == pytest.approx((1 + 3 / 7) + (2 + 12 / 7 - 1 - 3 / 7) / 3)
    assert p.draft_first(1, rows=4) == 0.3 and p.draft_first(1, rows=8) == 0.3  # its draft_s
    # overheads: calibrated at 1 and 4, held beyond 4
    assert p.overheads(2) == pytest.approx((0.01 + 0.02 / 3, 0.001 + 0.001))
    assert p.overheads(8) == (0.03, 0.004)


def test_rows_outside_the_measured_sizes_are_refused():
    for rows in (0, 9, 2.5):
        with pytest.raises(MCSDError, match=r"measured at batch size\(s\) 1, 4, 8"):
            PROFILE.target(1, rows=rows)
    with pytest.raises(MCSDError, match="--batch-size 1,4,8,16"):
        PROFILE.step_seconds(Tree((1,)), 1, 1, rows=16)


def test_a_step_at_b_rows_prices_every_forward_at_b_rows():
    tree = Tree((2, 1))  # depth 1: 2 nodes, depth 2: 2 nodes
    # stopped at depth 2 with 2 pending per row, 4 rows: first draft over 2 tokens per row,
    # then depth 1's 2 nodes, the target over 1 + 4
    want = (0.3 + 0.3 / 7) + (0.2 + 0.3 / 7) + (2.0 + 4 * 4 / 7) + 0.03 + 0.004 * 2
    assert PROFILE.step_seconds(tree, 2, 2, rows=4) == pytest.approx(want)
    assert PROFILE.step_seconds(tree, 2, 2) == PROFILE.step_seconds(tree, 2, 2, rows=1)


def test_round_trip_and_version_one_files(tmp_path):
    PROFILE.save(tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["version"] == 2 and list(data["batches"]) == ["4", "8"]
    assert CostProfile.load(tmp_path / "p.json") == PROFILE
    old = {k: v for k, v in data.items() if k != "batches"} | {"version": 1}
    (tmp_path / "old.json").write_text(json.dumps(old))
    p = CostProfile.load(tmp_path / "old.json")
    assert p.batch_sizes == [1] and p.target(8) == 2.0
    with pytest.raises(MCSDError, match="1 rows? lie|2 rows lie outside"):
        p.target(1, rows=2)


@pytest.mark.parametrize(("batches", "message"), [
    ({"1": {"target_s": [1, 2], "draft_s": [1, 2]}}, "batch sizes above 1, got '1'"),
    ({"4": {"target_s": [1], "draft_s": [1, 2]}}, r"\(batch size 4\): tokens, target_s"),
    ({"4": {"target_s": [1, 2], "draft_s": [1, -2]}}, "non-negative"),
    ({"4": {"target": [1, 2]}}, "is not a batch size's curves"),
])
def test_bad_batch_curves_are_named(tmp_path, batches, message):
    data = PROFILE.to_json() | {"batches": batches}
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(MCSDError, match=message):
        CostProfile.load(tmp_path / "p.json")


def test_parse_batch_sizes():
    assert parse_batch_sizes("1,8, 16", "--batch-sizes") == (1, 8, 16)
    for bad in ("", "0,4", "a", "4;8"):
        with pytest.raises(MCSDError, match="--batch-sizes takes positive integers"):
            parse_batch_sizes(bad, "--batch-sizes")


def test_measure_at_batch_sizes_on_a_tiny_pair(monkeypatch):
    """The forwards run on a tiny pair, timed by a clock that each forward advances by a
    scripted time per (model, rows, tokens per row) and call: a warm-up round that must be
    dropped, then rounds of m / 2, 10 m and m, whose median m is kept (their mean would not
    be), also where they fall with more tokens (the target at 2 rows: 3 then 1, the draft at 3
    rows: 0.5 then 0.4)."""
    from types import SimpleNamespace

    from mcsd_runtime.benchmarks import measure as cost
    medians = {("target", 1): (1.0, 2.0), ("target", 2): (3.0, 1.0), ("target", 3): (2.0, 4.0),
               ("draft", 1): (0.1, 0.2), ("draft", 2): (0.3, 0.3), ("draft", 3): (0.5, 0.4)}
    clock, calls = [0.0], {}

    def scripted(name):  # a forward hook: it runs before the timer's own, which reads the clock
        def hook(module, args, kwargs, output):
            rows, n = kwargs["input_ids"].shape
            if n in (1, 4):  # not a cache's prefill (16 tokens)
                m = medians[(name, rows)][(1, 4).index(n)]
                k = calls[(name, rows, n)] = calls.get((name, rows, n), -1) + 1
                clock[0] += (100.0, m / 2, 10 * m, m)[k]
        return hook

    pair = make_pair()
    handles = [pair.target.register_forward_hook(scripted("target"), with_kwargs=True),
               pair.draft.register_forward_hook(scripted("draft"), with_kwargs=True)]
    monkeypatch.setattr(cost, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    try:
        p = measure(pair, tokens=(1, 4), context=16, rounds=3, batch_sizes=(3, 2))
    finally:
        for h in handles:
            h.remove()
    assert set(calls.values()) == {3}  # a warm-up and 3 timed rounds of every forward
    assert p.batch_sizes == [1, 2, 3]
    assert (p.target_s, p.draft_s) == (pytest.approx([1.0, 2.0]), pytest.approx([0.1, 0.2]))
    want = {2: ([3.0, 1.0], [0.3, 0.3]), 3: ([2.0, 4.0], [0.5, 0.4])}  # medians as measured
    for b in (2, 3):
        c = p.batches[b]
        assert (c.target_s, c.draft_s) == tuple(pytest.approx(v) for v in want[b])
        assert c.step_overhead_s is None  # not calibrated: overheads from batch size 1
    assert p.overheads(3) == (0.0, 0.0)


def test_static_runs_at_a_batch_size_time_the_batched_decoder():
    """One run for AR (depth 0) and each static depth through generate_batch: its steps,
    drafted depths and tokens are the batch's; the forward timer sees exactly the decode-phase
    forwards (no prefill)."""
    from mcsd_runtime.benchmarks.measure import ForwardTimer as _ForwardTimer
    from mcsd_runtime.benchmarks.measure import calibrate, static_runs
    from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder

    pair = make_pair()
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11, 12], [13]]
    runs, forwards = static_runs(pair, prompts, (1, 1, 1), max_new_tokens=6, batch_size=2)
    assert sorted(r["depth"] for r in runs) == [0, 1, 2, 3]
    ar = next(r for r in runs if r["depth"] == 0)
    assert ar["drafted"] == 0 and ar["tokens"] == 6 * len(prompts)
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(1, 1, 1), max_new_tokens=6),
                      stopper="static:2")
    with _ForwardTimer(pair) as log:
        st = dec.generate_batch(prompts, batch_size=2).stats
    run = next(r for r in runs if r["depth"] == 2)
    assert (run["steps"], run["drafted"], run["tokens"]) == (st.target_calls, st.draft_calls,
                                                             st.new_tokens)
    assert sum(name == "target" for name, *_ in log) == st.target_calls
    assert sum(name == "draft" for name, *_ in log) == st.draft_calls
    assert all(r["decode_s"] > r["forward_s"] > 0 for r in runs)
    assert {("target", 3), ("draft_first", 1)} <= set(forwards)  # depth 2: root + 2 nodes
    cal = calibrate(PROFILE.__class__(tokens=[1, 2, 4], target_s=[1.0, 1.0, 1.0],
                                      draft_s=[0.1, 0.1, 0.1],
                                      batches={2: BatchCosts(target_s=[2.0, 2.0, 2.0],
                                                             draft_s=[0.2, 0.2, 0.2])}),
                    runs, forwards, min_samples=1, batch_size=2)
    assert cal.target_s == [1.0, 1.0, 1.0] and cal.step_overhead_s == 0.0  # size 1 untouched
    b2 = cal.batches[2]
    # each curve: the decoder's median where it ran forwards of that many tokens per row (the
    # profile's own value elsewhere), as measured
    for curve, kind, base in ((b2.target_s, "target", 2.0), (b2.draft_s, "draft", 0.2),
                              (b2.draft_first_s, "draft_first", 0.2)):
        medians = [statistics.median(forwards[(kind, n)]) if (kind, n) in forwards else base
                   for n in (1, 2, 4)]
        assert curve == pytest.approx(medians, rel=1e-12), kind
    assert ("target", 1) in forwards and b2.target_s != [2.0, 2.0, 2.0]  # it measured some
    a = np.array([[r["steps"], r["drafted"]] for r in runs], float)
    coef, _ = nnls(a, np.array([r["decode_s"] - r["forward_s"] for r in runs]))
    assert (b2.step_overhead_s, b2.depth_overhead_s) == pytest.approx(tuple(coef), rel=1e-9)
    assert b2.static["tokens_per_s"] == pytest.approx(
        {f"static:{r['depth']}" if r["depth"] else "ar": r["tokens"] / r["decode_s"]
         for r in runs}, rel=1e-12)


