"""Training, replay and artifacts on a small dense collection made with the decoder."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from test_train_data import K_CONFIG, MAX_NEW, N_PROMPTS, dense_rows, prompts, small_pair

import replay as R
from conftest import shared_build
from mcsd_runtime.decisions.builtin import StopperBase, make_stopper
from mcsd_runtime.decisions.features import DECISION_FEATURES, FEATURE_SETS, TRAJECTORY_FEATURES
from mcsd_runtime.decisions.learned import check_pair, load_stopper
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.tree import parse_k_config
from replay.runs import collected_k_config, prompt_groups, sequence_ids, split_prompts
from train.stop.labels import add_labels

PROFILE = CostProfile(tokens=[1, 8, 64], target_s=[1.0, 1.1, 2.0], draft_s=[0.2, 0.22, 0.4],
                      step_overhead_s=0.05)


@pytest.fixture(scope="module")
def rows():
    return dense_rows()


@pytest.fixture(scope="module")
def data(rows):
    return R.ReplayData(rows)


@pytest.fixture(scope="module")
def labelled(rows):
    """The rows with their training labels (`add_labels`), labelled once for the module."""
    return add_labels(rows)


def planted(rows: pd.DataFrame, shuffle: bool = False,
            labelled: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rows with a signal planted in hidden state component 0: the hard label plus noise
    (`shuffle`: the same values across the wrong rows). A random tiny pair's own hidden states
    carry almost none (held-out ROC-AUC about 0.52, as with shuffled ones), so only a planted
    signal shows that hidden states reach the model aligned with their rows' labels.
    `labelled`: `add_labels(rows)`, where already at hand."""
    rng = np.random.default_rng(0)
    label = (add_labels(rows) if labelled is None else labelled)["label_hard"].to_numpy()
    signal = 4.0 * (label - 0.5) + rng.normal(0, 0.5, len(label))
    if shuffle:
        rng.shuffle(signal)
    hidden = np.stack(rows["hidden"].to_numpy()).astype(np.float32)
    hidden[:, 0] = signal
    return rows.assign(hidden=list(hidden.astype(np.float16)))


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory, shared_run_folder):
    """One trained artifact per model kind (each fit takes seconds); mlp-hidden on `planted`
    hidden states. Trained once per test run (`conftest.shared_build`: under xdist by the first
    worker to ask, into the folder the workers share), not once per worker or each time a
    worker comes back to this module: tests read them, and copy a folder before changing it."""
    root = (shared_run_folder or tmp_path_factory.getbasetemp()) / "train-artifacts"

    def build() -> dict:
        import shutil

        from train.stop.trainer import train_stopper

        rows = dense_rows()
        shutil.rmtree(root, ignore_errors=True)  # what a failed build left
        out = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for model, label in (("lightgbm", "hard"), ("mlp", "hard"), ("mlp-hidden", "soft")):
                folder = root / model
                folder.mkdir(parents=True)
                summary = train_stopper(planted(rows) if model == "mlp-hidden" else rows,
                                        [{"pair": small_pair().fingerprint}], folder,
                                        model=model, label=label, profile=PROFILE,
                                        max_epochs=8, aggregations=("max", "sum"),
                                        log=lambda *_: None, online=model == "lightgbm")
                out[model] = (folder, summary)
        return out

    return shared_build("train-artifacts", build)


def test_labels_hard_and_soft(labelled):
    df = labelled
    # per step and depth d < L, exactly one frontier node is positive; none for d >= L
    dec = df[df["decision"]]
    pos = dec.groupby(["prompt_id", "step", "depth"])["label_hard"].sum()
    acc = dec.groupby(["prompt_id", "step", "depth"])["accepted_length"].first()
    depth = pos.index.get_level_values("depth")
    assert (pos == (acc > depth).astype(float)).all()
    assert ((df["label_soft"] >= 0) & (df["label_soft"] <= 1)).all()
    assert not df[df["depth"] == 4]["decision"].any()


# the prompts each exact-replay case below replays and decodes: the first half of the dense
# collection's (the collection's tests read it all)
N_DECODED = N_PROMPTS // 2


