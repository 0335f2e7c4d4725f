"""TrainConfig's checks, each stage of `train.stop.pipeline` on its own, and the MLP's Lightning
checkpoint round trip, on the small dense collection of test_train_data."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_train_data import K_CONFIG, N_PROMPTS, dense_rows, small_pair

from mcsd_runtime.constants import STOPPER_KINDS
from mcsd_runtime.decisions.artifact import ArtifactSpec
from mcsd_runtime.decisions.features import DECISION_FEATURES
from mcsd_runtime.decisions.learned import load_mlp, load_stopper
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from train.node_model import fit, prepare
from train.stop.config import TrainConfig, default_label
from train.stop.pipeline import PEER_GRID, choose, deploy_static, write
from train.stop.trainer import train_stopper

PROFILE = CostProfile(tokens=[1, 8, 64], target_s=[1.0, 1.1, 2.0], draft_s=[0.2, 0.22, 0.4],
                      step_overhead_s=0.05)
# decision_us=0: the replay charges no benchmarked (timing-dependent) decision cost
CONFIG = TrainConfig(aggregations=("max", "sum"), decision_us=0.0, progress=False)
SUMMARY_KEYS = ["model", "label", "headline", "metrics", "calibration", "importance", "replay",
                "calibration_by_depth", "expected_rate_sweep", "peers", "deploy_static",
                "latency", "fit_s", "profile", "elapsed_s"]
SPEC_KEYS = ["format", "kind", "schema_version", "feature_names", "inputs", "hidden_size",
             "aggregation", "threshold", "label", "label_definition", "pair_fingerprint",
             "k_config", "prompt_format", "min_depth", "min_depth_gate", "metrics",
             "training_data", "created"]


def quiet(*_: object) -> None:
    pass


@pytest.fixture(scope="module")
def manifests() -> list[dict]:
    return [{"pair": small_pair().fingerprint, "k_config": list(K_CONFIG)}]


@pytest.fixture(scope="module")
def prep(manifests):
    return prepare(dense_rows(), manifests, CONFIG, quiet)


@pytest.fixture(scope="module")
def fitted(prep, tmp_path_factory):
    out = tmp_path_factory.mktemp("lightgbm")
    return out, fit(prep, CONFIG, out, quiet)


@pytest.fixture(scope="module")
def chosen(prep, fitted, manifests):
    out, _ = fitted
    return choose(prep, manifests, out, CONFIG, PROFILE, quiet)


# ------------------------------------------------------------------ TrainConfig
@pytest.mark.parametrize(("options", "message"), [
    ({"model": "xgboost"}, f"unknown model 'xgboost': use one of {', '.join(STOPPER_KINDS)}"),
    ({"label": "medium"}, "unknown label 'medium': use hard or soft"),
    ({"val_frac": 0.0}, "val_frac 0 and test_frac 0.2 must each lie between 0 and 1"),
    ({"test_frac": 1.5}, "val_frac 0.2 and test_frac 1.5 must each lie between 0 and 1"),
    ({"val_frac": 0.5, "test_frac": 0.5}, r"leave prompts to train on \(sum < 1\)"),
    ({"aggregations": ("max", "median")}, r"unknown aggregation\(s\) \['median'\]: use one or "
                                          r"more of max, sum"),
    ({"aggregations": ()}, "no aggregation: use one or more of max"),
    ({"replay_mode": "fast"}, "unknown replay mode 'fast': use auto, exact, estimate"),
    ({"trajectory": "both"}, "unknown trajectory 'both': use walk or stored"),
    ({"max_epochs": 0}, "max_epochs must be at least 1, got 0"),
    ({"check_prompts": -1}, "check_prompts must be 0 .* got -1"),
    ({"decision_us": -2.0}, "decision_us must not be negative, got -2"),
])
def test_config_refuses_bad_options(options, message):
    with pytest.raises(MCSDError, match=message):
        TrainConfig(**options)


def test_config_defaults_and_normalization():
    config = TrainConfig(model="mlp-hidden", label="soft", aggregations=["path", "max"])
    assert config.aggregations == ("path", "max") and config.hidden
    assert not TrainConfig().hidden and TrainConfig().aggregations is None
    assert default_label("mlp-hidden") == "soft" and default_label("mlp") == "hard"
    with pytest.raises(MCSDError, match="unknown label"):  # replace checks again
        replace(config, label="x")


def test_train_stopper_checks_options_before_any_work(tmp_path):
    with pytest.raises(MCSDError, match="unknown model 'svm'"):
        train_stopper(dense_rows(), [], tmp_path / "never", model="svm", log=quiet)
    with pytest.raises(MCSDError, match="val_frac 0.9"):  # a keyword overrides config's field
        train_stopper(dense_rows(), [], tmp_path / "never", CONFIG, val_frac=0.9, log=quiet)
    assert not (tmp_path / "never").exists()


def test_cli_builds_the_config_and_reports_bad_options(tmp_path, capsys):
    from mcsd_runtime.cli import build_parser, run_parser
    from train.cli import register, resolve, stop_config

    parser = build_parser([register])

    def config_of(args):
        resolve(args)
        return stop_config(args)

    args = parser.parse_args(["train", "--runs", "x", "--out", "y"])
    assert config_of(args) == replace(TrainConfig(), check_prompts=8)
    args = parser.parse_args(["train", "--runs", "x", "--out", "y", "--model", "mlp-hidden",
                              "--aggregations", "max, sum", "--val-frac", "0.3"])
    assert config_of(args) == TrainConfig(model="mlp-hidden", label="soft", val_frac=0.3,
                                          aggregations=("max", "sum"), check_prompts=8)
    # checked before the data is read: the missing run folder is not what is reported
    for extra, message in ((["--val-frac", "0.9"], "val_frac 0.9"),
                           (["--aggregations", "max,median"], "unknown aggregation(s)")):
        argv = ["train", "--runs", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), *extra]
        assert run_parser(parser, argv) == 2
        err = capsys.readouterr().err
        assert message in err and "no collection run" not in err


# ------------------------------------------------------------------ the stages alone
def test_prepare_labels_and_splits_by_prompt(prep):
    df = prep.df
    assert {"label_hard", "label_soft"} <= set(df.columns)
    masks = np.stack([prep.masks[k] for k in ("train", "val", "test")])
    assert (masks.sum(0) == 1).all()  # every row in exactly one split
    hashes = [set(df.loc[prep.masks[k], "prompt_hash"]) for k in ("train", "val", "test")]
    assert sum(map(len, hashes)) == N_PROMPTS == sum(prep.n_prompts.values())
    assert sum(prep.n_prompts.values()) == len(set.union(*hashes))
    for k, part in prep.parts.items():
        assert part["decision"].all() and len(part) == len(prep.x[k]) == len(prep.y[k])
        assert np.array_equal(prep.y[k], part["label_hard"].to_numpy(np.float32))
    assert prep.n_inputs == len(DECISION_FEATURES) and prep.k_config == K_CONFIG
    assert set(np.unique(prep.y["train"])) == {0.0, 1.0}


def test_prepare_options(prep, manifests):
    rows = dense_rows()
    stored = prepare(rows, manifests, replace(CONFIG, trajectory="stored"), quiet)
    assert np.array_equal(stored.df["prev_accepted"], rows["prev_accepted"])
    walked = prep  # the default options: the module's own preparation
    assert not np.array_equal(walked.df["prev_accepted"], rows["prev_accepted"])
    other = prepare(rows, manifests, replace(CONFIG, seed=1), quiet)
    assert not all(np.array_equal(other.masks[k], walked.masks[k]) for k in other.masks)
    soft = prepare(rows, manifests, replace(CONFIG, label="soft"), quiet)
    assert np.array_equal(soft.y["val"], soft.parts["val"]["label_soft"].to_numpy(np.float32))
    lines: list[str] = []
    prepare(rows.drop(columns="prompt_hash"), manifests, CONFIG, lines.append)
    assert lines[0].startswith(f"warning: {N_PROMPTS} prompt(s) have rows without prompt_hash")
    with pytest.raises(MCSDError, match="too little data"):  # no positive label
        prepare(rows.assign(on_accepted_path=False), manifests, CONFIG, quiet)


def test_fit_alone_writes_the_model_and_scores_it(prep, fitted):
    import lightgbm as lgb

    out, f = fitted
    assert (out / "model.txt").is_file() and not (out / "stopper.json").exists()
    booster = lgb.Booster(model_file=str(out / "model.txt"))
    assert np.allclose(booster.predict(prep.x["test"]), f.model.predict(prep.x["test"]))
    test = f.metrics["test"]
    assert test["roc_auc"] > 0.6 and test["pr_auc"] > test["positive_rate"]
    assert test["positive_rate"] == pytest.approx(prep.y["test"].mean())
    assert set(f.metrics) == {"test", "val"} and f.fit_s > 0
    assert set(f.importance["mean_abs_shap"]) == set(DECISION_FEATURES)


def head_vs_ar(c) -> float:
    return c.headline["learned_vs_ar"]


def test_choose_alone_picks_the_best_validation_setting(prep, fitted, chosen):
    out, _ = fitted
    c = chosen
    assert not (out / "stopper.json").exists()  # the provisional description stays in memory
    provisional = c.spec.to_json()
    assert provisional["threshold"] == 0.5 and provisional["aggregation"] == "max"
    assert c.spec == ArtifactSpec.from_json(provisional) and c.spec.k_config == K_CONFIG
    assert c.measured and c.decision_s == 0.0 and c.headline["replay_decision_us"] == 0.0
    assert {p["aggregation"] for p in c.curve} == {"max", "sum"}
    # the best of the curve, or better where gates or steps without a draft pay
    assert c.chosen["throughput"] >= max(p["throughput"] for p in c.curve)
    assert c.chosen["skip_rate"] == 0 or c.chosen["throughput"] > max(
        p["throughput"] for p in c.curve)
    assert set(c.results) == {"val", "test"}
    for split in ("val", "test"):
        names = set(c.results[split])
        assert {"learned", "oracle", "static:1", "static:4"} <= names
        assert {f"{p}(tuned)" for p in c.peers.values()} <= names
    assert all(spec.split(":")[0] in PEER_GRID for n, spec in c.peers.items() if n != "switch")
    rate, depth, probe = c.peers["switch"].split(":")[1:]  # at the deploy static's depth
    assert f"static:{depth}" == deploy_static(c.results["val"])
    assert "ar" in c.results["test"] and head_vs_ar(c) == pytest.approx(
        c.results["test"]["learned"]["throughput"] / c.results["test"]["ar"]["throughput"])
    head, test = c.headline, c.results["test"]
    assert head["learned_value"] == test["learned"]["throughput"]
    assert head["best_static_value"] == max(v["throughput"] for k, v in test.items()
                                            if k.startswith("static:"))
    assert head["oracle_value"] >= head["best_static_value"]
    assert head["units"] == "tokens/s" and head["threshold"] == c.chosen["threshold"]
    tuned = {p: c.results["val"][f"{p}(tuned)"]["throughput"] for p in c.peers.values()}
    assert head["best_peer"] == max(tuned, key=tuned.get)  # chosen on validation
    assert head["learned_vs_best_peer"] == pytest.approx(
        test["learned"]["throughput"] / test[f"{head['best_peer']}(tuned)"]["throughput"])
    assert c.sequences["test"] and not c.sequences["test"] & c.sequences["val"]


def test_choose_without_a_profile_replays_relative_costs(prep, fitted, manifests):
    out, _ = fitted
    c = choose(prep, manifests, out, replace(CONFIG, decision_us=None), None, quiet)
    assert not c.measured and c.decision_s == 0.0  # decisions cost nothing in relative units
    assert c.headline["units"] == "relative (no profile)" and c.latency["median_us"] > 0


def test_write_alone_finishes_the_artifact(prep, fitted, chosen, manifests):
    out, f = fitted
    summary = write(prep, f, chosen, manifests, out, CONFIG, quiet)
    assert list(summary) == SUMMARY_KEYS and summary["elapsed_s"] is None
    assert json.loads((out / "metrics.json").read_text())["headline"] == json.loads(
        json.dumps(chosen.headline, default=float))
    spec = json.loads((out / "stopper.json").read_text())
    skip = ["skip_rate", "skip_probe"] if chosen.chosen["skip_rate"] else []  # only with one
    rule = (["depth_thresholds", "calibration"] if chosen.chosen["rule"] == "expected-rate"
            else [])  # only with the expected-throughput rule
    at = SPEC_KEYS.index("metrics")
    assert list(spec) == SPEC_KEYS[:at] + skip + rule + SPEC_KEYS[at:]
    assert spec["prompt_format"] == {"format": "text", "template_hash": None}  # raw prompts
    assert (spec["threshold"], spec["aggregation"], spec["min_depth"], spec["min_depth_gate"]) == (
        chosen.chosen["threshold"], chosen.chosen["aggregation"], chosen.chosen["min_depth"],
        chosen.chosen["min_depth_gate"])
    assert summary["deploy_static"] in {f"static:{d}" for d in range(1, chosen.data.depth + 1)}
    assert spec["training_data"]["rows"] == len(prep.df)
    assert {k: set(v) for k, v in spec["training_data"]["prompts"].items()} == chosen.sequences
    stopper = load_stopper(out)
    assert stopper.threshold == chosen.chosen["threshold"]
    for name in ("replay_curve.png", "calibration.png", "importance.png", "replay_curve.json"):
        assert (out / name).is_file(), name


def test_train_stopper_is_the_four_stages(prep, fitted, chosen, manifests, tmp_path):
    """The wrapper gives what the stages give one by one (timings aside)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = train_stopper(dense_rows(), manifests, tmp_path, CONFIG, profile=PROFILE,
                                log=quiet)
    assert list(summary) == SUMMARY_KEYS and summary["elapsed_s"] > 0
    _, f = fitted
    assert summary["metrics"] == f.metrics and summary["peers"] == chosen.peers
    assert summary["replay"] == chosen.results
    drop = {"decision_latency_us"}
    assert ({k: v for k, v in summary["headline"].items() if k not in drop}
            == {k: v for k, v in chosen.headline.items() if k not in drop})


