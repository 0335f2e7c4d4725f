"""DSpark's per-position calibration (sequential temperature scaling): the fit recovers known
temperatures against the survival (and a broken fit is caught), the table's file reads in both
engines' loaders, the draft's chain comes out of collected rows, our budget's `survival-sts`
estimate, and `mcsd train --decision sts` end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from test_train_data import dense_rows

from mcsd_runtime.cli import main
from mcsd_runtime.decisions.builtin import make_decision
from mcsd_runtime.decisions.features import NODE_FEATURES
from mcsd_runtime.decisions.sts import (
    GRID,
    STS_FILE,
    StsCalibration,
    auroc,
    brier,
    confidence_logit,
    ece,
    fit_sts,
    position_metrics,
    sigmoid,
)
from mcsd_runtime.decisions.verify_budget import OnlineAcceptance, StsAcceptance, VerifyBudget
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate.methods import explicit_label, short_name
from mcsd_runtime.pricing.profile import CostProfile
from replay.data import ReplayData, _Frontier
from replay.ragged import Budget, make_rule, ragged_replay
from train.sts.chains import chain_arrays

# the true temperatures: points of the grid, on both sides of 1
T_STAR = GRID[[14, 26, 17, 24]]  # 10^-0.3, 10^0.3, 10^-0.15, 10^0.2
STEP = math.log10(GRID[1] / GRID[0])  # the grid's spacing in log10 (0.05)


def synthetic(n: int = 40_000, seed: int = 0, short: float = 0.2, t_star=T_STAR):
    """Samples whose token j is accepted (given the ones before) with probability
    sigmoid(logit_j / T*_j); a share `short` drafted fewer positions."""
    rng = np.random.default_rng(seed)
    gamma = len(t_star)
    logits = rng.normal(1.0, 2.0, (n, gamma))
    accepted = rng.random((n, gamma)) < sigmoid(logits / t_star)
    depth = np.where(rng.random(n) < short, rng.integers(1, gamma, n), gamma)
    valid = np.arange(gamma)[None, :] < depth[:, None]
    prefix = np.logical_and.accumulate(accepted, axis=1) & valid
    return np.where(valid, logits, np.nan), valid, prefix.astype(float)


def recovers(fit, data) -> bool:
    """The test's claim of a fitter: each T* within one grid step, and a lower ECE at every
    position than at T = 1."""
    logits, valid, prefix = data
    temps = fit(logits, valid, prefix)
    close = np.abs(np.log10(temps) - np.log10(T_STAR)) <= STEP + 1e-9
    before = [m["ece"] for m in position_metrics(logits, valid, prefix, [1.0] * len(T_STAR))]
    after = [m["ece"] for m in position_metrics(logits, valid, prefix, temps)]
    return bool(close.all()) and all(a < b for a, b in zip(after, before, strict=True))


def per_position_fit(logits, valid, prefix):
    """A broken fitter: each position's T calibrates that position's confidence alone against
    the survival's target, ignoring the positions before it."""
    temps = []
    for j in range(logits.shape[1]):
        rows = valid[:, j]
        x, y = logits[rows, j], prefix[rows, j]
        temps.append(min(GRID, key=lambda t, x=x, y=y: ece(sigmoid(x / t), y)))
    return np.array(temps)


def test_the_fit_recovers_known_temperatures_and_a_broken_fit_does_not():
    data = synthetic()
    assert recovers(lambda *a: np.array(fit_sts(*a).temperatures), data)
    # the same claim fails for a fit against per-position confidence and for a grid of 1.0
    assert not recovers(per_position_fit, data)
    assert not recovers(lambda *a: np.array(fit_sts(*a, grid=[1.0]).temperatures), data)
    fit = fit_sts(*data)
    assert all(a < b for a, b in zip(fit.ece_after, fit.ece_before, strict=True))
    assert fit.samples[0] == len(data[0]) > fit.samples[-1]


