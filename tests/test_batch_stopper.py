"""Learned stoppers under a batch: stopper.json's `batch` table (typed, round trip, old artifacts
unchanged), `for_batch` picking a batch size's setting, and `batch_continue` scoring every row
in one model call and aggregating over rows."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mcsd_runtime.decisions.artifact import FILE, ArtifactSpec, BatchSetting
from mcsd_runtime.decisions.features import DECISION_FEATURES, TRAJECTORY_FEATURES
from mcsd_runtime.decisions.learned import LearnedStopper, load_stopper
from mcsd_runtime.errors import MCSDError

OLD = Path(__file__).parent / "fixtures" / "stoppers-b8df3aa"
TABLE = {"8": {"threshold": 0.3, "aggregation": "sum", "row_aggregation": "mean",
               "min_depth": 2, "min_depth_gate": 0.5},
         "16": {"threshold": 1.5, "row_aggregation": "sum"}}


def with_table(tmp_path: Path, table: dict = TABLE) -> Path:
    folder = tmp_path / "lightgbm"
    shutil.copytree(OLD / "lightgbm", folder)
    data = json.loads((folder / FILE).read_text()) | {"batch": table}
    (folder / FILE).write_text(json.dumps(data))
    return folder


def test_the_table_round_trips_and_fills_in_the_top_level(tmp_path):
    spec = ArtifactSpec.read(with_table(tmp_path))
    assert spec.batch == {
        8: BatchSetting(threshold=0.3, aggregation="sum", row_aggregation="mean", min_depth=2,
                        min_depth_gate=0.5),
        16: BatchSetting(threshold=1.5, aggregation=spec.aggregation, row_aggregation="sum",
                         min_depth=spec.min_depth, min_depth_gate=spec.min_depth_gate)}
    out = tmp_path / "again"
    out.mkdir()
    spec.write(out)
    assert ArtifactSpec.read(out) == spec
    assert list(json.loads((out / FILE).read_text())["batch"]) == ["8", "16"]


def test_an_artifact_without_the_table_is_written_as_before(tmp_path):
    spec = ArtifactSpec.read(OLD / "lightgbm")
    assert spec.batch is None and "batch" not in spec.to_json()
    old = load_stopper(OLD / "lightgbm")
    assert old.for_batch(8) is old and old.row_aggregation == "max"


@pytest.mark.parametrize(("table", "message"), [
    ({"0": {"threshold": 0.5}}, "batch: '0' is not a batch size"),
    ({"eight": {"threshold": 0.5}}, "batch: 'eight' is not a batch size"),
    ({"8": {"aggregation": "max"}}, r"batch\[8\] must be an object with a threshold"),
    ({"8": {"threshold": 0.5, "row_aggregation": "median"}},
     r"batch\[8\]: unknown row aggregation 'median'"),
    ({"8": {"threshold": "high"}}, r"batch\[8\]: missing or non-numeric threshold"),
    ({"8": {"threshold": 0.5, "min_depth": 0}}, r"batch\[8\]: min_depth must be a positive"),
    ([0.5], "batch must map batch sizes to settings"),
])
def test_a_bad_table_is_named(tmp_path, table, message):
    with pytest.raises(MCSDError, match=message) as err:
        ArtifactSpec.read(with_table(tmp_path, table))
    assert str(err.value).startswith(str(tmp_path / "lightgbm" / FILE))


def test_for_batch_takes_the_largest_size_at_or_below(tmp_path):
    stopper = load_stopper(with_table(tmp_path))
    top = (stopper.threshold, stopper.aggregation, "max", stopper.min_depth)
    pick = {b: stopper.for_batch(b) for b in (1, 4, 8, 12, 16, 64)}
    for b in (1, 4):
        s = pick[b]
        assert (s.threshold, s.aggregation, s.row_aggregation, s.min_depth) == top
    for b in (8, 12):
        s = pick[b]
        assert (s.threshold, s.aggregation, s.row_aggregation, s.min_depth,
                s.min_depth_gate) == (0.3, "sum", "mean", 2, 0.5)
    assert (pick[16].threshold, pick[64].row_aggregation) == (1.5, "sum")
    assert stopper.threshold == top[0] and pick[8].model is stopper.model  # a copy
    # an explicit override applies at every batch size: the table is dropped
    fixed = load_stopper(with_table(tmp_path / "x"), threshold=0.7)
    assert fixed.for_batch(8).threshold == 0.7


# ------------------------------------------------------------------ batch_continue
class CountingModel:
    """Scores a node by its first feature; counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.asarray(x[:, 0], dtype=np.float64)


class Front:
    """A frontier whose nodes score `scores` (first decision feature)."""

    def __init__(self, scores: list[float], depth: int = 2, recent: float = 0.0) -> None:
        self.depth, self.max_depth, self.scores, self.recent = depth, 4, scores, recent

    def trajectory(self) -> list[float]:
        t = [0.0] * len(TRAJECTORY_FEATURES)
        t[TRAJECTORY_FEATURES.index("accept_rate_recent")] = self.recent
        return t

    def decision_features(self) -> np.ndarray:
        x = np.zeros((len(self.scores), len(DECISION_FEATURES)))
        x[:, 0] = self.scores
        return x


