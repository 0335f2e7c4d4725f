"""`mcsd eval` and `mcsd bench` as a new user meets them: the tree a trained stopper records,
labels with their defaults spelt out, refusals that name the fix, readable output."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from mcsd_runtime import cli
from mcsd_runtime.constants import DEFAULT_K_CONFIG
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate.eval_report import check_writable
from mcsd_runtime.evaluate.methods import explicit_methods, tree_for


def test_labels_spell_out_defaults():
    k = (4, 2, 2, 1)
    given = ["mcsd", "mcsd-target-init", "confidence", "entropy", "cumprod:0.90", "static",
             "static:2", "heuristic", "hf-generate:confidence", "ar", "mcsd:2,1"]
    assert explicit_methods(given, k) == [
        "mcsd:4,2,2,1", "mcsd-target-init:4,2,2,1", "confidence:0.4", "entropy:0.5:0.5",
        "cumprod:0.9", "static:4", "static:2", "heuristic", "hf-generate:confidence:0.4", "ar",
        "mcsd:2,1"]
    with pytest.raises(MCSDError, match="which run the same thing"):
        explicit_methods(["confidence", "confidence:0.4"], k)
    with pytest.raises(MCSDError, match=r"static:9 needs a tree of at least 9 depths"):
        explicit_methods(["static:9"], k)
    with pytest.raises(MCSDError, match="static:0"):
        explicit_methods(["static:0"], k)


def test_a_trained_stoppers_tree_is_the_default(monkeypatch, tmp_path):
    from mcsd_runtime.decisions.artifact import ArtifactSpec

    trees = {"a": [1, 1, 1], "b": [1, 1, 1], "c": [2, 1]}
    spec = ArtifactSpec.read(Path(__file__).parent / "fixtures" / "stoppers-b8df3aa" / "lightgbm")
    for name, k in trees.items():
        (tmp_path / name).mkdir()
        replace(spec, k_config=k).write(tmp_path / name)
    a, b, c = (f"stopper:{tmp_path / n}" for n in "abc")
    assert tree_for(["ar", a], None, DEFAULT_K_CONFIG) == ((1, 1, 1), "the tree stopper:a was "
                                                                      "trained on")
    assert tree_for(["ar", a, f"hf-generate:{b}"], None, DEFAULT_K_CONFIG)[0] == (1, 1, 1)
    assert tree_for(["ar", str(tmp_path / "a")], None, DEFAULT_K_CONFIG)[0] == (1, 1, 1)
    assert tree_for(["ar", "heuristic"], None, DEFAULT_K_CONFIG) == (DEFAULT_K_CONFIG,
                                                                     "the default")
    assert tree_for([a], "2,1", DEFAULT_K_CONFIG) == ((2, 1), "--k-config")  # given: kept
    with pytest.raises(MCSDError, match="trained on different trees"):
        tree_for([a, c], None, DEFAULT_K_CONFIG)


@pytest.mark.parametrize(("argv", "message"), [
    (["--k-config", ""], "bad k-config ''"),
    (["--k-config", "4,,2"], "bad k-config '4,,2'"),
    (["--methods", "ar,static:9", "--k-config", "4,2,2,1"], "static:9 needs a tree"),
    (["--methods", "ar,confidence,confidence:0.4"], "run the same thing"),
    (["--methods", "ar,lookup:0"], "positive integers"),
    (["--target", "toy", "--draft", "toy:tiny"], "pass the target 'toy:tiny' alone"),
    (["--draft", "/no/such/folder"], "no model folder at /no/such/folder (the draft)"),
])
@pytest.mark.parametrize("command", ["eval", "bench"])
def test_silent_acceptance_is_refused(command, argv, message, tmp_path, capsys, monkeypatch):
    """Each refused before any model loads (no hub, no toy build) and without an output folder."""
    from mcsd_runtime.toy import build

    def no_build(*_, **__):
        raise AssertionError("a toy pair was resolved")

    monkeypatch.setattr(build, "toy_pair_dirs", no_build)
    if command == "bench":
        argv = [a.replace("--methods", "--stopper").replace("ar,", "") for a in argv]
        if "confidence,confidence:0.4" in argv or any("lookup" in a for a in argv):
            return  # bench runs one stopper (prompt lookup is an eval method)
    out = ["--out", str(tmp_path / "x")] if command == "eval" else []
    code = cli.main([command, "--target", "toy", "--limit", "1", *out, *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "x").exists()


def test_check_writable_leaves_no_folder(tmp_path):
    out = tmp_path / "a" / "b"
    check_writable(out)
    assert not (tmp_path / "a").exists()
    out.mkdir(parents=True)
    check_writable(out)
    assert out.is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(MCSDError, match="cannot write to"):
        check_writable(tmp_path / "file" / "run")


def test_eval_output_is_short_and_says_what_it_replaces(toy_tiny, tmp_path, capsys):
    argv = ["eval", "--target", str(toy_tiny / "target"), "--draft", str(toy_tiny / "draft"),
            "--limit", "1", "--max-new-tokens", "6", "--k-config", "2,1",
            "--methods", "ar,mcsd,confidence", "--out", str(tmp_path / "run")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert table[0].split(" | ")[1:] == ["tok/s", "vs AR [95% CI]",
                                         "vs mcsd:2,1 [95% CI]", "τ", "= AR", "NLL/tok |"]
    assert {line.split(" | ")[0] for line in table[2:]} == {"| ar", "| mcsd:2,1",
                                                             "| confidence:0.4"}
    assert max(map(len, table)) < 100 and "replaced" not in out
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Columns:" in report and "| AR agreement |" in report  # the full table, explained
    records = [json.loads(x) for x in (tmp_path / "run/per_prompt.jsonl").read_text().split("\n")
               if x]
    assert all(isinstance(r["text"], str) and r["text"] for r in records)
    assert cli.main(argv) == 0
    assert "replaced the earlier per_prompt.jsonl, summary.json" in capsys.readouterr().out


def test_plot_lines_never_repeat_a_style():
    from mcsd_runtime.evaluate.plots import line_style

    styles = [tuple(sorted(line_style(i).items())) for i in range(40)]
    assert len(set(styles)) == 40
    assert line_style(0)["color"] != line_style(1)["color"]  # e.g. static:1 and mcsd:4,2,2,1


def test_bench_prints_a_readable_config(toy_tiny, capsys):
    assert cli.main(["bench", "--target", str(toy_tiny / "target"), "--draft",
                     str(toy_tiny / "draft"), "--limit", "1", "--max-new-tokens", "4",
                     "--k-config", "2,1", "--stopper", "confidence"]) == 0
    out = capsys.readouterr().out
    assert "k-config 2,1, draft-initialized, greedy, 4 new tokens, seed 0" in out
    assert "DecodeConfig(" not in out and "mcsd:2,1+confidence:0.4" in out


def test_trained_stoppers_bring_their_training_results(tmp_path):
    from mcsd_runtime.evaluate.training_results import (
        stopper_lines,
        stopper_results,
        stopper_table,
    )

    folder = tmp_path / "lgbm"
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps({
        "model": "lightgbm", "metrics": {"test": {"roc_auc": 0.836, "pr_auc": 0.76}},
        "headline": {"speedup_vs_best_static": 1.065, "best_static": "static:4",
                     "oracle_gain_captured": 0.203, "units": "tokens/s"},
        "replay_check": {"prompts": 16, "max_abs_relative_error": 0.028}}))
    found = stopper_results(["ar", "heuristic", f"stopper:{folder}", f"stopper:{tmp_path}"])
    assert [s["method"] for s in found] == [f"stopper:{folder}"]  # no metrics.json: left out
    row = stopper_table(found).splitlines()[2]
    assert "| stopper:lgbm | lightgbm | 0.84 | 0.76 | 1.065x (static:4, tokens/s) | 20.3% |" in row
    assert "2.8% on 16 prompts" in row
    assert stopper_lines(found) == ["stopper:lgbm offline, on its collection's test prompts: "
                                    "ROC-AUC 0.84, replayed 1.065x static:4, 20.3% of the "
                                    "oracle's gain"]
