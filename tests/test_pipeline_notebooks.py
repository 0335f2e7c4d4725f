"""The whole pipeline on the tiny toy pair (collect -> profile -> train -> eval), as `make demo`
runs it on the default pair, then every notebook executed top to bottom on its outputs."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from collect.cli import register as collect_register
from mcsd_runtime import cli
from mcsd_runtime.cli.eval import register as eval_register
from mcsd_runtime.cli.profile import register as profile_register
from train.cli import register as train_register

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def mcsd(argv: list[str]) -> int:
    parser = cli.build_parser([collect_register, profile_register, train_register,
                               eval_register])
    return cli.run_parser(parser, argv)


@pytest.fixture(scope="module")
def demo(toy_tiny, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    pair = ["--target", str(toy_tiny / "target"), "--draft", str(toy_tiny / "draft")]
    assert mcsd(["collect", *pair, "--prompts", "toy-code-collect", "--limit", "16",
                 "--k-config", "2,1,1,1", "--dense", "--max-new-tokens", "24",
                 "--out", str(root / "collect"), "--no-progress"]) == 0
    assert mcsd(["profile", *pair, "--out", str(root / "cost.json"), "--max-tokens", "8",
                 "--rounds", "2", "--k-config", "2,1,1,1", "--limit", "2",
                 "--max-new-tokens", "12"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model in ("lightgbm", "mlp"):
            assert mcsd(["train", "--runs", str(root / "collect"), "--model", model,
                         "--cost-profile", str(root / "cost.json"), "--max-epochs", "3",
                         "--out", str(root / "stoppers" / model)]) == 0
    assert mcsd(["eval", *pair, "--prompts", "toy-code,toy-shift", "--limit", "2",
                 "--k-config", "2,1,1,1", "--max-new-tokens", "16", "--out",
                 str(root / "eval-t0"), "--methods",
                 f"ar,mcsd,heuristic,stopper:{root / 'stoppers' / 'lightgbm'},"
                 f"stopper:{root / 'stoppers' / 'mlp'}"]) == 0
    return root


def test_pipeline_outputs(demo):
    """Each stage's output says what the next relies on: exact replay checked against end-to-end
    decoding (every output's length replayed as decoded), stoppers that stay lossless in eval
    in every domain, the deploy static read from the stopper and run beside the rest."""
    statics = {f"static:{d}" for d in range(1, 5)}
    for model in ("lightgbm", "mlp"):
        folder = demo / "stoppers" / model
        spec = json.loads((folder / "stopper.json").read_text())
        assert spec["kind"] == model and spec["k_config"] == [2, 1, 1, 1]
        summary = json.loads((folder / "metrics.json").read_text())
        assert summary["headline"]["replay_mode"] == "exact" and summary["profile"]["measured"]
        check = summary["replay_check"]
        assert check["prompts"] > 0 and set(check["per_stopper"]) == statics | {"learned"}
        for name, r in check["per_stopper"].items():
            assert r["tokens_replayed"] == r["tokens_measured"] > 0, (model, name)
    report = json.loads((demo / "eval-t0" / "domains.json").read_text())
    deploy = json.loads((demo / "stoppers" / "lightgbm" / "metrics.json").read_text())[
        "deploy_static"]
    assert report["settings"]["deploy"] == deploy  # read from the stopper, run beside the rest
    assert {r["method"] for r in report["rows"]} >= {"ar", "heuristic", deploy}
    stoppers = {f"stopper:{demo / 'stoppers' / m}" for m in ("lightgbm", "mlp")}
    for domain in ("toy-code", "toy-shift"):
        summary = json.loads((demo / "eval-t0" / domain / "summary.json").read_text())
        rows = {m["method"]: m for m in summary["methods"]}
        assert {"ar", "heuristic"} | stoppers <= set(rows), domain
        assert any(m.startswith(("mcsd", "static")) for m in rows), domain  # the plain tree
        for method, row in rows.items():
            assert row["lossless"] and row["ar_equal_share"] == 1.0, (domain, method)
            assert row["new_tokens"] == rows["ar"]["new_tokens"], (domain, method)
    text = (demo / "eval-t0" / "toy-code" / "report.md").read_text()
    assert "stopper:" in text and "| ar |" in text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(demo, path, monkeypatch):
    monkeypatch.setenv("MCSD_DEMO", str(demo))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": os.getcwd()}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


def test_notebooks_are_generated_from_their_script():
    """The committed notebooks match notebooks/make_notebooks.py (edit the script, not them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_notebooks", NOTEBOOKS[0].parent /
                                                  "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert {p.name for p in NOTEBOOKS} == set(module.NOTEBOOKS)
    for path in NOTEBOOKS:
        sources = [c.source for c in nbformat.read(path, as_version=4).cells]
        assert sources == [src for _, src in module.NOTEBOOKS[path.name]]