# ------------------------------------------------------------------ the MLP's checkpoint
def test_mlp_checkpoint_round_trip(prep, tmp_path):
    """The best checkpoint reloads through DecisionModule.load_from_checkpoint: its
    hyperparameters rebuild the net, the state dict (normalization included) fills it, and it is
    the net fit_mlp returns and saves in the artifact format load_mlp reads."""
    from train.stop.lightning_module import DecisionModule
    from train.stop.models import MLP_LR, fit_mlp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = fit_mlp(prep.x["train"], prep.y["train"], prep.x["val"], prep.y["val"], tmp_path,
                        hidden=(16, 8), seed=0, max_epochs=3)
    module = DecisionModule.load_from_checkpoint(tmp_path / "checkpoints" / "best.ckpt",
                                                 weights_only=True)
    assert dict(module.hparams) == {"in_features": len(DECISION_FEATURES), "hidden": [16, 8],
                                    "dropout": 0.0, "lr": MLP_LR}
    assert module.net.hidden == (16, 8)
    mean = torch.from_numpy(prep.x["train"]).mean(0)
    assert torch.allclose(module.net.mean, mean) and not torch.equal(module.net.mean,
                                                                     torch.zeros_like(mean))
    trained = model.net.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in module.net.state_dict().items())
    x = torch.from_numpy(prep.x["test"])
    with torch.inference_mode():
        assert torch.equal(torch.sigmoid(module.eval()(x)), torch.from_numpy(model.predict(x)))
    model.save(tmp_path)  # the artifact format: model.safetensors + config.json
    assert json.loads((tmp_path / "config.json").read_text()) == {
        "in_features": len(DECISION_FEATURES), "hidden": [16, 8], "dropout": 0.0}
    with torch.inference_mode():
        assert torch.equal(load_mlp(tmp_path)(x), module.net(x))