def first_prompts(data: R.ReplayData) -> R.ReplayData:
    """`data` restricted to its first N_DECODED prompts (those `prompts()[:N_DECODED]`)."""
    keys = [k for k in data.prompts if int(k.rsplit("/p", 1)[1]) < N_DECODED]
    assert len(keys) == N_DECODED
    return data.subset(keys)


@pytest.mark.parametrize("spec", ["static:1", "static:2", "static:4", "heuristic",
                                  "confidence:0.3", "cumprod:0.9", "switch:0.6:3:3",
                                  "switch:0.9:2:2"])
def test_exact_replay_matches_decoder(data, spec):
    """Replaying a stopper on the dense collection gives the decoder's own tokens, target calls
    (so τ) and draft forwards, with the same prompts, greedy."""
    data = first_prompts(data)
    r = R.replay(data, spec)
    tokens = calls = drafts = drafted = 0
    for ids in prompts()[:N_DECODED]:
        dec = MCSDDecoder(small_pair(), DecodeConfig(k_config=K_CONFIG, max_new_tokens=MAX_NEW),
                          stopper=spec)
        st = dec.generate(ids).stats
        tokens, calls = tokens + st.new_tokens, calls + st.target_calls
        drafts, drafted = drafts + st.draft_calls, drafted + st.drafted_tokens
    assert r.mode == "exact"
    assert (r.tokens, r.steps, r.draft_forwards, r.drafted_tokens) == (tokens, calls, drafts,
                                                                      drafted)
    assert r.tau == pytest.approx(tokens / calls)


def test_ar_replays_as_the_ar_decoder_decodes(data):
    """The baseline `ar` takes the AR decoder's steps and counts them alike, but its first token
    comes from the prefill's logits: an output of n tokens pays for n - 1 forwards, not n."""
    r = R.replay(data, R.NeverDraft(), name="ar")
    stats = [ARDecoder(small_pair(), DecodeConfig(max_new_tokens=MAX_NEW)).generate(ids).stats
             for ids in prompts()]
    assert r.tokens == sum(st.new_tokens for st in stats)
    assert r.steps == sum(st.target_calls for st in stats) == r.tokens and r.tau == 1.0
    assert r.batch_steps == r.tokens - len(stats)
    one = CostProfile.relative().step_seconds(data.tree, 0, 1, 1)
    assert r.cost_s == pytest.approx(r.batch_steps * one)


SPARSE = "4,1/1,1,1"  # four candidates, a chain under the likeliest


@pytest.mark.parametrize("spec", ["static:1", "static:2", "static:4", "heuristic",
                                  "confidence:0.3"])
def test_exact_replay_matches_decoder_on_a_capped_tree(spec):
    """The same on a tree whose deeper depths grow under the likeliest candidate only; the
    replay reads the tree's shape from the rows alone."""
    data = R.ReplayData(dense_rows("sparse", SPARSE))
    assert data.tree.k_config == parse_k_config(SPARSE) and data.tree.sizes == (4, 1, 1, 1)
    data = first_prompts(data)
    r = R.replay(data, spec)
    tokens = calls = drafted = 0
    for ids in prompts()[:N_DECODED]:
        dec = MCSDDecoder(small_pair(), DecodeConfig(k_config=SPARSE, max_new_tokens=MAX_NEW),
                          stopper=spec)
        st = dec.generate(ids).stats
        tokens, calls, drafted = tokens + st.new_tokens, calls + st.target_calls, \
            drafted + st.drafted_tokens
    assert (r.tokens, r.steps, r.drafted_tokens) == (tokens, calls, drafted)


