"""Cost profiles: interpolation, files, measurement on a tiny pair."""

from __future__ import annotations

import json

import pytest

from conftest import make_pair
from mcsd_runtime.cost import CostProfile, measure
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
    p = measure(make_pair(), tokens=(1, 2, 8), context=16, repeats=1, warmup=1)
    assert p.tokens == [1, 2, 8] and all(t > 0 for t in p.target_s + p.draft_s)
    assert p.pair["target_config"]
