"""`mcsd train --batch-size`: a setting per batch size chosen by batched replay, written to
stopper.json's `batch` table, and refused without a profile measured at those sizes."""

from __future__ import annotations

import json
import warnings

import pytest
from test_batch_replay import PROFILE
from test_train_data import dense_rows, small_pair

import replay as R
from mcsd_runtime.cli import build_parser, run_parser
from mcsd_runtime.decisions.learned import load_stopper
from mcsd_runtime.errors import MCSDError
from train.cli import register
from train.stop.trainer import train_stopper

MANIFESTS = [{"pair": small_pair().fingerprint, "k_config": [4, 2, 2, 1]}]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("batched")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = train_stopper(dense_rows(), MANIFESTS, out, model="lightgbm",
                                profile=PROFILE, batch_sizes=(4,), aggregations=("max", "sum"),
                                decision_us=20.0, progress=False, log=lambda *_: None)
    return out, summary


def test_the_table_holds_the_setting_chosen_at_each_batch_size(trained):
    out, summary = trained
    spec = json.loads((out / "stopper.json").read_text())
    assert list(spec["batch"]) == ["4"]
    chosen = summary["batches"]["4"]["chosen"]
    assert spec["batch"]["4"] == {k: chosen[k] for k in ("threshold", "aggregation",
                                                         "row_aggregation", "min_depth",
                                                         "min_depth_gate")}
    assert chosen["aggregation"] == spec["aggregation"]  # the node aggregation chosen alone
    stopper = load_stopper(out)
    at4 = stopper.for_batch(4)
    assert (at4.threshold, at4.row_aggregation) == (chosen["threshold"],
                                                    chosen["row_aggregation"])
    assert stopper.for_batch(2).threshold == spec["threshold"]  # below 4: the top level


def test_the_batch_results_are_replays_at_that_batch_size(trained):
    """The headline's learned value is the artifact replayed at B=4 on the test prompts with
    the decision costs charged; the choice is the best validation point; the bound holds."""
    out, summary = trained
    b4 = summary["batches"]["4"]
    curve = json.loads((out / "replay_curve.json").read_text())["batches"]["4"]["curve"]
    assert b4["chosen"]["throughput"] >= max(c["throughput"] for c in curve)
    assert {c["row_aggregation"] for c in curve} == {"max", "mean", "sum"}
    # every static depth is a candidate: replayed as static:m, with no decision
    statics = {c["min_depth"]: c for c in curve if c["threshold"] > 1}
    assert sorted(statics) == [1, 2, 3, 4]
    data = R.ReplayData(dense_rows())
    val = data.subset(json.loads((out / "stopper.json").read_text())
                      ["training_data"]["prompts"]["val"])
    for m, c in statics.items():
        plain = R.replay(val, f"static:{m}", PROFILE, batch_size=4)
        assert (c["tokens"], c["cost_s"], c["decisions"]) == (plain.tokens, plain.cost_s, 0)
    test = b4["results"]["test"]
    assert test["learned"]["batch_size"] == 4 and test["static:1"]["batch_size"] == 4
    assert max(v["throughput"] for v in test.values()) <= test["oracle-bound"]["throughput"]
    data = R.ReplayData(dense_rows())
    test_prompts = json.loads((out / "stopper.json").read_text())["training_data"]["prompts"]
    part = data.subset(test_prompts["test"])
    again = R.replay(part, load_stopper(out), PROFILE, batch_size=4, decision_s=20e-6,
                     decision_row_s=summary["latency"]["batch_row_us"] * 1e-6)
    assert again.throughput == pytest.approx(test["learned"]["throughput"], rel=1e-12)
    assert b4["headline"]["learned_value"] == test["learned"]["throughput"]


def test_batch_sizes_beyond_the_profile_are_refused_before_any_work(tmp_path):
    with pytest.raises(MCSDError, match="batch size.s. 1, 4: 8 rows lie outside"):
        train_stopper(dense_rows(), MANIFESTS, tmp_path, profile=PROFILE, batch_sizes=(1, 8),
                      log=lambda *_: None)
    with pytest.raises(MCSDError, match="needs a measured --cost-profile"):
        train_stopper(dense_rows(), MANIFESTS, tmp_path, batch_sizes=(4,), log=lambda *_: None)
    with pytest.raises(MCSDError, match="batch sizes must be positive integers"):
        train_stopper(dense_rows(), MANIFESTS, tmp_path, batch_sizes=(0,), log=lambda *_: None)
    assert not any(tmp_path.iterdir())


def test_cli_batch_size_errors(tmp_path, capsys):
    parser = build_parser([register])
    run = tmp_path / "run"
    run.mkdir()
    code = run_parser(parser, ["train", "--runs", str(run), "--out", str(tmp_path / "x"),
                               "--batch-size", "1,x"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--batch-size takes positive integers" in err and "Traceback" not in err