@pytest.mark.parametrize("model", ["lightgbm", "mlp", "mlp-hidden"])
def test_exact_replay_matches_decoder_for_learned_stopper(data, rows, artifacts, model):
    """Replay and decoder agree for each model kind (mlp-hidden: both read the draft's real
    hidden states), and each stopper really decides: it drafts between static:1 and static:4."""
    folder, _ = artifacts[model]
    stopper = load_stopper(folder)
    if model == "mlp-hidden":
        data = R.ReplayData(rows, hidden=True)
    data = first_prompts(data)
    r = R.replay(data, stopper)
    tokens = calls = drafts = 0
    for ids in prompts()[:N_DECODED]:
        dec = MCSDDecoder(small_pair(), DecodeConfig(k_config=K_CONFIG, max_new_tokens=MAX_NEW),
                          stopper=load_stopper(folder))
        st = dec.generate(ids).stats
        tokens, calls, drafts = tokens + st.new_tokens, calls + st.target_calls, \
            drafts + st.draft_calls
    assert (r.tokens, r.steps, r.draft_forwards) == (tokens, calls, drafts)
    assert (R.replay(data, "static:1").drafted_depth < r.drafted_depth
            < R.replay(data, "static:4").drafted_depth)


def test_a_stopper_trained_on_node_features_never_reads_the_runs_history(data, rows, labelled,
                                                                          artifacts, tmp_path):
    """`features="node"`: the model and stopper.json hold the node features only, its scores do
    not move with the trajectory columns (those of the all-features model do), and replay still
    decodes as the decoder does."""
    from train.stop.trainer import train_stopper

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_stopper(rows, [{"pair": small_pair().fingerprint}], tmp_path, model="lightgbm",
                      profile=PROFILE, aggregations=("max",), log=lambda *_: None,
                      features="node")
    spec = json.loads((tmp_path / "stopper.json").read_text())
    assert tuple(spec["feature_names"]) == FEATURE_SETS["node"]
    node, full = load_stopper(tmp_path), load_stopper(artifacts["lightgbm"][0])
    x = labelled[list(DECISION_FEATURES)].to_numpy(np.float32)
    moved = x.copy()
    cols = [DECISION_FEATURES.index(n) for n in TRAJECTORY_FEATURES]
    moved[:, cols] = np.random.default_rng(0).uniform(0, 30, (len(x), len(cols)))
    assert np.array_equal(node.node_scores(x), node.node_scores(moved))
    assert not np.array_equal(full.node_scores(x), full.node_scores(moved))
    data = first_prompts(data)
    r = R.replay(data, node)
    tokens = calls = 0
    for ids in prompts()[:N_DECODED]:
        dec = MCSDDecoder(small_pair(), DecodeConfig(k_config=K_CONFIG, max_new_tokens=MAX_NEW),
                          stopper=load_stopper(tmp_path))
        st = dec.generate(ids).stats
        tokens, calls = tokens + st.new_tokens, calls + st.target_calls
    assert (r.tokens, r.steps) == (tokens, calls)


def test_online_recalibration_replays_as_the_decoder_decodes(data, artifacts):
    """With per-sequence recalibration on, replay and decoder still agree, at batch size 1 and
    for a batch of 3 (each row scaled by its own acceptances), and its decisions differ from
    the same stopper's without it."""
    from mcsd_runtime.decisions.learned import stopper_from
    from mcsd_runtime.pricing.profile import BatchCosts

    folder, _ = artifacts["lightgbm"]
    spec = load_stopper(folder).spec
    wide = CostProfile(tokens=[1, 64], target_s=[1.0, 2.0], draft_s=[0.1, 0.2],
                       batches={8: BatchCosts(target_s=[3.0, 9.0], draft_s=[0.2, 0.5])})
    data = first_prompts(data)
    order = [int(key.rsplit("/p", 1)[1]) for key in data.prompts]
    for batch in (1, 3):
        r = R.replay(data, stopper_from(spec, folder, online_strength=0.5), wide,
                     batch_size=batch)
        dec = MCSDDecoder(small_pair(), DecodeConfig(k_config=K_CONFIG, max_new_tokens=MAX_NEW),
                          stopper=stopper_from(spec, folder, online_strength=0.5))
        st = dec.generate_batch([prompts()[i] for i in order], batch_size=batch).stats
        assert (r.tokens, r.batch_steps, r.draft_forwards) == (st.new_tokens, st.target_calls,
                                                               st.draft_calls)
    online = R.replay(data, stopper_from(spec, folder, online_strength=0.5))
    assert online.drafted_depth != R.replay(data, load_stopper(folder)).drafted_depth
    # asked to (`online`), training chose a strength or none by replay; stopper.json holds it
    chosen = artifacts["lightgbm"][1]["headline"]["online_strength"]
    assert chosen in (0.0, *R.ONLINE_STRENGTHS) and spec.online_strength == chosen


