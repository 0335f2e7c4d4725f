"""`mcsd eval --batch-size B`: every method decodes the same batches; speed is paired per
batch, outputs are still compared per prompt."""

from __future__ import annotations

import json

import pytest

from mcsd_runtime import cli
from mcsd_runtime.decode.decoder import DecodeConfig
from mcsd_runtime.evaluate.loop import run_eval
from mcsd_runtime.evaluate.stats import paired_geomean as _geo
from mcsd_runtime.evaluate.stats import summarize
from mcsd_runtime.evaluate.stats import tps_by_unit as _tps_by_unit
from mcsd_runtime.prompts.sets import load_prompts


def test_batched_records_pair_speed_per_batch(toy_pair):
    prompts = load_prompts("toy-code", limit=7)
    records = run_eval(toy_pair, prompts, ["ar", "static:1", "heuristic"],
                       DecodeConfig(k_config=(2, 2, 1), max_new_tokens=12), progress=False,
                       batch_size=3)
    by = {m: [r for r in records if r.method == m] for m in ("ar", "static:1", "heuristic")}
    for recs in by.values():
        assert [r.prompt_id for r in recs] == [p.id for p in prompts]
        assert [r.batch_id for r in recs] == ["batch0000"] * 3 + ["batch0001"] * 3 + [
            "batch0002"]
        # one throughput per batch: the batch's tokens over its decode seconds
        assert len(set(_tps_by_unit(recs))) == 3
        assert {r.tokens_per_s for r in recs if r.batch_id == "batch0000"} == {
            _tps_by_unit(recs)["batch0000"]}
    for m in ("static:1", "heuristic"):  # lossless per prompt
        assert [r.token_ids for r in by[m]] == [r.token_ids for r in by["ar"]]
    assert _geo(by["heuristic"], by["ar"])["n"] == 3  # paired on batches, not prompts
    rows = {r["method"]: r for r in summarize(records, greedy=True)}
    assert rows["heuristic"]["ar_equal_share"] == 1.0 and rows["heuristic"]["prompts"] == 7


def test_eval_cli_batches_and_refuses_single_sequence_methods(toy_tiny, tmp_path, capsys):
    pair = ["--target", str(toy_tiny / "target"), "--draft", str(toy_tiny / "draft")]
    argv = ["eval", *pair, "--limit", "4", "--max-new-tokens", "6", "--k-config", "2,1",
            "--batch-size", "2", "--out", str(tmp_path / "run")]
    assert cli.main(argv) == 0  # the default methods, less those without batches
    out = capsys.readouterr().out
    methods = {line.split(" | ")[0][2:] for line in out.splitlines()
               if line.startswith("| ") and not line.startswith("| method")
               and not line.startswith("| ---")}
    assert methods == {"ar", "mcsd:2,1", "confidence:0.4", "heuristic"}
    settings = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "batch_size" in json.dumps(settings)
    code = cli.main([*argv[:-2], "--methods", "ar,hf,mcsd-target-init", "--out",
                     str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert code == 2 and "hf, mcsd-target-init:2,1 decode one sequence at a time" in err
    assert "Traceback" not in err and not (tmp_path / "bad").exists()


@pytest.mark.parametrize("value", ["0", "-3"])
def test_batch_size_must_be_positive(toy_tiny, tmp_path, capsys, value):
    code = cli.main(["eval", "--target", str(toy_tiny / "target"), "--draft",
                     str(toy_tiny / "draft"), "--batch-size", value, "--out",
                     str(tmp_path / "x")])
    assert code == 2 and "--batch-size must be 1 or more" in capsys.readouterr().err


def test_eval_across_batch_sizes_writes_the_table(toy_tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["eval", "--target", str(toy_tiny / "target"), "--draft",
                     str(toy_tiny / "draft"), "--limit", "4", "--max-new-tokens", "6",
                     "--k-config", "2,1", "--methods", "ar,static:1,static:2,heuristic",
                     "--batch-size", "2,1", "--out", str(out)]) == 0
    data = json.loads((out / "batches.json").read_text())
    assert data["settings"]["batch_sizes"] == [1, 2]
    rows = {(r["method"], r["batch_size"]): r for r in data["rows"]}
    assert set(rows) == {(m, b) for m in ("ar", "static:1", "static:2", "heuristic")
                         for b in (1, 2)}
    for b in (1, 2):
        best = rows["ar", b]["best_static"]
        assert best in ("static:1", "static:2") and rows[best, b]["vs_best_static"] == 1.0
        assert all(rows[m, b]["ar_equal_share"] == 1.0 for m in ("static:1", "heuristic"))
        records = [json.loads(x) for x in (out / f"b{b}" / "per_prompt.jsonl").read_text()
                   .splitlines()]
        assert len({r["batch_id"] for r in records}) == 4 // b  # paired per batch
    assert rows["ar", 1]["vs_b1"] == 1.0 and rows["ar", 2]["vs_b1"] > 0
    assert "Best static at each batch size: B=1:" in (out / "batches.md").read_text()
    assert cli.main(["eval", "--batch-size", "2,2", "--out", str(tmp_path / "x")]) == 2
    assert "names a batch size twice" in capsys.readouterr().err
