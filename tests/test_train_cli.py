"""`mcsd train` / `python -m train` on a run folder of collected rows."""

from __future__ import annotations

import json
import subprocess
import sys

from test_train_data import dense_rows

from mcsd_runtime.cli import build_parser, run_parser
from mcsd_runtime.decisions.features import FEATURE_SETS
from train.cli import register


def test_cli_trains_an_artifact(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    dense_rows().drop(columns=["hidden"]).to_parquet(run / "rows.parquet")
    (run / "manifest.json").write_text(json.dumps({"k_config": [4, 2, 2, 1]}))
    out = tmp_path / "stopper"
    parser = build_parser([register])
    code = run_parser(parser, ["train", "--runs", str(run), "--model", "lightgbm", "--out",
                               str(out), "--aggregations", "max,sum", "--threads", "1",
                               "--features", "node"])
    assert code == 0, capsys.readouterr().err
    spec = json.loads((out / "stopper.json").read_text())
    assert spec["kind"] == "lightgbm" and spec["aggregation"] in ("max", "sum")
    assert spec["feature_names"] == list(FEATURE_SETS["node"])
    assert spec["k_config"] == [4, 2, 2, 1]
    assert run_parser(parser, ["train", "--bench-latency", "--out", str(out)]) == 0
    assert "median_us" in capsys.readouterr().out
    assert json.loads((out / "decision.json").read_text())["decision"] == "stop"
    # a filled --out is refused without --force; with it, other domains are replayed too
    argv = ["train", "--runs", str(run), "--model", "lightgbm", "--out", str(out),
            "--aggregations", "max", "--threads", "1", "--features", "node"]
    assert run_parser(parser, argv) == 2
    assert "--force" in capsys.readouterr().err
    assert run_parser(parser, [*argv, "--force", "--domains", str(run)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["domains"]) == {"run"} and (out / "calibration_domains.png").is_file()
    assert json.loads((out / "check.json").read_text())["domains"] == metrics["domains"]


def test_cli_user_errors(tmp_path, capsys):
    parser = build_parser([register])
    assert run_parser(parser, ["train", "--out", str(tmp_path / "x")]) == 2
    assert "--runs" in capsys.readouterr().err
    assert run_parser(parser, ["train", "--runs", str(tmp_path / "nope"), "--out",
                               str(tmp_path / "x")]) == 2
    assert "no collection run" in capsys.readouterr().err
    for extra, message in ((["--features", "depth,bogus"], "unknown bogus; use all or node"),
                           (["--features", "node", "--model", "mlp-hidden"],
                            "mlp-hidden reads hidden states")):
        assert run_parser(parser, ["train", "--runs", str(tmp_path), "--out",
                                   str(tmp_path / "x"), *extra]) == 2
        assert message in capsys.readouterr().err


def test_python_m_train_help():
    r = subprocess.run([sys.executable, "-m", "train", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--cost-profile" in r.stdout


def test_each_decision_builds_its_config_from_the_options_given():
    import argparse
    from pathlib import Path

    import pytest

    from mcsd_runtime.cli.args import add_pair_args
    from mcsd_runtime.errors import MCSDError
    from train.budget.config import BudgetConfig
    from train.cli import budget_config, copy_config, resolve, width_config
    from train.copy.config import CopyConfig
    from train.outputs import OutputsConfig
    from train.width.config import WidthConfig

    parser = build_parser([register])

    def parsed(*argv: str) -> argparse.Namespace:
        args = parser.parse_args(["train", *argv, "--out", "o"])
        resolve(args)
        return args

    outputs = OutputsConfig(prompts="p", cost_profile=Path("c"))
    copy = ("--decision", "copy", "--prompts", "p", "--cost-profile", "c")
    assert copy_config(parsed(*copy)) == CopyConfig(Path("o"), outputs, min_ngram=1)
    assert copy_config(parsed(*copy, "--k-config", "4,1", "--limit", "3")) == CopyConfig(
        Path("o"), OutputsConfig(prompts="p", cost_profile=Path("c"), limit=3), "4,1",
        min_ngram=2)
    width = width_config(parsed("--decision", "width", "--prompts", "p", "--cost-profile", "c"))
    assert width == WidthConfig(Path("o"), outputs) and width.k == 4
    assert budget_config(parsed("--decision", "budget", "--runs", "r", "--cost-profile", "c")
                         ) == BudgetConfig(Path("o"), (Path("r"),))
    for extra, message in ((("--min-ngram", "5"), "--min-ngram"),
                           (("--check-prompts", "2"), "name them with --eval-prompts"),
                           (("--limit", "0"), "must be positive")):
        with pytest.raises(MCSDError, match=message):
            copy_config(parsed(*copy, *extra))
    # not given, the pair's options take OutputsConfig's defaults: the parser's own
    pair = argparse.ArgumentParser()
    add_pair_args(pair)
    assert vars(pair.parse_args([])) == {name: getattr(OutputsConfig, name) for name in
                                          ("target", "draft", "device", "dtype", "attention")}