def test_offsets_fix_what_no_temperature_can():
    """Accepted with probability sigmoid(logit / T* + b*), b* = -1 (a draft overconfident at
    every q, as ours is): with offsets the fit finds (T*, b*) within a grid step and beats the
    temperature-only fit's ECE at every position, which T alone cannot reach."""
    rng = np.random.default_rng(1)
    n, t_star, b_star = 40_000, T_STAR[:3], -1.0
    logits = rng.normal(1.0, 2.0, (n, 3))
    accepted = rng.random((n, 3)) < sigmoid(logits / t_star + b_star)
    valid = np.ones((n, 3), bool)
    prefix = np.logical_and.accumulate(accepted, axis=1).astype(float)
    plain, shifted = fit_sts(logits, valid, prefix), fit_sts(logits, valid, prefix, offsets=True)
    assert plain.offsets == [] and len(shifted.offsets) == 3
    assert np.allclose(np.log10(shifted.temperatures), np.log10(t_star), atol=STEP + 1e-9)
    assert np.allclose(shifted.offsets, b_star, atol=0.1 + 1e-9)  # OFFSET_GRID's step
    assert all(s < p / 2 for s, p in zip(shifted.ece_after, plain.ece_after, strict=True))
    after = position_metrics(logits, valid, prefix, shifted.temperatures, shifted.offsets)
    assert [m["ece"] for m in after] == pytest.approx(shifted.ece_after)
    table = StsCalibration(tuple(shifted.temperatures), offsets=tuple(shifted.offsets))
    x = confidence_logit(0.7)
    assert table.acceptance(0.7, 2) == pytest.approx(
        sigmoid(x / shifted.temperatures[1] + shifted.offsets[1]))


def test_metrics_and_ties():
    # bins: {0.2, 0.2} (mean target 0.5), {0.9} (target 1)
    assert ece([0.2, 0.2, 0.9], [0, 1, 1]) == pytest.approx((0.3 * 2 + 0.1) / 3)
    assert math.isnan(ece([], []))
    assert brier([1.0, 0.0], [1, 1]) == 0.5
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert auroc([0.5, 0.5], [0, 1]) == 0.5  # a tie counts half
    assert math.isnan(auroc([0.2, 0.3], [1, 1]))
    # the smallest of equally good temperatures: a position whose logits are all 0
    fit = fit_sts(np.zeros((4, 1)), np.ones((4, 1), bool), np.array([[0.0], [1], [0], [1]]))
    assert fit.temperatures == [GRID[0]]
    with pytest.raises(MCSDError, match="position 2 has no samples"):
        fit_sts(np.zeros((2, 2)), np.array([[1, 0], [1, 0]], bool), np.zeros((2, 2)))
    with pytest.raises(MCSDError, match="first ones"):
        fit_sts(np.zeros((1, 2)), np.array([[0, 1]], bool), np.zeros((1, 2)))


def test_confidence_logit_is_the_online_estimates_feature():
    assert confidence_logit(0.5) == 0.0
    assert confidence_logit(1.0) == 10.0 and confidence_logit(0.0) == -10.0
    assert confidence_logit(0.8) == pytest.approx(math.log(4))
    for q in (1e-9, 0.2, 0.999, 1.0):
        q32 = float(np.float32(q))  # as a frontier holds it
        clipped = min(max(q32, 1e-6), 1 - 1e-6)  # the online estimate's formula before
        before = max(-10.0, min(10.0, math.log(clipped / (1 - clipped))))
        assert OnlineAcceptance().feature(frontier(1, [q])) == confidence_logit(q32) == before


# ------------------------------------------------------------------------------ the file
def table() -> StsCalibration:
    return StsCalibration((0.5, 2.0, 1.25), "runs/x", 12, (0.2, 0.3, 0.1), (0.05, 0.04, 0.03),
                          {"gamma": 3, "held_out": {"ece_after": [0.1, None, 0.2]}})


def test_the_file_round_trips_with_both_keys(tmp_path):
    path = table().write(tmp_path)
    assert path == tmp_path / STS_FILE
    data = json.loads(path.read_text())
    assert data["sts_temperatures"] == data["temperatures"] == [0.5, 2.0, 1.25]
    assert (data["dataset"], data["num_samples"], data["format"]) == ("runs/x", 12, "mcsd-sts")
    assert StsCalibration.load(tmp_path) == StsCalibration.load(path) == table()
    assert StsCalibration.load(path).extra["held_out"] == {"ece_after": [0.1, None, 0.2]}
    for key in ("sts_temperatures", "temperatures"):  # either key alone
        (tmp_path / "one.json").write_text(json.dumps({key: [1, 0.5]}))
        assert StsCalibration.load(tmp_path / "one.json").temperatures == (1.0, 0.5)
    t = table()
    assert (t.temperature(1), t.temperature(3), t.temperature(9)) == (0.5, 1.25, 1.25)


