"""`mcsd eval --batch-size B`: every method decodes the same batches; speed is paired per
batch, outputs are still compared per prompt."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch
from test_decoder_greedy import prompts as random_prompts

from mcsd_runtime import cli
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
from mcsd_runtime.evaluate.loop import run_eval
from mcsd_runtime.evaluate.stats import paired_geomean as _geo
from mcsd_runtime.evaluate.stats import summarize
from mcsd_runtime.models.pair import Pair
from mcsd_runtime.prompts.domains import Prompt


class Digits:
    """Token ids written as numbers: a tokenizer for conftest's random pair, whose greedy
    outputs differ from prompt to prompt (the tiny toy pair's continue every toy-code prompt
    with one repeated token, so they cannot tell one prompt's row from another's)."""

    eos_token_id = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": [int(t) for t in text.split()]}

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


@pytest.fixture(scope="module")
def digit_pair(pair) -> Pair:
    return Pair(pair.target, pair.draft, tokenizer=Digits(), fingerprint=pair.fingerprint)


def digit_prompts(n: int) -> list[Prompt]:
    return [Prompt(f"p{i}", " ".join(map(str, ids)), "random")
            for i, ids in enumerate(random_prompts(64, n=n, seed=5))]


def test_batched_records_pair_speed_per_batch(digit_pair, monkeypatch):
    """Every record of a batch carries that batch's throughput: its rows' committed tokens
    (counted here from the records) over the batch's decode seconds (its wall seconds less its
    prefills, read from the BatchResult each generate_batch call returned); and outputs are
    still compared per prompt."""
    calls = []  # (prompts, BatchResult) of every generate_batch call, in order
    real = MCSDDecoder.generate_batch

    def recording(self, prompts, *args, **kwargs):
        out = real(self, prompts, *args, **kwargs)
        calls.append(([list(p) for p in prompts], out))
        return out

    monkeypatch.setattr(MCSDDecoder, "generate_batch", recording)
    prompts = digit_prompts(7)
    methods = ["ar", "static:1", "heuristic"]
    records = run_eval(digit_pair, prompts, methods,
                       DecodeConfig(k_config=(2, 2, 1), max_new_tokens=12), progress=False,
                       batch_size=3)
    by = {m: [r for r in records if r.method == m] for m in methods}
    for recs in by.values():
        assert [r.prompt_id for r in recs] == [p.id for p in prompts]
        assert [r.batch_id for r in recs] == ["batch0000"] * 3 + ["batch0001"] * 3 + [
            "batch0002"]
    # records in run order, grouped by (method, batch), meet the timed calls after one warm-up
    # call per method
    groups: list[list] = []
    for r in records:
        if groups and (groups[-1][0].method, groups[-1][0].batch_id) == (r.method, r.batch_id):
            groups[-1].append(r)
        else:
            groups.append([r])
    ids = {p.id: Digits()(p.text)["input_ids"] for p in prompts}
    assert len(calls) == len(methods) + len(groups) == len(methods) + 3 * 3
    for recs, (asked, out) in zip(groups, calls[len(methods):], strict=True):
        assert asked == [ids[r.prompt_id] for r in recs]
        assert [r.token_ids for r in recs] == [res.token_ids for res in out]
        decode_s = out.stats.wall_time - out.stats.prefill_time
        assert 0 < decode_s < out.stats.wall_time
        tps = sum(len(r.token_ids) for r in recs) / decode_s
        for r in recs:
            assert r.batch_tokens_per_s == pytest.approx(tps, rel=1e-12)
            assert r.tokens_per_s == r.batch_tokens_per_s
    for m in ("static:1", "heuristic"):  # lossless per prompt
        assert [r.token_ids for r in by[m]] == [r.token_ids for r in by["ar"]]
    assert len({tuple(r.token_ids) for r in by["ar"]}) == 7  # seven prompts, seven outputs
    assert _geo(by["heuristic"], by["ar"])["n"] == 3  # paired on batches, not prompts
    rows = {r["method"]: r for r in summarize(records, greedy=True)}
    assert rows["heuristic"]["ar_equal_share"] == 1.0 and rows["heuristic"]["prompts"] == 7


def test_batched_records_are_scored_on_their_own_prompt_and_output(digit_pair):
    """Quality on batched records: each record's target NLL, target top-1 share and repeated
    4-gram share, computed here from its own prompt and output; greedy lossless methods score
    100% target top-1 (their rows are the target's greedy continuations of their own prompts)
    and equal AR's scores exactly, prompt by prompt."""
    prompts = digit_prompts(5)
    methods = ["ar", "static:2", "heuristic"]
    records = run_eval(digit_pair, prompts, methods,
                       DecodeConfig(k_config=(2, 2, 1), max_new_tokens=40), progress=False,
                       batch_size=3)
    ids = {p.id: Digits()(p.text)["input_ids"] for p in prompts}
    ar = {r.prompt_id: r for r in records if r.method == "ar"}
    assert len(records) == 3 * 5 and {r.batch_id for r in records} == {"batch0000",
                                                                       "batch0001"}
    for r in records:
        nll, top1 = scores_here(digit_pair.target, ids[r.prompt_id], r.token_ids)
        assert len(r.token_ids) > 4 and r.target_nll == pytest.approx(nll, rel=1e-9)
        assert r.target_top1_share == top1 == 1.0
        grams = [tuple(r.token_ids[i:i + 4]) for i in range(len(r.token_ids) - 3)]
        assert r.repeat_share == pytest.approx((len(grams) - len(set(grams))) / len(grams))
        a = ar[r.prompt_id]
        assert (r.target_nll, r.target_top1_share, r.repeat_share) == (
            a.target_nll, a.target_top1_share, a.repeat_share)
    assert len({tuple(r.token_ids) for r in ar.values()}) == 5  # five outputs
    assert any(r.repeat_share > 0 for r in ar.values())  # a 4-gram repeats


def scores_here(model, prompt: list[int], output: list[int]) -> tuple[float, float]:
    """(mean NLL per output token, share of output tokens that are the model's argmax) from a
    teacher-forced forward over prompt + output."""
    x = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(input_ids=x).logits[0, len(prompt) - 1 : -1].double()
    y = torch.tensor(output)
    nll = torch.nn.functional.cross_entropy(logits, y)
    return float(nll), float((logits.argmax(-1) == y).double().mean())


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
    settings = json.loads((tmp_path / "run" / "summary.json").read_text())["settings"]
    assert settings["batch_size"] == 2
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
    methods = ("ar", "static:1", "static:2", "heuristic")
    assert set(rows) == {(m, b) for m in methods for b in (1, 2)}
    tps = {}  # (method, batch size) -> {batch: tokens/s}, from the per-prompt records alone
    tokens = {}  # (method, batch size) -> {batch: committed tokens of its rows}
    for b in (1, 2):
        records = [json.loads(x) for x in (out / f"b{b}" / "per_prompt.jsonl").read_text()
                   .splitlines()]
        assert len({r["batch_id"] for r in records}) == 4 // b  # paired per batch
        for r in records:
            key = r["method"], b
            tps.setdefault(key, {})[r["batch_id"]] = r["tokens_per_s"]
            tokens.setdefault(key, {}).setdefault(r["batch_id"], 0)
            tokens[key][r["batch_id"]] += len(r["token_ids"])
        assert all(rows[m, b]["ar_equal_share"] == 1.0 for m in ("static:1", "heuristic"))

    def geomean(m: str, ref: str, b: int) -> float:
        """The geometric mean over batches of m's tokens/s over ref's on the same batch."""
        mine, theirs = tps[m, b], tps[ref, b]
        assert set(mine) == set(theirs)
        return math.exp(statistics.mean(math.log(mine[u] / theirs[u]) for u in mine))

    def whole(m: str, b: int) -> float:
        """All batches' tokens over all their decode seconds (a batch's: tokens / tokens/s)."""
        seconds = sum(tokens[m, b][u] / tps[m, b][u] for u in tps[m, b])
        return sum(tokens[m, b].values()) / seconds

    bests = {}
    for b in (1, 2):
        best = bests[b] = max(("static:1", "static:2"), key=lambda m: geomean(m, "ar", b))
        for m in methods:
            row = rows[m, b]
            assert row["best_static"] == best
            assert row["tokens_per_s"] == pytest.approx(whole(m, b), rel=1e-9)
            assert row["vs_b1"] == pytest.approx(whole(m, b) / whole(m, 1), rel=1e-9)
            for key, ref in (("ar", "ar"), ("best_static", best), ("heuristic", "heuristic")):
                assert row[f"vs_{key}"] == pytest.approx(geomean(m, ref, b), rel=1e-9), (m, key)
    # the statics and batch sizes differ in speed: each comparison above can come out wrong
    assert len({round(geomean(m, "ar", b), 9) for m in ("static:1", "static:2")
                for b in (1, 2)}) == 4
    assert whole("ar", 2) != whole("ar", 1)
    assert (f"Best static at each batch size: B=1: {bests[1]}, B=2: {bests[2]}\n"
            in (out / "batches.md").read_text())
    assert cli.main(["eval", "--batch-size", "2,2", "--out", str(tmp_path / "x")]) == 2
    assert "names a batch size twice" in capsys.readouterr().err