def test_accepted_oracle_never_worse_per_call(data):
    oracle = R.replay(data, "oracle-accepted", PROFILE)
    specs = [f"static:{d}" for d in range(1, 5)] + ["heuristic", "confidence:0.2", "entropy",
                                                    "cumprod:0.9"]
    for spec in specs:
        r = R.replay(data, spec, PROFILE)
        assert oracle.tau >= r.tau - 1e-12, spec
        assert oracle.accepted / oracle.drafted_depth >= r.accepted / r.drafted_depth - 1e-12
    est = R.ReplayData(dense_rows(), mode="estimate")
    assert est.mode == "estimate"
    oracle_est = R.replay(est, "oracle-accepted", PROFILE)
    for spec in specs:
        assert oracle_est.tau >= R.replay(est, spec, PROFILE).tau - 1e-12


# drafting expensive against the target: stopping at L is then not the fastest plan
COSTLY_DRAFT = CostProfile(tokens=[1, 8, 64], target_s=[1.0, 1.1, 2.0], draft_s=[0.5, 0.55, 1.0],
                           step_overhead_s=0.05, depth_overhead_s=0.02)


@pytest.mark.parametrize("profile", [PROFILE, COSTLY_DRAFT])
@pytest.mark.parametrize("mode", ["exact", "estimate"])
def test_throughput_oracle_is_an_upper_bound(profile, mode):
    """No stopper, and no other stop plan, replays faster than the throughput oracle."""
    data = R.ReplayData(dense_rows(), mode=mode)
    best = R.replay(data, "oracle", profile).throughput
    specs = [f"static:{d}" for d in range(1, 5)] + ["heuristic", "confidence:0.2", "entropy",
                                                    "cumprod:0.9", "oracle-accepted"]
    for spec in specs:
        assert best >= R.replay(data, spec, profile).throughput * (1 - 1e-9), spec
    rng = np.random.default_rng(0)
    for _ in range(20):  # random plans: any stop depth at any step
        plan = {(p.key, s.position): int(rng.integers(1, s.cap + 1))
                for p in data.prompts.values() for s in p.steps}
        assert best >= R.replay(data, R.PlanStopper(plan), profile).throughput * (1 - 1e-9)


def test_throughput_oracle_beats_accepted_oracle_when_drafting_is_costly(data):
    assert (R.replay(data, "oracle", COSTLY_DRAFT).throughput
            > R.replay(data, "oracle-accepted", COSTLY_DRAFT).throughput)


def test_models_beat_constant_on_held_out_auc(artifacts):
    for model, (folder, summary) in artifacts.items():
        test = summary["metrics"]["test"]
        # mlp-hidden: the planted signal; shuffled across rows it scores about 0.52
        assert test["roc_auc"] > (0.85 if model == "mlp-hidden" else 0.6), (model, test)
        assert test["pr_auc"] > test["positive_rate"], (model, test)
        for name in ("replay_curve.png", "replay_curve.json", "calibration.png", "metrics.json",
                     "stopper.json"):
            assert (folder / name).is_file(), (model, name)
        head = summary["headline"]
        assert head["oracle_value"] >= head["best_static_value"]
        # depth decisions alone: at least the best static, at most the optimum with skips
        bound = summary["replay"]["test"]["oracle-bound"]["throughput"]
        assert head["best_static_value"] <= head["drafting_bound_value"] * (1 + 1e-9)
        assert head["drafting_bound_value"] <= bound * (1 + 1e-9), (model, head)
    assert (artifacts["lightgbm"][0] / "importance.png").is_file()
    assert set(artifacts["lightgbm"][1]["importance"]["mean_abs_shap"]) == set(DECISION_FEATURES)
    # the MLP's importance.png, promised by `train --help`: permutation importance on test rows
    assert (artifacts["mlp"][0] / "importance.png").is_file()
    drop = artifacts["mlp"][1]["importance"]["roc_auc_drop"]
    assert set(drop) == set(DECISION_FEATURES) and max(drop.values()) > 0
    assert not (artifacts["mlp-hidden"][0] / "importance.png").exists()