@pytest.mark.parametrize(("payload", "message"), [
    ({"temperatures": []}, "non-empty"),
    ({"sts_temperatures": [1.0, 0.0]}, "> 0"),
    ({"temperatures": [-1.0]}, "> 0"),
    ({"temperatures": "1.0"}, "non-empty list"),
    ({"temperatures": [1.0, "x"]}, "numbers"),
    ({"temperatures": [True]}, "numbers"),
    ({"other": [1.0]}, "neither 'sts_temperatures' nor 'temperatures'"),
    ({"temperatures": [1.0], "sts_temperatures": [2.0]}, "differ"),
    ({"temperatures": [1.0], "num_samples": 1.5}, "num_samples"),
    ({"temperatures": [1.0], "ece_after": [None]}, "ece_after"),
    ([1.0], "not a JSON object"),
])
def test_load_refuses_a_bad_table(tmp_path, payload, message):
    path = tmp_path / "sts.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(MCSDError, match=message) as err:
        StsCalibration.load(path)
    assert "mcsd train --decision sts" in str(err.value)


def test_offsets_are_our_key_and_checked(tmp_path):
    path = StsCalibration((0.5, 2.0), offsets=(-1.0, 0.5)).write(tmp_path / "sts.json")
    data = json.loads(path.read_text())
    assert data["mcsd_offsets"] == [-1.0, 0.5] and data["temperatures"] == [0.5, 2.0]
    assert StsCalibration.load(path).offsets == (-1.0, 0.5)
    assert "mcsd_offsets" not in StsCalibration((0.5,)).to_json()  # none: not written
    path.write_text(json.dumps({"temperatures": [0.5, 2.0], "mcsd_offsets": [1.0]}))
    with pytest.raises(MCSDError, match="2 temperatures but 1 mcsd_offsets"):
        StsCalibration.load(path)
    with pytest.raises(MCSDError, match="one per position"):
        StsCalibration((0.5, 2.0), offsets=(0.1,))


def test_load_refuses_what_is_no_table(tmp_path):
    with pytest.raises(MCSDError, match="no STS table"):
        StsCalibration.load(tmp_path / "missing.json")
    (tmp_path / "nan.json").write_text('{"temperatures": [NaN]}')
    with pytest.raises(MCSDError, match="finite"):
        StsCalibration.load(tmp_path / "nan.json")
    with pytest.raises(MCSDError, match="> 0"):
        StsCalibration((1.0, 0.0))


def trtllm_load(path) -> list[float]:
    """TensorRT-LLM's reader, as tensorrt_llm/_torch/speculative/dspark_sts.py
    (load_sts_temperatures_from_path, commit 0ee1e73f) reads the file."""
    with open(path, encoding="utf-8") as handle:
        payload = json.load(handle)
    for key in ("sts_temperatures", "temperatures"):
        if key in payload:
            temps = payload[key]
            break
    else:
        raise KeyError(f"{path} has neither key")
    if not temps:
        raise ValueError(f"{path} carries an empty temperature vector")
    return [float(t) for t in temps]


def sglang_load(path) -> dict:
    """SGLang's reader, as the msgspec struct DSparkStsCalibration of
    python/sglang/srt/speculative/dspark_components/dspark_sts.py decodes the file: strict JSON,
    typed fields (temperatures: list[float], dataset: str, num_samples: int, ece_before and
    ece_after: list[float]), unknown keys ignored, temperatures non-empty and all > 0."""
    def no_constant(name):
        raise ValueError(f"not JSON: {name}")

    with open(path, encoding="utf-8") as handle:
        data = json.loads(handle.read(), parse_constant=no_constant)
    types = {"temperatures": list, "dataset": str, "num_samples": int, "ece_before": list,
             "ece_after": list}
    out = {"dataset": "", "num_samples": 0, "ece_before": [], "ece_after": []}
    for key, kind in types.items():
        if key in data:
            value = data[key]
            assert isinstance(value, kind) and not isinstance(value, bool), key
            if kind is list:
                assert all(isinstance(v, int | float) and not isinstance(v, bool)
                           for v in value), key
            out[key] = value
    assert out.get("temperatures"), "DSparkStsCalibration requires at least one temperature"
    assert all(t > 0 for t in out["temperatures"]), "temperatures must all be > 0"
    return out