def stopper(**setting) -> tuple[LearnedStopper, CountingModel]:
    spec = replace(ArtifactSpec.read(OLD / "lightgbm"), aggregation="max", threshold=0.5,
                   min_depth=1, min_depth_gate=0.0,
                   batch={4: BatchSetting(**({"threshold": 0.5, "aggregation": "max"}
                                             | setting))})
    model = CountingModel()
    return LearnedStopper(spec, model).for_batch(4), model


# node scores per row (max over nodes): 0.9, 0.1, 0.2; their mean 0.4, their sum 1.2
ROWS = [[0.9, 0.3], [0.1], [0.2, 0.05, 0.0]]


@pytest.mark.parametrize(("rows", "threshold", "want"), [
    ("max", 0.5, True), ("mean", 0.5, False), ("mean", 0.35, True),
    ("sum", 1.0, True), ("sum", 1.3, False)])
def test_rows_aggregate_by_the_batch_setting_in_one_model_call(rows, threshold, want):
    s, model = stopper(row_aggregation=rows, threshold=threshold)
    assert s.batch_continue([Front(r) for r in ROWS]) is want
    assert model.calls == 1  # all rows' nodes scored at once
    assert s.frontier_scores([Front(r) for r in ROWS]) == pytest.approx([0.9, 0.1, 0.2])


def test_max_over_rows_decides_as_any_row_alone():
    s, _ = stopper(row_aggregation="max", threshold=0.5)
    for rows in (ROWS, ROWS[1:], [[0.5]], [[0.49], [0.2]]):
        fronts = [Front(r) for r in rows]
        assert s.batch_continue(fronts) is any(s.should_continue(f) for f in fronts)


def test_a_row_in_its_no_decision_zone_keeps_the_batch_drafting():
    """min_depth 3: a row at depth 2 with recent acceptance above the gate drafts on without
    the model; below the gate (or at depth 3) the model decides."""
    s, model = stopper(row_aggregation="mean", threshold=0.9, min_depth=3, min_depth_gate=0.5)
    low = [Front([0.1], depth=3), Front([0.1], depth=2, recent=0.2)]
    assert s.batch_continue(low) is False and model.calls == 1
    assert s.batch_continue([*low, Front([0.1], depth=2, recent=0.6)]) is True
    assert model.calls == 1  # no model call when a row skips the decision


def test_an_unreachable_threshold_is_a_static_depth_without_a_model_call():
    """Frontier scores lie in [0, 1], so a threshold above 1 (above the number of rows for a
    sum) stops at min_depth without scoring: a static depth that costs no decision."""
    from mcsd_runtime.decisions.aggregation import reachable

    assert reachable("max", 1.0, 8) and not reachable("mean", 1.01, 8)
    assert reachable("sum", 3.0, 3) and not reachable("sum", 3.5, 3)
    s, model = stopper(row_aggregation="max", threshold=2.0, min_depth=3)
    assert s.batch_continue([Front([1.0], depth=2), Front([1.0], depth=2)]) is True
    assert s.batch_continue([Front([1.0], depth=3)]) is False
    assert s.should_continue(Front([1.0], depth=3)) is False and model.calls == 0
    s, model = stopper(row_aggregation="sum", threshold=2.5)
    assert s.batch_continue([Front([1.0]), Front([1.0])]) is False and model.calls == 0
    assert s.batch_continue([Front([1.0]), Front([1.0]), Front([0.6])]) is True
    assert model.calls == 1


# ------------------------------------------------------------------ real stoppers, real frontiers
K_CONFIG = (4, 2, 2, 1)  # the tree the fixtures were trained on (tests/test_train_data.py)
B = 3
# per model: the top-level setting (batch size 1) and the setting stopper.json gives B rows; the
# two thresholds differ where the batch's row score often lies between them
SETTINGS = {
    "lightgbm": ({"threshold": 0.95, "aggregation": "sum"},
                 {"threshold": 0.7, "aggregation": "sum", "row_aggregation": "max"}),
    "mlp": ({"threshold": 0.6, "aggregation": "sum"},
            {"threshold": 0.45, "aggregation": "sum", "row_aggregation": "mean"}),
    "mlp-hidden": ({"threshold": 0.4, "aggregation": "max"},
                   {"threshold": 0.6, "aggregation": "max", "row_aggregation": "max"}),
}
NODE = {"max": lambda p: float(np.max(p)), "sum": lambda p: float(min(1.0, np.sum(p)))}
ROW = {"max": max, "mean": lambda s: sum(s) / len(s), "sum": sum}


