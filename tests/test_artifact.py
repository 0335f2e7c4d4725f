"""`stopper.json` as a typed contract (`mcsd_runtime.decisions.artifact.ArtifactSpec`): artifacts
written before the contract existed still load, and a bad field is named."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mcsd_runtime.decisions.artifact import FILE, ArtifactSpec
from mcsd_runtime.decisions.builtin import make_stopper
from mcsd_runtime.decisions.features import DECISION_FEATURES
from mcsd_runtime.decisions.learned import LearnedStopper, load_stopper
from mcsd_runtime.errors import MCSDError

# written by `train_stopper` at commit b8df3aa (stopper.json an untyped dict), on the dense rows
# of test_train_data
OLD = Path(__file__).parent / "fixtures" / "stoppers-b8df3aa"


@pytest.mark.parametrize("kind", ["lightgbm", "mlp"])
def test_artifacts_written_before_the_contract_load(kind):
    folder = OLD / kind
    written = json.loads((folder / FILE).read_text())
    spec = ArtifactSpec.read(folder)
    assert spec.to_json() == written  # every field, in the file's order
    assert list(spec.to_json()) == list(written)
    stopper = load_stopper(folder)
    assert (stopper.kind, stopper.threshold, stopper.aggregation) == (
        kind, written["threshold"], written["aggregation"])
    assert stopper.k_config == tuple(written["k_config"])
    x = np.random.default_rng(0).random((5, len(DECISION_FEATURES)))
    scores = stopper.node_scores(x)
    assert scores.shape == (5,) and ((scores >= 0) & (scores <= 1)).all()
    assert make_stopper(f"stopper:{folder}", (4, 2, 2, 1)).kind == kind


def test_optional_fields_take_their_defaults_and_k_config_is_required(tmp_path):
    """min_depth, its gate and the training record may be absent (their defaults); the tree the
    stopper was trained on may not."""
    folder = tmp_path / "spare"
    shutil.copytree(OLD / "lightgbm", folder)
    data = json.loads((folder / FILE).read_text())
    for key in ("min_depth", "min_depth_gate", "metrics", "training_data", "created"):
        del data[key]
    (folder / FILE).write_text(json.dumps(data))
    stopper = load_stopper(folder)
    assert stopper.min_depth == 1 and stopper.min_depth_gate == 0.0
    assert stopper.k_config == (4, 2, 2, 1) and stopper.spec.metrics is None
    for k_config in (None, []):
        (folder / FILE).write_text(json.dumps(data | {"k_config": k_config}))
        with pytest.raises(MCSDError, match="is not a k-config"):
            load_stopper(folder)
    del data["k_config"]
    (folder / FILE).write_text(json.dumps(data))
    with pytest.raises(MCSDError, match=r"missing field\(s\) k_config"):
        load_stopper(folder)


def test_write_then_read_is_the_same_description(tmp_path):
    spec = replace(ArtifactSpec.read(OLD / "lightgbm"), threshold=0.25, min_depth=2,
                   k_config=[2, 1], skip_rate=0.4, skip_probe=6)
    assert spec.k_config == (2, 1)  # normalized on construction
    spec.write(tmp_path)
    assert ArtifactSpec.read(tmp_path) == spec
    stopper = LearnedStopper(ArtifactSpec.read(tmp_path), model=None)
    assert (stopper.skip.rate, stopper.skip.probe) == (0.4, 6)
    with pytest.raises(MCSDError, match="is not a stopper artifact"):  # it reads folders
        ArtifactSpec.read(tmp_path / FILE)


@pytest.mark.parametrize(("change", "message"), [
    ({"format": "other"}, "is not a stopper description"),
    ({"kind": "svm"}, "unknown stopper kind 'svm'"),
    ({"schema_version": 999}, "feature schema version 999"),
    ({"feature_names": ["depth", "bogus"]}, r"feature list differs .*unknown: \['bogus'\]"),
    ({"feature_names": ["log_path_prob", "depth"]}, "feature list differs"),
    ({"feature_names": []}, "feature list differs"),
    ({"aggregation": "median"}, "unknown aggregation 'median'"),
    ({"threshold": "high"}, "missing or non-numeric threshold, got 'high'"),
    ({"min_depth": 0}, "min_depth must be a positive integer, got 0"),
    ({"min_depth": 1.5}, "min_depth must be a positive integer, got 1.5"),
    ({"k_config": [4, 0]}, r"k_config \[4, 0\] is not a k-config"),
    ({"min_depth_gate": 1.5}, r"min_depth_gate must be a number in \[0, 1\], got 1.5"),
    ({"inputs": "pixels"}, "inputs 'pixels'"),
    ({"threshold": None}, "non-numeric threshold, got None"),
    ({"skip_rate": 1.5}, r"skip rate 1.5: an acceptance rate in \[0, 1\]"),
    ({"skip_rate": "low"}, "skip_rate must be a number in"),
    ({"skip_rate": 0.5, "skip_probe": 0}, "skip probe 0: a whole number of steps >= 1"),
    ({"feature_names": 5}, "malformed field"),
])
def test_a_bad_field_is_named(tmp_path, change, message):
    data = json.loads((OLD / "lightgbm" / FILE).read_text()) | change
    (tmp_path / FILE).write_text(json.dumps(data))
    with pytest.raises(MCSDError, match=message) as err:
        ArtifactSpec.read(tmp_path)
    assert str(err.value).startswith(str(tmp_path / FILE))


def test_a_missing_field_is_named(tmp_path):
    data = json.loads((OLD / "lightgbm" / FILE).read_text())
    del data["threshold"], data["kind"]
    (tmp_path / FILE).write_text(json.dumps(data))
    with pytest.raises(MCSDError, match="missing field.s. kind, threshold"):
        ArtifactSpec.read(tmp_path)
    with pytest.raises(MCSDError, match="is not a stopper artifact: no stopper.json"):
        ArtifactSpec.read(tmp_path / "nowhere")