def test_both_engines_read_our_file(tmp_path):
    path = table().write(tmp_path / "sts.json")
    assert trtllm_load(path) == [0.5, 2.0, 1.25]
    sglang = sglang_load(path)
    assert sglang["temperatures"] == [0.5, 2.0, 1.25] and sglang["num_samples"] == 12
    assert len(sglang["temperatures"]) == 3  # SGLang's planner: one per draft position
    # and we read theirs: SGLang's own file (one key) and TensorRT-LLM's
    (tmp_path / "sglang.json").write_text(json.dumps({"temperatures": [0.8, 1.2],
                                                      "dataset": "d", "num_samples": 5}))
    (tmp_path / "trt.json").write_text(json.dumps({"sts_temperatures": [0.8, 1.2]}))
    assert StsCalibration.load(tmp_path / "sglang.json").temperatures == (0.8, 1.2)
    assert StsCalibration.load(tmp_path / "trt.json").temperatures == (0.8, 1.2)


# ------------------------------------------------------------------------------ the chains
def node(step, node, parent, depth, rank, q, on_path, prompt="p0"):
    return {"run_id": "r", "prompt_id": prompt, "step": step, "node": node, "parent": parent,
            "depth": float(depth), "sibling_rank": float(rank), "draft_prob": q,
            "on_accepted_path": on_path}


def test_the_chain_of_each_step():
    rows = pd.DataFrame([
        # step 0: three depths; the chain 1 -> 3 -> 6, its third token rejected; node 5 (rank 0
        # under a rank-1 parent) and node 7 are off the chain
        node(0, 1, 0, 1, 0, 0.9, True), node(0, 2, 0, 1, 1, 0.05, False),
        node(0, 3, 1, 2, 0, 0.6, True), node(0, 4, 1, 2, 1, 0.3, False),
        node(0, 5, 2, 2, 0, 0.8, False), node(0, 6, 3, 3, 0, 0.4, False),
        node(0, 7, 5, 3, 0, 0.99, False),
        # step 1: two depths; the target took the sibling at depth 1
        node(1, 1, 0, 1, 0, 0.7, False), node(1, 2, 0, 1, 1, 0.2, True),
        node(1, 3, 1, 2, 0, 0.5, False), node(1, 4, 2, 2, 0, 0.5, True),
        # another prompt: one depth, accepted
        node(0, 1, 0, 1, 0, 0.3, True, prompt="p1"),
    ])
    logits, valid, prefix, steps = chain_arrays(rows.sample(frac=1, random_state=0))
    order = [tuple(s) for s in steps.itertuples(index=False)]
    want = {("r", "p0", 0): ([0.9, 0.6, 0.4], [1, 1, 1], [1, 1, 0]),
            ("r", "p0", 1): ([0.7, 0.5], [1, 1, 0], [0, 0, 0]),
            ("r", "p1", 0): ([0.3], [1, 0, 0], [1, 0, 0])}
    assert sorted(order) == sorted(want) and logits.shape == (3, 3)
    for i, key in enumerate(order):
        qs, ok, target = want[key]
        assert valid[i].tolist() == [bool(v) for v in ok]
        assert prefix[i].tolist() == target
        assert logits[i, :len(qs)].tolist() == [confidence_logit(q) for q in qs]
    cut, _, cut_prefix, cut_steps = chain_arrays(rows, gamma=2)
    first = [tuple(s) for s in cut_steps.itertuples(index=False)].index(("r", "p0", 0))
    assert cut.shape == (3, 2) and cut_prefix[first].tolist() == [1, 1]
    with pytest.raises(MCSDError, match="lack columns"):
        chain_arrays(rows.drop(columns="sibling_rank"))


# ------------------------------------------------------------------------------ the budget
PROFILE = CostProfile(tokens=[1, 8, 64], target_s=[1.0, 1.2, 3.0], draft_s=[0.2, 0.22, 0.4],
                      step_overhead_s=0.02, depth_overhead_s=0.01)


def frontier(depth: int, qs: list[float], recent: float = 0.6) -> _Frontier:
    nodes = np.zeros((len(qs), len(NODE_FEATURES)), np.float32)
    nodes[:, NODE_FEATURES.index("draft_prob")] = qs
    nodes[:, NODE_FEATURES.index("log_path_prob")] = np.log(qs)
    return _Frontier(depth, 4, nodes, [10.0, 2.0, 0.5, recent], None, 0, ("p", 0, depth))