def test_artifact_round_trip_same_predictions(artifacts, rows):
    import lightgbm as lgb
    import torch

    x = rows[list(DECISION_FEATURES)].to_numpy(np.float32)[:500]
    folder, _ = artifacts["lightgbm"]
    stopper = load_stopper(folder)
    booster = lgb.Booster(model_file=str(folder / "model.txt"))
    assert np.array_equal(stopper.node_scores(x), booster.predict(x))
    spec = json.loads((folder / "stopper.json").read_text())
    assert stopper.threshold == spec["threshold"] and stopper.aggregation == spec["aggregation"]
    assert stopper.pair_fingerprint == small_pair().fingerprint
    check_pair(stopper, small_pair())
    # the MLP: the reloaded artifact scores the held-out rows as the trained model did (its
    # test metrics, computed in training from the in-memory model, come out the same)
    from train.node_model import prepare
    from train.stop import report
    from train.stop.config import TrainConfig

    folder, summary = artifacts["mlp"]
    prep = prepare(rows, [{"pair": small_pair().fingerprint}],
                   TrainConfig(model="mlp", label="hard"), log=lambda *_: None)
    mlp = load_stopper(folder)
    scores = mlp.node_scores(prep.x["test"])
    assert report.classification_metrics(prep.parts["test"]["label_hard"].to_numpy(),
                                         scores) == summary["metrics"]["test"]
    assert np.array_equal(scores, mlp.node_scores(torch.from_numpy(prep.x["test"])))
    assert make_stopper(f"stopper:{folder}").kind == "mlp"


def test_hidden_stopper_needs_hidden_states(artifacts):
    folder, summary = artifacts["mlp-hidden"]
    stopper = load_stopper(folder)
    assert stopper.needs_hidden

    from mcsd_runtime.benchmarks.decision_cost import bench_frontier

    size = stopper.spec.hidden_size
    assert isinstance(stopper.should_continue(bench_frontier(4, hidden_size=size)), bool)
    with pytest.raises(MCSDError, match="needs_hidden"):  # a frontier that kept none
        stopper.should_continue(bench_frontier(4))