def hidden_artifact(folder: Path, hidden_size: int) -> None:
    """An mlp-hidden artifact on the draft's hidden states: a seeded DecisionMLP, its weights
    scaled so that its node scores spread over (0, 1)."""
    from safetensors.torch import save_file

    from mcsd_runtime.decisions.features import SCHEMA_VERSION
    from mcsd_runtime.decisions.learned import DecisionMLP

    torch.manual_seed(0)
    net = DecisionMLP(hidden_size, (16,))
    with torch.no_grad():
        net.net[-1].weight.mul_(6.0)
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(net.config()))
    ArtifactSpec(kind="mlp-hidden", schema_version=SCHEMA_VERSION,
                 feature_names=DECISION_FEATURES, inputs="hidden", hidden_size=hidden_size,
                 aggregation="max", threshold=0.5, k_config=K_CONFIG).write(folder)


def real_artifact(tmp_path: Path, kind: str, hidden_size: int) -> Path:
    """The saved fixture (or, for mlp-hidden, a written artifact) with SETTINGS[kind]."""
    folder = tmp_path / kind
    if kind == "mlp-hidden":
        hidden_artifact(folder, hidden_size)
    else:
        shutil.copytree(OLD / kind, folder)
    top, batch = SETTINGS[kind]
    data = json.loads((folder / FILE).read_text()) | top | {"batch": {str(B): batch}}
    (folder / FILE).write_text(json.dumps(data))
    return folder


def node_scorer(kind: str, folder: Path):
    """Node scores of one frontier, computed here: LightGBM through its own Python package, the
    MLPs by a forward of the artifact's network on that frontier's rows alone."""
    if kind == "lightgbm":
        import lightgbm

        booster = lightgbm.Booster(model_file=str(folder / "model.txt"))
        return lambda f: booster.predict(f.decision_features())
    from mcsd_runtime.decisions.learned import load_mlp

    net = load_mlp(folder)

    def mlp(f) -> np.ndarray:
        x = f.hidden() if kind == "mlp-hidden" else torch.from_numpy(f.decision_features())
        with torch.no_grad():
            return torch.sigmoid(net(x.cpu())).double().numpy()
    return mlp


@pytest.mark.parametrize("kind", ["lightgbm", "mlp", "mlp-hidden"])
def test_a_real_stopper_decides_a_decoded_batch_as_its_rows_scored_alone(pair, tmp_path,
                                                                         monkeypatch, kind):
    """A real artifact decodes 7 prompts 3 at a time. At every depth the batch asks, its
    decision equals the one computed here from each asked row's frontier alone (its own node
    scores, aggregated over its nodes, then over the rows by the B=3 setting, against the B=3
    threshold), and `frontier_scores` gives each row's own score in order; with row aggregation
    max, the decision is "any row's own should_continue says yes"."""
    from test_decoder_greedy import prompts

    from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder

    folder = real_artifact(tmp_path, kind, pair.draft.config.hidden_size)
    top, setting = SETTINGS[kind]
    score = node_scorer(kind, folder)
    calls = []  # (row scores computed here, each row's should_continue alone, the decision)
    real = LearnedStopper.batch_continue

    def recording(self, frontiers):
        assert self.threshold == setting["threshold"]  # for_batch(3)'s copy decides
        mine = [NODE[setting["aggregation"]](score(f)) for f in frontiers]
        # the one-call scores are each row's own, in the rows' order (row aggregations do not
        # see the order; a path aggregation or a caller reading them per row would)
        assert self.frontier_scores(frontiers) == pytest.approx(mine, rel=1e-6, abs=1e-9)
        alone = [self.should_continue(f) for f in frontiers]
        decision = real(self, frontiers)
        calls.append((mine, alone, decision))
        return decision

    monkeypatch.setattr(LearnedStopper, "batch_continue", recording)
    dec = MCSDDecoder(pair, DecodeConfig(k_config=K_CONFIG, max_new_tokens=20),
                      stopper=load_stopper(folder))
    out = dec.generate_batch(prompts(pair.vocab_size, n=7, seed=5), batch_size=B)
    assert len(out) == 7 and len(calls) > 10
    rows, thr = ROW[setting["row_aggregation"]], setting["threshold"]
    for mine, alone, decision in calls:
        assert decision is (rows(mine) >= thr), (mine, decision)
        if setting["row_aggregation"] == "max":
            assert decision is any(alone), (mine, alone)
    # the calls can tell a wrong batch decision from the right one: several rows asked at once,
    # both outcomes, a row aggregation other than the batch's, a batch without its last row,
    # and the batch-size-1 threshold would each decide some call differently
    many = [m for m, _, _ in calls if len(m) > 1]
    assert {d for _, _, d in calls} == {True, False} and len(many) > 5
    assert any((rows(m) >= thr) != (min(m) >= thr) for m in many)
    assert any((rows(m) >= thr) != (rows(m[:-1]) >= thr) for m in many)
    assert any((rows(m) >= thr) != (rows(m) >= top["threshold"]) for m, _, _ in calls)