def test_the_survival_sts_estimate(tmp_path):
    est = StsAcceptance(StsCalibration((0.5, 2.0)))
    x = confidence_logit(0.8)
    survival, gain = est.node(frontier(1, [0.1, 0.8]), 0.0, 1.0)  # the best node: q = 0.8
    assert survival == pytest.approx(sigmoid(x / 0.5))
    assert gain == pytest.approx(sigmoid(x / 0.5) * sigmoid(x / 2.0))
    survival, gain = est.node(frontier(3, [0.8]), 0.0, 0.7)  # beyond the table: its last T
    assert survival == pytest.approx(0.7 * sigmoid(x / 2.0))
    assert gain == pytest.approx(survival * sigmoid(x / 2.0))
    assert est.first(frontier(0, [0.5], recent=0.42)) == pytest.approx(0.42)

    table().write(tmp_path)
    PROFILE.save(tmp_path / "cost.json")
    spec = f"survival-sts:{tmp_path}@{tmp_path / 'cost.json'}"
    budget = make_decision(spec)
    assert isinstance(budget, VerifyBudget) and isinstance(budget.estimate, StsAcceptance)
    assert budget.estimate.calibration == table()
    assert explicit_label(spec, (1, 1, 1, 1)) == spec
    assert short_name(spec) == f"survival-sts:{tmp_path.name}@cost.json"
    for bad, message in ((f"survival-sts:{tmp_path}", "names an STS table"),
                         (f"survival-sts@{tmp_path / 'cost.json'}", "names an STS table"),
                         (f"survival-sts:{tmp_path}@{tmp_path / 'x.json'}", "no cost profile"),
                         (f"survival-sts:{tmp_path / 'no'}@{tmp_path / 'cost.json'}",
                          "no STS table")):
        with pytest.raises(MCSDError, match=message):
            make_decision(bad)
    rule = make_rule(f"survival-sts:{tmp_path / 'sts.json'}")  # replay's rule: the same estimate
    assert isinstance(rule, Budget) and rule.estimate.calibration == table()
    assert rule.name == "survival-sts:sts.json"
    with pytest.raises(MCSDError, match="names an STS table"):
        make_rule("survival-sts")


# ------------------------------------------------------------------------------ the command
CHAIN = (1, 1, 1, 1)


def collection(tmp_path, name: str = "chain") -> str:
    """A collection folder: a chain drafted at every position of the train tests' prompts
    (`test_train_data.dense_rows`, made once per test run, as test_verify_budget's)."""
    run = tmp_path / name
    run.mkdir()
    dense_rows(name, CHAIN).drop(columns=["hidden"]).to_parquet(run / "rows.parquet")
    (run / "manifest.json").write_text(json.dumps({"k_config": list(CHAIN)}))
    return str(run)