def test_mismatched_or_corrupt_artifacts_refused(artifacts, tmp_path):
    import shutil

    src, _ = artifacts["lightgbm"]

    def copy(name):
        dst = tmp_path / name
        shutil.copytree(src, dst)
        return dst, json.loads((dst / "stopper.json").read_text())

    dst, spec = copy("features")
    spec["feature_names"] = spec["feature_names"][::-1]
    (dst / "stopper.json").write_text(json.dumps(spec))
    with pytest.raises(MCSDError, match="feature list"):
        load_stopper(dst)
    dst, spec = copy("schema")
    spec["schema_version"] = 999
    (dst / "stopper.json").write_text(json.dumps(spec))
    with pytest.raises(MCSDError, match="schema version"):
        load_stopper(dst)
    dst, _ = copy("corrupt")
    (dst / "model.txt").write_text("tree\nnot a model\n")
    with pytest.raises(MCSDError, match="cannot read"):
        load_stopper(dst)
    dst, _ = copy("missing")
    (dst / "model.txt").unlink()
    with pytest.raises(MCSDError, match="missing"):
        load_stopper(dst)
    dst, _ = copy("badjson")
    (dst / "stopper.json").write_text("{not json")
    with pytest.raises(MCSDError, match="cannot read"):
        load_stopper(dst)
    mlp, _ = artifacts["mlp"]
    dst = tmp_path / "mlp"
    shutil.copytree(mlp, dst)
    (dst / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(MCSDError, match="cannot read"):
        load_stopper(dst)
    other = dict(small_pair().fingerprint, target_config="0" * 16)
    with pytest.raises(MCSDError, match="trained for the pair"):
        check_pair(load_stopper(src), other)


def test_bench_refuses_a_stopper_trained_on_another_pair(artifacts, toy_tiny, capsys):
    """`mcsd bench --stopper stopper:PATH` checks the pair, as eval and generate() do."""
    from mcsd_runtime.cli import main

    folder, _ = artifacts["lightgbm"]
    code = main(["bench", "--target", str(toy_tiny / "target"), "--draft",
                 str(toy_tiny / "draft"), "--stopper", f"stopper:{folder}", "--limit", "1",
                 "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "this stopper was trained for the pair" in err and "differs in: target_config" in err


def test_walk_trajectory_matches_a_full_depth_replay(rows, data):
    """Dense rows' trajectory features, recomputed for training, are those the decoder would see
    at the positions a full-depth walk visits (the stored ones follow the one-token dense walk)."""
    from train.stop.labels import walk_trajectory

    seen = {}

    class Recording(StopperBase):
        def should_continue(self, fr):
            if fr.depth == 1:
                seen[(fr.key[0], fr.key[1])] = tuple(fr.trajectory())
            return True

    R.replay(data, Recording())
    walked = walk_trajectory(rows)
    first = walked[walked["depth"] == 1]
    got = {(k, int(r.position)): tuple(float(getattr(r, n)) for n in TRAJECTORY_FEATURES)
           for k, r in zip(sequence_ids(first), first.itertuples(), strict=True)}
    assert seen and all(np.allclose(got[k], v) for k, v in seen.items())
    assert (walked["prev_accepted"] != rows["prev_accepted"]).any()


def test_decision_cost_inside_the_decoder(artifacts):
    """A decision inside the decoder: cheap host features (no pass over the vocabulary), then
    the model; the replay charges what was measured there."""
    from types import SimpleNamespace

    from mcsd_runtime.benchmarks import decision_cost as dc
    clock = [0.0]  # a fake clock for decision_cost: only the stopper's own calls advance it

    class ThreeMicroseconds(StopperBase):
        """The learned stopper, taking 3 µs of the fake clock per decision."""

        def __init__(self) -> None:
            self.inner, self.calls = load_stopper(artifacts["lightgbm"][0]), []

        def reset(self) -> None:
            self.inner.reset()
            self.calls.append(0)

        def update(self, drafted: int, accepted: int) -> None:
            self.inner.update(drafted, accepted)

        def should_continue(self, frontier) -> bool:
            self.calls[-1] += 1
            go = self.inner.should_continue(frontier)  # its features from the decoder's frontier
            clock[0] += 3e-6
            return go

    stopper = ThreeMicroseconds()
    assert stopper.inner.reads_decision_features  # trained on DECISION_FEATURES
    with pytest.MonkeyPatch.context() as m:
        m.setattr(dc, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
        cost = dc.decision_cost(stopper, 512, K_CONFIG, prompts=2, max_new_tokens=12)
    assert len(stopper.calls) == 3  # a warm-up, then the two timed prompts
    assert cost["decisions"] == sum(stopper.calls[1:]) > 0  # every decision, warm-up excluded
    assert cost["median_us"] == pytest.approx(3) and cost["fast_us"] == pytest.approx(3)
    summary = artifacts["lightgbm"][1]  # the replay charges what was benchmarked
    assert summary["headline"]["replay_decision_us"] == pytest.approx(
        summary["latency"]["median_us"])


def test_stopper_loads_only_into_the_tree_it_was_trained_on(artifacts):
    folder, _ = artifacts["lightgbm"]
    assert json.loads((folder / "stopper.json").read_text())["k_config"] == list(K_CONFIG)
    assert load_stopper(folder).k_config == K_CONFIG
    dec = MCSDDecoder(small_pair(), DecodeConfig(k_config=K_CONFIG), stopper=f"stopper:{folder}")
    assert dec.stopper.k_config == K_CONFIG
    # a chain of the same depth is another tree, and so is the same one capped
    for other in ((1, 1, 1, 1), (4, 2, 2), (3, 1), "4,2/2,2,1"):
        text = str(parse_k_config(other))
        with pytest.raises(MCSDError, match=f"trained on k-config 4,2,2,1 trees, but the decoder "
                                            f"drafts k-config {text};"):
            MCSDDecoder(small_pair(), DecodeConfig(k_config=other), stopper=load_stopper(folder))
    from mcsd_runtime.evaluate.runners import build_method  # eval builds its decoders the same way

    with pytest.raises(MCSDError, match="decoder drafts k-config 3,1;"):
        build_method(f"stopper:{folder}", small_pair(), DecodeConfig(k_config=(3, 1)))


def test_artifact_without_a_valid_k_config_is_refused(artifacts, tmp_path):
    import shutil

    src, _ = artifacts["lightgbm"]
    spec = json.loads((src / "stopper.json").read_text())
    bad_folder = tmp_path / "bad"
    shutil.copytree(src, bad_folder)
    (bad_folder / "stopper.json").write_text(json.dumps({k: v for k, v in spec.items()
                                                         if k != "k_config"}))
    with pytest.raises(MCSDError, match="missing field"):
        load_stopper(bad_folder)
    for bad in ("4,x", [0, 2], 4):
        (bad_folder / "stopper.json").write_text(json.dumps(spec | {"k_config": bad}))
        with pytest.raises(MCSDError, match="is not a k-config"):
            load_stopper(bad_folder)


def test_runs_of_different_trees_are_refused():
    same = [{"k_config": [4, 2, 2, 1]}, {"k_config": [4, 2, 2, 1]}, {}]
    assert collected_k_config(same) == (4, 2, 2, 1) and collected_k_config([{}]) is None
    with pytest.raises(MCSDError, match=r"different k-configs \(2,2 and 4,2,2,1\)"):
        collected_k_config([*same, {"k_config": [2, 2]}])
    capped = [{"k_config": "4,1/1,1"}, {"k_config": "4,1/1,1"}]
    assert str(collected_k_config(capped)) == "4,1/1,1"
    with pytest.raises(MCSDError, match=r"different k-configs \(4,1,1 and 4,1/1,1\)"):
        collected_k_config([*capped, {"k_config": [4, 1, 1]}])


def _hashes_by_split(df: pd.DataFrame, masks: dict) -> dict[str, set]:
    return {k: set(df.loc[m, "prompt_hash"]) for k, m in masks.items()}


def test_two_runs_of_the_same_prompts_share_no_prompt_across_splits(rows, tmp_path):
    """Two collections of the same prompts: every prompt (by its hash) lies in one split."""
    from train.stop.trainer import train_stopper

    two = pd.concat([rows, rows.assign(run_id="run1")], ignore_index=True)
    assert two["prompt_hash"].nunique() == N_PROMPTS
    lines: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_stopper(two, [{"pair": small_pair().fingerprint, "k_config": list(K_CONFIG)}] * 2,
                      tmp_path, profile=PROFILE, aggregations=("max",), log=lines.append)
    assert not any("warning" in line for line in lines)
    splits = json.loads((tmp_path / "stopper.json").read_text())["training_data"]["prompts"]
    seq_hash = dict(zip(sequence_ids(two), two["prompt_hash"], strict=True))
    by_split = {k: {seq_hash[s] for s in seqs} for k, seqs in splits.items()}
    assert all(by_split.values())
    assert sum(len(h) for h in by_split.values()) == N_PROMPTS  # no hash in two splits
    assert all(len(seqs) == 2 * len(by_split[k]) for k, seqs in splits.items())  # both runs
    # grouped by run and prompt id (the old split), the same seed puts a prompt in two splits
    old = _hashes_by_split(two, split_prompts(sequence_ids(two), 0.2, 0.2, 0))
    assert sum(len(h) for h in old.values()) > N_PROMPTS


def test_rows_without_prompt_hash_split_by_run_and_prompt(rows):
    old = rows.drop(columns="prompt_hash").assign(run_id="old")
    groups, fallback = prompt_groups(old)
    assert fallback == N_PROMPTS and groups.equals(sequence_ids(old))
    mixed = pd.concat([rows, old], ignore_index=True)  # a new run next to an old one
    groups, fallback = prompt_groups(mixed)
    new = mixed["run_id"] != "old"
    assert fallback == N_PROMPTS and groups[new].equals(mixed.loc[new, "prompt_hash"])
    assert groups[~new].equals(sequence_ids(mixed)[~new])


def test_sequence_ids_split_back_into_run_and_prompt():
    from replay.runs import sequence_parts

    df = pd.DataFrame({"run_id": ["r1", "r2"], "prompt_id": ["json/decoder.py:12", "p0"]})
    keys = sequence_ids(df)
    assert list(keys) == ["r1/json/decoder.py:12", "r2/p0"]
    assert [sequence_parts(k) for k in keys] == [("r1", "json/decoder.py:12"), ("r2", "p0")]


def test_min_depth_skips_decisions_and_their_cost(data, artifacts):
    """Depths below min_depth are drafted without looking: no decision is charged for them."""
    folder, summary = artifacts["lightgbm"]
    assert summary["headline"]["min_depth"] in R.MIN_DEPTHS
    stopper = load_stopper(folder)
    stopper.min_depth = 1
    every = R.replay(data, stopper, PROFILE, decision_s=0.01)
    stopper.min_depth = 3
    later = R.replay(data, stopper, PROFILE, decision_s=0.01)
    assert 0 < later.decisions < every.decisions
    assert later.drafted_depth >= later.steps * 1  # still drafts at least depth 1 per step
    static = R.replay(data, "static:2", PROFILE, decision_s=0.01)
    assert static.decisions == 0  # a stopper that never looks costs no decision time


def test_the_expected_rate_rule_replays_as_the_decoder_decodes(data, artifacts):
    """The expected-throughput rule (calibrated sums against per-depth thresholds from the
    profile) drafts between static:1 and static:4 here, and replay equals the decoder; training
    replays both rules on validation, keeps the faster (ties: the threshold) and reports the
    calibration by depth."""
    from mcsd_runtime.decisions.artifact import ArtifactSpec
    from mcsd_runtime.decisions.expected_rate import Calibration, rate_thresholds
    from mcsd_runtime.decisions.learned import stopper_from

    folder, summary = artifacts["lightgbm"]

    def rule() -> StopperBase:
        return stopper_from(ArtifactSpec.read(folder), folder, aggregation="sum",
                            depth_thresholds=rate_thresholds(PROFILE, data.tree, 0.45),
                            calibration=Calibration((0.0, 1.0), (0.0, 1.0)), skip_rate=0.0)

    data = first_prompts(data)
    r = R.replay(data, rule(), PROFILE)
    tokens = calls = drafts = 0
    for ids in prompts()[:N_DECODED]:
        st = MCSDDecoder(small_pair(), DecodeConfig(k_config=K_CONFIG, max_new_tokens=MAX_NEW),
                         stopper=rule()).generate(ids).stats
        tokens, calls, drafts = tokens + st.new_tokens, calls + st.target_calls, \
            drafts + st.draft_calls
    assert (r.tokens, r.steps, r.draft_forwards) == (tokens, calls, drafts)
    assert (R.replay(data, "static:1").drafted_depth < r.drafted_depth
            < R.replay(data, "static:4").drafted_depth)
    val = summary["replay"]["val"]
    faster = val["learned(expected-rate)"]["throughput"] > val["learned(threshold)"]["throughput"]
    assert summary["headline"]["rule"] == ("expected-rate" if faster else "threshold")
    assert summary["expected_rate_sweep"] and {"all", "1"} <= set(summary["calibration_by_depth"])
    spec = ArtifactSpec.read(folder)
    assert (spec.depth_thresholds is not None) == faster == (spec.calibration is not None)
