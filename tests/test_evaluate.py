"""`mcsd eval`: outputs, losslessness, the report's agreement with its records, user errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from conftest import fake_cpu_flags
from mcsd_runtime import cli
from mcsd_runtime.cli.eval import register
from mcsd_runtime.decode.decoder import DecodeConfig
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate.loop import run_eval
from mcsd_runtime.evaluate.methods import split_methods
from mcsd_runtime.evaluate.stats import summarize
from mcsd_runtime.prompts.sets import load_prompts

METHODS = "ar,mcsd:2,2,1,mcsd-target-init:2,2,1,confidence:0.3,heuristic,hf-assisted"


def mcsd(argv: list[str]) -> int:
    return cli.run_parser(cli.build_parser([register]), argv)


@pytest.fixture(scope="module")
def eval_dir(toy_tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "run"
    code = mcsd(["eval", "--target", str(toy_tiny / "target"), "--draft",
                 str(toy_tiny / "draft"), "--prompts", "toy-code", "--limit", "3",
                 "--max-new-tokens", "20", "--k-config", "2,2,1", "--methods", METHODS,
                 "--out", str(out)])
    assert code == 0
    return out


def test_split_methods_keeps_k_configs_together():
    assert split_methods("ar,mcsd:4,2,2,1,mcsd-target-init:3,1,heuristic") == [
        "ar", "mcsd:4,2,2,1", "mcsd-target-init:3,1", "heuristic"]


def test_eval_writes_every_output(eval_dir):
    """Each output holds every method: one record per method and prompt, one summary row per
    method in JSON, CSV and Markdown, the report with the table and its plots, which are
    images with something drawn on them."""
    import matplotlib.image

    methods = split_methods(METHODS)
    records = [json.loads(line) for line in
               (eval_dir / "per_prompt.jsonl").read_text().splitlines()]
    assert sorted((r["method"], r["prompt_id"]) for r in records) == sorted(
        (m, p) for m in methods for p in {r["prompt_id"] for r in records})
    assert len(records) == 3 * len(methods)
    summary = json.loads((eval_dir / "summary.json").read_text())
    assert [m["method"] for m in summary["methods"]] == methods
    assert summary["settings"]["n_prompts"] == 3 and summary["settings"]["k_config"] == "2,2,1"
    assert list(pd.read_csv(eval_dir / "summary.csv")["method"]) == methods
    table = (eval_dir / "summary.md").read_text()
    report = (eval_dir / "report.md").read_text()
    for m in methods:
        assert f"| {m} |" in table and f"| {m} |" in report, m
    for name in ("speedup.png", "tau.png", "acceptance_by_depth.png"):
        assert f"![{name}]({name})" in report
        image = matplotlib.image.imread(eval_dir / name)
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0, name
    assert not list(eval_dir.glob("*.tmp"))


def test_lossless_methods_equal_ar_and_report_agrees_with_records(eval_dir):
    lines = (eval_dir / "per_prompt.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    methods = json.loads((eval_dir / "summary.json").read_text())["methods"]
    summary = {m["method"]: m for m in methods}
    assert set(summary) == set(split_methods(METHODS))
    ar = {r["prompt_id"]: r["token_ids"] for r in records if r["method"] == "ar"}
    assert len(ar) == 3
    for r in records:
        if r["lossless"]:
            assert r["token_ids"] == ar[r["prompt_id"]], r["method"]
    for method, row in summary.items():
        mine = [r for r in records if r["method"] == method]
        tokens = sum(r["new_tokens"] for r in mine)
        calls = sum(r["target_calls"] for r in mine)
        assert row["new_tokens"] == tokens and row["target_calls"] == calls
        assert row["tau"] == pytest.approx(tokens / calls)
        assert row["ar_equal_share"] == pytest.approx(
            sum(r["token_ids"] == ar[r["prompt_id"]] for r in mine) / len(mine))
        if row["lossless"]:
            assert row["ar_equal_share"] == 1.0
    assert summary["mcsd-target-init:2,2,1"]["lossless"] is False
    csv = pd.read_csv(eval_dir / "summary.csv")
    assert list(csv["method"]) == list(summary)


def test_summarize_counts_divergence(toy_pair):
    prompts = load_prompts("toy-code", limit=2)
    records = run_eval(toy_pair, prompts, ["ar", "mcsd-target-init:3,1"],
                       DecodeConfig(max_new_tokens=16), progress=False)
    rows = {r["method"]: r for r in summarize(records, greedy=True)}
    assert 0 <= rows["mcsd-target-init:3,1"]["ar_agreement"] <= 1
    assert rows["ar"]["ar_equal_share"] == 1.0


@pytest.mark.parametrize(("argv", "message"), [
    (["--methods", "ar,warp-drive"], "unknown method 'warp-drive'"),
    (["--prompts", "no-such-set"], "no-such-set"),
])
def test_user_errors(toy_tiny, tmp_path, capsys, argv, message):
    code = mcsd(["eval", "--target", str(toy_tiny / "target"), "--draft",
                 str(toy_tiny / "draft"), "--out", str(tmp_path / "x"), *argv])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_bad_methods_fail_before_the_pair_loads(tmp_path, capsys, monkeypatch):
    """A stopper folder is checked the way loading it will be, before prompts or the pair: a
    bogus --target never gets to fail first."""
    from mcsd_runtime.models import pair
    def no_pair(*_, **__):
        raise AssertionError("the pair was loaded")

    monkeypatch.setattr(pair, "load_pair", no_pair)
    plain = tmp_path / "plain"
    plain.mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "stopper.json").write_text(json.dumps({"format": "something-else"}))
    cases = {
        f"stopper:{tmp_path / 'nope'}": f"{tmp_path / 'nope'} is not a stopper artifact: no "
                                        "stopper.json",
        str(plain): f"{plain} is not a stopper artifact: no stopper.json",
        f"hf-generate:stopper:{broken}": "is not a stopper description",
        f"stopper:{broken / 'stopper.json'}": "is not a stopper artifact",  # loading wants a folder
        "confidence:high": "parameters must be numbers",
        "mcsd:4,0": "bad k-config",
    }
    for method, message in cases.items():
        code = mcsd(["eval", "--target", str(tmp_path / "no-such-model"), "--prompts",
                     str(tmp_path / "no-such-prompts.jsonl"), "--methods", f"ar,{method}",
                     "--out", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert code == 2, method
        assert f"method {method!r}: " in err and message in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "x").exists()
    code = cli.main(["bench", "--target", str(tmp_path / "no-such-model"), "--stopper",
                     f"stopper:{plain}"])
    err = capsys.readouterr().err
    assert code == 2 and "is not a stopper artifact" in err and "Traceback" not in err


def test_empty_prompt_set(toy_tiny, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code = mcsd(["eval", "--target", str(toy_tiny / "target"), "--draft",
                 str(toy_tiny / "draft"), "--prompts", str(empty), "--out", str(tmp_path / "x")])
    assert code == 2
    assert "empty" in capsys.readouterr().err


def test_stopper_for_another_pair_is_refused(toy_pair, monkeypatch):
    """A method whose stopper was trained for another pair stops eval before any decoding."""
    from mcsd_runtime.errors import MCSDError
    from mcsd_runtime.evaluate import runners as evaluate

    class Foreign:
        pair_fingerprint = dict(toy_pair.fingerprint, target_config="0" * 16)

    monkeypatch.setattr(evaluate, "make_decision", lambda spec: Foreign())
    monkeypatch.setattr(evaluate, "check_method", lambda name: None)
    with pytest.raises(MCSDError, match="trained for the pair"):
        evaluate.build_method("stopper:elsewhere", toy_pair, DecodeConfig())


def _rec(method: str, prompt: str, tps: float):
    from mcsd_runtime.evaluate.record import Record

    return Record(method, prompt, [1, 2], 100, 100 / tps, 10, 10, 10, 5, 0.5, True, [])


def test_paired_geomean_against_ar_and_the_best_static():
    from mcsd_runtime.evaluate.stats import best_static, summarize

    recs = []
    for i, base in enumerate((100.0, 150.0, 80.0, 120.0)):
        p = f"p{i}"
        recs += [_rec("ar", p, base), _rec("mcsd:1,1", p, base * 1.5),
                 _rec("static:3", p, base * 1.4), _rec("stopper:x", p, base * 1.5 * 1.1)]
    assert best_static(recs) == "mcsd:1,1"
    rows = {r["method"]: r for r in summarize(recs, greedy=True)}
    assert rows["stopper:x"]["reference"] == "mcsd:1,1"
    assert rows["stopper:x"]["geomean_vs_reference"] == pytest.approx(1.1)
    # a fixed copy length, alone or beside a static depth, is a static schedule too; a copy
    # length beside an adaptive stopper or a learned one is not
    for i, base in enumerate((100.0, 150.0, 80.0, 120.0)):
        recs += [_rec("lookup:8:3+heuristic:4", f"p{i}", base * 3),
                 _rec("lookup-learned:c+static:1", f"p{i}", base * 3)]
    assert best_static(recs) == "mcsd:1,1"
    for i, base in enumerate((100.0, 150.0, 80.0, 120.0)):
        recs.append(_rec("lookup:8:3+static:1", f"p{i}", base * 2))
    assert best_static(recs) == "lookup:8:3+static:1"
    recs += [_rec("lookup:12", f"p{i}", base * 2.5) for i, base in enumerate((100, 150, 80, 120))]
    assert best_static(recs) == "lookup:12"
    assert rows["stopper:x"]["geomean_vs_ar"] == pytest.approx(1.65)
    assert rows["static:3"]["ci_vs_reference"] == pytest.approx([1.4 / 1.5, 1.4 / 1.5])
    rows = {r["method"]: r for r in summarize(recs, greedy=True, reference="static:3")}
    assert rows["mcsd:1,1"]["geomean_vs_reference"] == pytest.approx(1.5 / 1.4)
    with pytest.raises(MCSDError, match="did not run"):
        summarize(recs, greedy=True, reference="heuristic")


def test_on_a_cpu_with_native_bf16_auto_decodes_and_scores_in_bf16(toy_tiny, tmp_path,
                                                                    monkeypatch, capsys):
    """Where the CPU reports AMX, `--dtype auto` decodes the fp32 checkpoints in bf16, says so
    once on stderr and in the summary, and scores each output with that bf16 target (rescoring
    in fp32 gives other NLLs)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcsd_runtime.backend import cpu, device
    from mcsd_runtime.evaluate.quality import target_scores

    fake_cpu_flags(monkeypatch, tmp_path, "fpu avx2 amx_bf16")
    monkeypatch.setattr(device, "_SAID_CPU_BF16", False)
    assert cpu.cpu_has_native_bf16()
    out = tmp_path / "run"
    assert mcsd(["eval", "--target", str(toy_tiny / "target"), "--draft",
                 str(toy_tiny / "draft"), "--prompts", "toy-code", "--limit", "1",
                 "--max-new-tokens", "12", "--k-config", "2,1", "--methods", "ar,mcsd:2,1",
                 "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["settings"]["dtype"] == "bfloat16"
    assert capsys.readouterr().err.count("--dtype auto runs the models in bfloat16") == 1
    tok = AutoTokenizer.from_pretrained(toy_tiny / "target")
    prompt = tok(load_prompts("toy-code", limit=1)[0].text)["input_ids"]
    target = AutoModelForCausalLM.from_pretrained(toy_tiny / "target",
                                                  dtype=torch.bfloat16).eval()
    fp32 = AutoModelForCausalLM.from_pretrained(toy_tiny / "target").eval()
    for line in (out / "per_prompt.jsonl").read_text().splitlines():
        r = json.loads(line)
        assert r["target_nll"] == pytest.approx(target_scores(target, prompt, r["token_ids"])[0],
                                                abs=1e-9), r["method"]
        assert abs(r["target_nll"] - target_scores(fp32, prompt, r["token_ids"])[0]) > 1e-6


def test_quality_of_every_output_and_lossless_equals_ar(eval_dir, toy_tiny):
    """Every record carries the target's NLL per new token, recomputed here from its text's
    tokens; a lossless method's greedy outputs are ar's, so its NLL is ar's exactly (a lossy
    one's differs where its output does); the report shows the columns."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcsd_runtime.evaluate.quality import repeated_ngram_share, target_scores

    records = [json.loads(line) for line in
               (eval_dir / "per_prompt.jsonl").read_text().splitlines()]
    summary = json.loads((eval_dir / "summary.json").read_text())
    rows = {m["method"]: m for m in summary["methods"]}
    # scored in the precision the run decoded in (`--dtype auto`: bf16 where the CPU has it)
    dtype = getattr(torch, summary["settings"]["dtype"])
    target = AutoModelForCausalLM.from_pretrained(toy_tiny / "target", dtype=dtype).eval()
    tok = AutoTokenizer.from_pretrained(toy_tiny / "target")
    prompts = {p.id: tok(p.text)["input_ids"] for p in load_prompts("toy-code", limit=3)}
    ar = {r["prompt_id"]: r for r in records if r["method"] == "ar"}
    for r in records:
        nll, top1 = target_scores(target, prompts[r["prompt_id"]], r["token_ids"])
        assert r["target_nll"] == pytest.approx(nll, abs=1e-5), r["method"]
        assert r["target_top1_share"] == pytest.approx(top1), r["method"]
        assert r["repeat_share"] == repeated_ngram_share(r["token_ids"])
        if r["lossless"]:
            assert r["target_nll"] == ar[r["prompt_id"]]["target_nll"], r["method"]
            assert r["target_top1_share"] == ar[r["prompt_id"]]["target_top1_share"]
        elif r["token_ids"] != ar[r["prompt_id"]]["token_ids"]:
            assert r["target_nll"] != ar[r["prompt_id"]]["target_nll"]
    for method, row in rows.items():
        mine = [r for r in records if r["method"] == method]
        tokens = sum(len(r["token_ids"]) for r in mine)
        assert row["target_nll"] == pytest.approx(
            sum(r["target_nll"] * len(r["token_ids"]) for r in mine) / tokens)
        if row["lossless"]:
            assert row["target_nll"] == rows["ar"]["target_nll"]
            assert row["target_nll_vs_ar"] == 0.0 and row["ci_target_nll_vs_ar"] == [0.0, 0.0]
    lossy = [r for r in records if r["method"] == "mcsd-target-init:2,2,1"]
    assert rows["mcsd-target-init:2,2,1"]["target_nll_vs_ar"] == pytest.approx(
        sum(r["target_nll"] - ar[r["prompt_id"]]["target_nll"] for r in lossy) / len(lossy))
    report = (eval_dir / "report.md").read_text()
    assert ("| NLL/token | NLL vs AR [95% CI] | target top-1 | repeated 4-grams | loops |"
            in report)
    ar_line = next(line for line in report.splitlines() if line.startswith("| ar | "))
    assert f"| {rows['ar']['target_nll']:.3f} |" in ar_line


def test_a_prompts_samples_are_paired_as_one_unit():
    """Speed per prompt is its samples' tokens over their seconds: 100 tokens in 1 s and in 4 s
    make 40 tokens/s (not the mean rate, 62.5, nor the last sample's, 25)."""
    from mcsd_runtime.evaluate.record import Record
    from mcsd_runtime.evaluate.stats import paired_geomean, tps_by_unit

    def rec(method: str, seconds: float, sample: int) -> Record:
        return Record(method, "p0", [1], 100, seconds, 1, 0, 0, 0, None, True, [], sample=sample)

    mine = [rec("lookup", 1.0, 0), rec("lookup", 4.0, 1)]
    assert tps_by_unit(mine) == {"p0": pytest.approx(40.0)}
    ar = [rec("ar", 2.5, 0), rec("ar", 2.5, 1)]
    assert paired_geomean(mine, ar)["geomean"] == pytest.approx(1.0)


def test_samples_decode_every_prompt_under_each_seed(toy_pair):
    from mcsd_runtime.evaluate.stats import paired_geomean

    prompts = load_prompts("toy-code", limit=2)
    base = DecodeConfig(max_new_tokens=12, temperature=1.0, seed=5, eos_token_ids=())
    records = run_eval(toy_pair, prompts, ["ar", "mcsd:2,1"], base, progress=False, samples=3)
    assert len(records) == 2 * 2 * 3
    assert {(r.method, r.prompt_id, r.sample) for r in records} == {
        (m, p.id, s) for m in ("ar", "mcsd:2,1") for p in prompts for s in range(3)}
    # sample 0 is the run without --samples; the others are other draws
    alone = run_eval(toy_pair, prompts[:1], ["ar"], base, progress=False)
    firsts = [r.token_ids for r in records if (r.method, r.prompt_id) == ("ar", prompts[0].id)]
    assert firsts[0] == alone[0].token_ids
    assert len({tuple(t) for t in firsts}) > 1
    by = {m: [r for r in records if r.method == m] for m in ("ar", "mcsd:2,1")}
    assert paired_geomean(by["mcsd:2,1"], by["ar"])["n"] == 2  # paired per prompt
    rows = {r["method"]: r for r in summarize(records, greedy=False)}
    assert rows["mcsd:2,1"]["prompts"] == 2 and rows["mcsd:2,1"]["new_tokens"] == 6 * 12


@pytest.mark.parametrize(("argv", "message"), [
    (["--samples", "2"], "needs --temperature > 0"),
    (["--samples", "0"], "--samples must be at least 1"),
    (["--samples", "2", "--temperature", "0.7", "--batch-size", "2"], "drop --batch-size"),
])
def test_bad_samples_are_refused_before_decoding(toy_tiny, tmp_path, capsys, argv, message):
    code = mcsd(["eval", "--target", str(toy_tiny / "target"), "--draft",
                 str(toy_tiny / "draft"), "--methods", "ar,mcsd:2,1", "--out",
                 str(tmp_path / "x"), *argv])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_a_stopper_trained_at_another_temperature_is_warned_about_once():
    import types
    import warnings

    from mcsd_runtime.evaluate import runners

    def trained_at(*temps):
        runs = [{"temperature": t} for t in temps]
        return types.SimpleNamespace(spec=types.SimpleNamespace(training_data={"runs": runs}))

    runners._WARNED.clear()
    with pytest.warns(UserWarning, match="temperature 0 and decodes at 0.7.*--temperature 0.7"):
        runners.warn_temperature(trained_at(0.0, None), 0.7, "stopper:greedy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runners.warn_temperature(trained_at(0.0), 0.7, "stopper:greedy")  # once per process
        runners.warn_temperature(trained_at(0.7), 0.7, "stopper:sampled")
        runners.warn_temperature(types.SimpleNamespace(), 0.7, "static:1")  # no collections
    with pytest.warns(UserWarning, match="temperature 0.7 and decodes at 0"):
        runners.warn_temperature(trained_at(0.7), 0.0, "stopper:sampled")