def test_train_sts_end_to_end(tmp_path, capsys):
    out = tmp_path / "sts"
    argv = ["train", "--decision", "sts", "--runs", collection(tmp_path), "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "| position | samples |" in printed and "ECE halved at every" in printed
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md", STS_FILE]
    data = json.loads((out / STS_FILE).read_text())
    report = json.loads((out / "report.json").read_text())
    gamma = len(CHAIN)
    assert data["sts_temperatures"] == data["temperatures"] and len(data["temperatures"]) == gamma
    assert report["gamma"] == gamma and [p["position"] for p in report["positions"]] == [1, 2, 3, 4]
    assert all(GRID[0] - 1e-12 <= t <= GRID[-1] + 1e-12 for t in data["temperatures"])
    assert report["fit"]["groups"] + report["held_out"]["groups"] == 18  # every prompt, once
    assert data["num_samples"] == report["fit"]["samples"]
    assert all(p["samples"] > 0 and p["before"]["ece"] is not None for p in report["positions"])
    assert isinstance(report["ece_halved_every_position"], bool)
    assert "| position |" in (out / "report.md").read_text()
    assert trtllm_load(out / STS_FILE) == sglang_load(out / STS_FILE)["temperatures"]
    PROFILE.save(tmp_path / "cost.json")
    budget = make_decision(f"survival-sts:{out}@{tmp_path / 'cost.json'}")
    # the budget on the table decides: some steps draft nothing, some deep
    r = ragged_replay(ReplayData(dense_rows("chain", CHAIN)), Budget(budget.estimate), PROFILE)
    assert 0 < r.drafted_depth < r.steps * gamma
    # again into the same folder: refused without --force
    assert main(argv) == 2 and "--force" in capsys.readouterr().err
    assert main([*argv, "--force", "--gamma", "2"]) == 0
    assert len(json.loads((out / STS_FILE).read_text())["temperatures"]) == 2
    assert main([*argv, "--force", "--offsets"]) == 0
    assert "the engines do not read" in capsys.readouterr().out
    data = json.loads((out / STS_FILE).read_text())
    assert len(data["mcsd_offsets"]) == gamma
    offsets = [p["offset"] for p in json.loads((out / "report.json").read_text())["positions"]]
    assert offsets == data["mcsd_offsets"]


def shard(path, logits, mask) -> None:
    torch.save({"logits": torch.as_tensor(logits, dtype=torch.float32),
                "prefix_mask": torch.as_tensor(mask, dtype=torch.float32)}, path)


def test_train_sts_from_dspark_shards(tmp_path, capsys):
    logits, _, prefix = synthetic(n=20_000, seed=1, short=0.0)  # a shard's samples are whole
    shard(tmp_path / "cap.0.0.pt", logits[:8000], prefix[:8000])
    shard(tmp_path / "cap.0.1.pt", logits[8000:], prefix[8000:])
    out = tmp_path / "out"
    argv = ["train", "--decision", "sts", "--from-shards", str(tmp_path / "cap.*.pt"),
            "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads((out / STS_FILE).read_text())
    assert np.abs(np.log10(data["temperatures"]) - np.log10(T_STAR)).max() <= 2 * STEP + 1e-9
    report = json.loads((out / "report.json").read_text())
    assert report["unit"] == "sample"
    first, *_ = report["positions"]
    assert first["after"]["ece"] < first["before"]["ece"] / 2 and first["ece_halved"]
    assert report["ece_halved_every_position"] == all(p["ece_halved"]
                                                      for p in report["positions"])
    assert report["held_out"]["samples"] == 6000  # --test-frac 0.3 of the samples


@pytest.mark.parametrize(("files", "message"), [
    ({"a.pt": ((4, 3), (4, 2))}, "differ in shape"),
    ({"a.pt": ((4, 3), (4, 3)), "b.pt": ((4, 2), (4, 2))}, "has gamma 2, the shards before"),
    ({"a.pt": ((4,), (4,))}, "must be an \\[n, gamma\\] tensor"),
])
def test_train_sts_refuses_bad_shards(tmp_path, capsys, files, message):
    for name, (a, b) in files.items():
        shard(tmp_path / name, np.zeros(a), np.ones(b))
    argv = ["train", "--decision", "sts", "--from-shards", str(tmp_path / "*.pt"),
            "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message.replace("\\", "") in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_train_sts_refuses_what_it_cannot_fit(tmp_path, capsys):
    base = ["train", "--decision", "sts", "--out", str(tmp_path / "out")]
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "manifest.json").write_text(json.dumps({"kind": "engine-trace"}))
    (tmp_path / "junk.pt").write_text("not a shard")
    for argv, message in (
            ([*base, "--runs", str(trace)], "mcsd collect --dense"),
            (base, "--runs RUN_DIR (collections"),
            ([*base, "--runs", str(trace), "--from-shards", "x"], "pass one of them"),
            ([*base, "--from-shards", str(tmp_path / "none*.pt")], "matches no file"),
            ([*base, "--from-shards", str(tmp_path / "junk.pt")], "cannot read shard"),
            ([*base, "--runs", str(trace), "--cost-profile", "c.json"], "takes no --cost-profile"),
            ([*base, "--runs", str(trace), "--gamma", "0"], "must be >= 1"),
            ([*base, "--from-shards", "x", "--offsets"], "temperatures only"),
            (["train", "--runs", str(trace), "--gamma", "3", "--out", "o"],
             "--gamma is an option of --decision sts")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)


def test_train_sts_help_and_defaults(capsys):
    from pathlib import Path

    from mcsd_runtime.cli import build_parser
    from train.cli import resolve, sts_config
    from train.sts.config import StsConfig

    with pytest.raises(SystemExit):
        main(["train", "--decision", "sts", "--help"])
    assert "sequential temperature scaling" in capsys.readouterr().out
    args = build_parser().parse_args(["train", "--decision", "sts", "--runs", "r", "--out", "o"])
    resolve(args)
    config = sts_config(args)
    assert config == StsConfig(Path("o"), (Path("r"),))
    assert (config.test_frac, config.gamma, config.seed) == (0.3, None, 0)
