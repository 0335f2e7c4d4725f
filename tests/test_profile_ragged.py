"""Ragged forwards in the cost profile: `mcsd profile` at B > 1 times packed target and draft
forwards at a few totals (through the engine's `call_model` with a `Ragged` layout) and stores
them under `ragged`; `ragged_target` / `ragged_draft` price by them, and a profile without them
prices by the padded curves as before."""

from __future__ import annotations

import json

import pytest
from test_ragged import ragged_ready

from conftest import make_pair
from mcsd_runtime import cli
from mcsd_runtime.benchmarks.ragged_bench import ragged_counts, ragged_totals
from mcsd_runtime.cli.profile import register as profile_register
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import BatchCosts, CostProfile, RaggedCosts

PADDED = dict(tokens=[1, 4, 8], target_s=[1.0, 1.2, 1.6], draft_s=[0.1, 0.12, 0.16],
              draft_first_s=[0.2, 0.24, 0.32],
              batches={4: BatchCosts(target_s=[1.2, 2.0, 3.2], draft_s=[0.12, 0.2, 0.3],
                                     draft_first_s=[0.24, 0.4, 0.6]),
                       8: BatchCosts(target_s=[1.5, 2.5, 4.0], draft_s=[0.15, 0.25, 0.4])})
# measured at B=4 far from what the padded curves give (1.2 s at one token a row)
RAGGED = {4: RaggedCosts(target=[[4, 0.5], [16, 0.9], [32, 1.7]],
                         draft=[[1, 0.01], [4, 0.05], [32, 0.19]])}


def mcsd(argv: list[str]) -> int:
    return cli.run_parser(cli.build_parser([profile_register]), argv)


def test_ragged_layouts_and_totals():
    assert ragged_counts(3, 8, 16) == [1, 1, 1, 0, 0, 0, 0, 0]  # a draft depth of 3 rows
    assert ragged_counts(8, 8, 16) == [1] * 8
    assert ragged_counts(24, 8, 16) == [16, 2, 1, 1, 1, 1, 1, 1]
    assert ragged_counts(40, 8, 16) == [16, 16, 3, 1, 1, 1, 1, 1]
    assert ragged_counts(128, 8, 16) == [16] * 8
    with pytest.raises(ValueError):
        ragged_counts(129, 8, 16)
    assert ragged_totals(8, 16) == [1, 4, 8, 16, 24, 40, 64, 128]
    assert ragged_totals(8, 16, least=8) == [8, 16, 24, 40, 64, 128]
    assert ragged_totals(2, 4) == [1, 2, 4, 6, 8]
    assert ragged_totals(2, 3) == [1, 2, 4, 6]


def test_profile_records_ragged_points_on_a_tiny_pair(tmp_path, monkeypatch):
    """`mcsd profile --batch-size 1,2` on a tiny pair attending with mcsd_sdpa: every ragged
    point is a packed forward through the engine's `call_model`, at the layout `ragged_counts`
    gives (rows at most 3 wide: the chain 1,1's widest target forward, under --max-tokens 4),
    and lands in the JSON; pricing at B=2 reads them. On `sdpa` none are timed."""
    from mcsd_runtime.cli import args as cli_args
    from mcsd_runtime.decode import graphs

    seen, call_model = [], graphs.call_model

    def spy(model, cache, ids, pos, mask, keep, hidden, prev=None, ragged=None):
        if ragged is not None:
            seen.append((ids.shape[0], tuple(ragged.counts)))
        return call_model(model, cache, ids, pos, mask, keep, hidden, prev, ragged)

    monkeypatch.setattr(graphs, "call_model", spy)
    pairs = iter([ragged_ready(make_pair()), make_pair()])
    monkeypatch.setattr(cli_args, "pair_from_args", lambda args: next(pairs))
    argv = ["profile", "--target", "tiny", "--prompts", "none", "--max-tokens", "4",
            "--rounds", "1", "--context", "16", "--batch-size", "1,2", "--threads", "1",
            "--k-config", "1,1"]
    assert mcsd([*argv, "--out", str(tmp_path / "cost.json")]) == 0
    data = json.loads((tmp_path / "cost.json").read_text())
    assert list(data["ragged"]) == ["2"]
    points = data["ragged"]["2"]
    assert points["width"] == 3
    assert [t for t, _ in points["target"]] == [2, 4, 6]  # from one token a row
    assert [t for t, _ in points["draft"]] == [1, 2, 4, 6]
    assert all(s > 0 for t, s in points["target"] + points["draft"])
    # a warm-up and one timed round of each, laid out as ragged_counts says
    want = {(2, tuple(ragged_counts(t, 2, 3))) for t in (1, 2, 4, 6)}
    assert set(seen) == want and len(seen) == 2 * (3 + 4)
    p = CostProfile.load(tmp_path / "cost.json")
    assert p.ragged_target(6, 2) == pytest.approx(points["target"][2][1])
    assert p.ragged_draft(1, 2) == pytest.approx(points["draft"][0][1])
    assert mcsd([*argv, "--out", str(tmp_path / "sdpa.json")]) == 0
    assert json.loads((tmp_path / "sdpa.json").read_text())["ragged"] == {}


