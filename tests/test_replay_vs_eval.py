"""`mcsd replay`: replayed against measured speed, prompt by prompt."""

from __future__ import annotations

import json
import math

import pytest

from mcsd_runtime import cli
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from replay.vs_eval import compare


def main(argv: list[str]) -> int:
    return cli.main(["replay", *argv])

PROFILE = CostProfile(tokens=[1, 8, 64], target_s=[1.0, 1.1, 2.0], draft_s=[0.2, 0.22, 0.4],
                      step_overhead_s=0.05, depth_overhead_s=0.01)


def test_ratios_are_measured_over_replayed_relative_to_the_base():
    replay = {"p1": {"static:1": 10.0, "static:2": 12.0}, "p2": {"static:1": 8.0, "static:2": 8.0},
              "p4": {"static:1": 5.0, "static:2": 5.0}, "p5": {"static:1": 9.0, "static:2": 10.0}}
    run = {"code": {"p1": {"static:1": 20.0, "static:2": 24.0},  # as replayed: 1.0
                    "p2": {"static:1": 10.0, "static:2": 15.0}},  # 1.5 over replay
           "qa": {"p4": {"static:1": 5.0, "static:2": 6.0},  # 1.2
                  "p5": {"static:1": 10.0, "static:2": 10.0}},  # 0.9
           "prose": {"p3": {"static:1": 1.0, "static:2": 9.0}}}  # not collected: left out
    out = compare([run], replay, "static:1")["static:2"]
    assert out["n"] == 4 and out["ratio"] == pytest.approx((1.0 * 1.5 * 1.2 * 0.9) ** 0.25)
    assert out["ci"][0] < out["ratio"] < out["ci"][1]
    assert out["by_category"] == {"code": pytest.approx(math.sqrt(1.5)),
                                  "qa": pytest.approx(math.sqrt(1.2 * 0.9))}
    two = compare([run, run], replay, "static:1")["static:2"]  # runs pool: narrower interval
    assert two["n"] == 8 and two["ci"][1] - two["ci"][0] < out["ci"][1] - out["ci"][0]
    with pytest.raises(MCSDError, match="collect the evaluation's own prompt sets"):
        compare([run], {"other": {"static:1": 1.0}}, "static:1")


def test_on_a_dense_collection_of_the_evaluated_prompts(toy_tiny, tmp_path, capsys):
    pair = ["--target", str(toy_tiny / "target"), "--draft", str(toy_tiny / "draft")]
    common = [*pair, "--limit", "2", "--max-new-tokens", "8", "--k-config", "2,1,1",
              "--threads", "1"]
    assert cli.main(["collect", *common, "--dense", "--no-progress",
                     "--out", str(tmp_path / "c")]) == 0
    assert cli.main(["eval", *common, "--prompts", "toy-code-collect",
                     "--methods", "ar,static:1,static:3", "--out", str(tmp_path / "e")]) == 0
    PROFILE.save(tmp_path / "cost.json")
    capsys.readouterr()
    args = ["--runs", str(tmp_path / "c"), "--cost-profile", str(tmp_path / "cost.json")]
    assert main([*args, "--eval", str(tmp_path / "e"), "--out", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert set(result) == {"ar", "static:3"} and all(r["n"] == 2 for r in result.values())
    assert all(math.isfinite(r["ratio"]) and r["ratio"] > 0 for r in result.values())
    assert "| static:3 | 2 |" in capsys.readouterr().out
    # refusals name the fix
    assert main([*args, "--eval", str(tmp_path / "c")]) == 2
    assert "no per_prompt.jsonl" in capsys.readouterr().err
    assert main([*args, "--eval", str(tmp_path / "e"), "--base", "static:2"]) == 2
    assert "--base static:2 is not a method" in capsys.readouterr().err
    summary = tmp_path / "e" / "summary.json"  # an evaluation of another tree
    settings = json.loads(summary.read_text())
    settings["settings"]["k_config"] = "4,1"
    summary.write_text(json.dumps(settings))
    assert main([*args, "--eval", str(tmp_path / "e")]) == 2
    assert "collect with --k-config 4,1" in capsys.readouterr().err