def test_training_says_when_a_tuned_peer_beats_the_learned_stopper():
    """The note names the peer faster on validation, and stays silent when the learned wins."""
    from train.stop.pipeline import _warn_if_a_peer_wins, best_peer

    def results(learned: float) -> dict:
        return {"learned": {"throughput": learned}, "static:1": {"throughput": 9.0},
                "entropy:0.5(tuned)": {"throughput": 14.6},
                "heuristic:1(tuned)": {"throughput": 13.8}}

    assert best_peer(results(1.0)) == "entropy:0.5" and best_peer({"learned": {}}) is None
    for learned, says in ((14.5, True), (14.7, False)):
        lines: list[str] = []
        _warn_if_a_peer_wins({"val": results(learned)},
                             {"best_peer": "entropy:0.5", "learned_vs_best_peer": 0.99},
                             lines.append)
        assert bool(lines) == says and all("entropy:0.5 replays faster" in s for s in lines)


def test_the_end_to_end_check_decodes_where_the_profile_was_timed(monkeypatch):
    from replay.check import _profile_device

    profile = CostProfile(tokens=[1, 8], target_s=[1.0, 2.0], draft_s=[0.1, 0.2])
    assert _profile_device(profile) == "cpu"
    assert _profile_device(replace(profile, device="cpu")) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(MCSDError, match="measured on cuda:0, which this machine lacks.*"
                                        "--check-prompts 0"):
        _profile_device(replace(profile, device="cuda:0"))