def test_pricing_reads_the_measured_points():
    p = CostProfile(**PADDED, ragged=RAGGED)
    assert p.ragged_target(4, 4) == pytest.approx(0.5)  # padded: 1.2
    assert p.ragged_target(10, 4) == pytest.approx(0.7)  # halfway from 4 to 16 tokens
    assert p.ragged_target(2, 4) == pytest.approx(0.5)  # below the first point: the floor
    assert p.ragged_target(40, 4) == pytest.approx(1.7 + 8 * 0.8 / 16)  # the last slope
    assert p.ragged_draft(1, 4) == pytest.approx(0.01)
    assert p.ragged_draft(2, 4) == pytest.approx(0.01 + 0.04 / 3)
    assert p.ragged_target(0, 4) == 0.0 == p.ragged_draft(0, 4)
    # a step's first draft forward: the measured curve times the padded first / rest ratio
    assert p.ragged_draft(4, 4, first=True) == pytest.approx(0.05 * 0.24 / 0.12)
    # rows between measured sizes: 1 (its padded curve) and 4 (measured, at 4 x 2 tokens),
    # at 2 tokens a row
    at1, at4 = p.target(2), 0.5 + 4 / 12 * 0.4
    assert p.ragged_target(4, 2) == pytest.approx(at1 + (1 / 3) * (at4 - at1))
    # B=8 has no points: the padded curve at tokens / rows, as before
    assert p.ragged_target(16, 8) == pytest.approx(p.target(2, 8))
    # a ragged step prices its forwards by them too, where the engine packs them (one row of
    # four verifies, the others send their root only: 6 tokens of a 3-wide grid of 4 rows)
    uneven = [(1, 2, 2)] + [(1, 0, 0)] * 3
    assert p.ragged_step_seconds(_chain(2), uneven) < CostProfile(
        **PADDED).ragged_step_seconds(_chain(2), uneven)
    # ...and equal rows run padded, as the engine runs them: the measured points are not read
    assert p.ragged_step_seconds(_chain(2), [(1, 2, 2)] * 4) == CostProfile(
        **PADDED).ragged_step_seconds(_chain(2), [(1, 2, 2)] * 4)


def _chain(depth: int):
    from mcsd_runtime.tree import Tree

    return Tree((1,) * depth)


def test_an_old_profile_prices_as_before(tmp_path):
    """A profile JSON without `ragged` loads and prices every ragged forward by the padded
    curve at tokens / rows, as it always did."""
    path = tmp_path / "old.json"
    data = CostProfile(**PADDED).to_json()
    del data["ragged"]
    path.write_text(json.dumps(data))
    old = CostProfile.load(path)
    assert old.ragged == {}
    for rows in (1, 2, 4, 6, 8):
        for tokens in (0, 1, 3, rows, 2.5 * rows, 6 * rows, 10 * rows):
            per_row = tokens / rows
            for name, price in (("target_s", old.ragged_target),
                                ("draft_s", old.ragged_draft),
                                ("draft_first_s", lambda t, r: old.ragged_draft(t, r, True))):
                want = old._latency(name, per_row, rows) if tokens else 0.0
                assert price(tokens, rows) == pytest.approx(want, rel=0, abs=0)
    assert old.ragged_target(10, 4) == pytest.approx(1.2 + 1.5 / 3 * 0.8)
    assert old.ragged_target(3, 4) == pytest.approx(old.target(1, 4))  # the floor


def test_ragged_points_round_trip_and_are_checked(tmp_path):
    path = tmp_path / "cost.json"
    CostProfile(**PADDED, ragged=RAGGED).save(path)
    back = CostProfile.load(path)
    assert back.ragged == RAGGED and json.loads(path.read_text())["ragged"]["4"]["target"][0] == [
        4, 0.5]
    with pytest.raises(MCSDError, match="ragged keys are batch sizes of batches"):
        CostProfile(**PADDED, ragged={16: RAGGED[4]})
    for bad in ([], [[4, 0.5], [4, 0.6]], [[0, 0.1]], [[2, -1.0]], [[2.5, 0.1]], [[1]]):
        with pytest.raises(MCSDError, match="ragged target must be"):
            CostProfile(**PADDED, ragged={4: {"target": bad, "draft": [[1, 0.1]]}})
    with pytest.raises(MCSDError, match="ragged width"):
        CostProfile(**PADDED, ragged={4: {"target": [[4, 0.5]], "draft": [[1, 0.1]],
                                          "width": -1}})
