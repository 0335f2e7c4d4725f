"""The `hf` reference (the target's own generate()) in `mcsd eval` / `mcsd bench`: it equals our
AR greedily, the report pairs every method with it, and a difference is located and explained
by the target's top-2 logit margin there."""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

import pytest
import torch

from mcsd_runtime import cli
from mcsd_runtime.cli.bench import register as bench_register
from mcsd_runtime.cli.eval import register as eval_register
from mcsd_runtime.decode.decoder import DecodeConfig
from mcsd_runtime.evaluate.divergence import first_difference, mark_divergences, top2_margin
from mcsd_runtime.evaluate.eval_report import markdown_notes, markdown_table
from mcsd_runtime.evaluate.loop import run_eval
from mcsd_runtime.evaluate.record import Record
from mcsd_runtime.evaluate.stats import summarize
from mcsd_runtime.prompts.sets import load_prompts


def mcsd(argv: list[str]) -> int:
    return cli.run_parser(cli.build_parser([eval_register, bench_register]), argv)


def test_hf_equals_ar_greedily_on_the_tiny_pair(toy_pair):
    prompts = load_prompts("toy-code", limit=3)
    records = run_eval(toy_pair, prompts, ["ar", "hf", "mcsd:2,1"],
                       DecodeConfig(k_config=(2, 1), max_new_tokens=24), progress=False)
    by = {(r.method, r.prompt_id): r for r in records}
    for p in prompts:
        hf = by["hf", p.id]
        assert hf.new_tokens == 24 and hf.target_calls == 24  # one forward per token
        assert by["ar", p.id].token_ids == hf.token_ids == by["mcsd:2,1", p.id].token_ids
        assert by["ar", p.id].hf_divergence is None
    rows = {r["method"]: r for r in summarize(records, greedy=True)}
    for row in rows.values():
        assert row["hf_equal_share"] == row["ar_equal_share"] == 1.0
        assert row["hf_differences"] == 0 and row["hf_min_margin"] is None
    assert rows["hf"]["tau"] == 1.0 and rows["hf"]["speedup_vs_hf"] == 1.0


class TableLM(torch.nn.Module):
    """Next-token logits fixed by the last token: row `t` of `table` follows token `t`."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table, self.device = table, torch.device("cpu")

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.table[input_ids])


TABLE = torch.tensor([[0.0, 5.0, 1.0, 0.0, 0.0],
                      [0.0, 0.0, 4.0, 1.0, 0.0],
                      [0.5, 0.0, 1.0, 2.75, 2.5],  # after token 2: 3 and 4 nearly tie
                      [0.0, 0.0, 0.0, 0.0, 1.0],
                      [1.0, 0.0, 0.0, 0.0, 0.0]])


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one output ends where the other goes on
    assert first_difference([], []) is None


def test_margin_at_the_first_difference_on_a_constructed_case():
    model = TableLM(TABLE)
    assert top2_margin(model, [0, 1, 2]) == pytest.approx(0.25)
    assert top2_margin(model, [2, 0]) == pytest.approx(4.0)
    ours = Record("mcsd", "p0", [1, 2, 4, 0], 4, 1.0, 2, 2, 4, 2, 0.5, True, [])
    ref = Record("hf", "p0", [1, 2, 3, 4], 4, 2.0, 4, 0, 0, 0, None, True, [])
    lossy = Record("lossy", "p0", [2, 2, 2, 2], 4, 1.0, 2, 2, 4, 2, 0.5, False, [])
    mark_divergences(SimpleNamespace(target=model), [ours, ref, lossy], {"p0": [0]})
    # one forward over the prompt and the common prefix [0, 1, 2]: row 2 of the table
    assert ours.hf_divergence == {"position": 2, "token": 4, "reference_token": 3,
                                  "top2_margin": pytest.approx(0.25)}
    assert ref.hf_divergence is None and lossy.hf_divergence is None  # lossy: drift expected
    rows = {r["method"]: r for r in summarize([ours, ref, lossy], greedy=True)}
    assert rows["mcsd"]["hf_equal_share"] == 0.0 and rows["mcsd"]["hf_differences"] == 1
    assert rows["mcsd"]["hf_min_margin"] == pytest.approx(0.25)
    assert rows["mcsd"]["speedup_vs_hf"] == pytest.approx(2.0)
    notes = markdown_notes(list(rows.values()), [ours, ref, lossy])
    assert "mcsd, prompt p0: first differs from hf at new token 2 (4 vs 3)" in notes
    assert "margin there 0.25" in notes


def test_unknown_drafted_tokens_show_as_unknown():
    assisted = Record("hf-assisted", "p0", [1, 2], 2, 1.0, 1, 2, None, None, None, True, [])
    ar = Record("ar", "p0", [1, 2], 2, 1.0, 2, 0, 0, 0, None, True, [])
    rows = summarize([assisted, ar], greedy=True)
    assert rows[0]["drafted_per_token"] is None and rows[1]["drafted_per_token"] == 0.0
    head, _, line = markdown_table(rows).splitlines()[:3]
    col = [c.strip() for c in head.split("|")].index("drafted/token")
    assert line.split("|")[col].strip() == "–"
    assert rows[0]["speedup_vs_hf"] is None and rows[0]["hf_equal_share"] is None  # no hf ran


@pytest.fixture(scope="module")
def eval_dir(toy_tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval-hf") / "run"
    assert mcsd(["eval", "--target", str(toy_tiny / "target"), "--draft",
                 str(toy_tiny / "draft"), "--prompts", "toy-code", "--limit", "2",
                 "--max-new-tokens", "12", "--k-config", "2,1", "--methods",
                 "ar,hf,heuristic,hf-generate:heuristic,hf-assisted", "--out", str(out)]) == 0
    return out


def test_report_pairs_every_method_with_ar_and_hf(eval_dir):
    header = (eval_dir / "summary.md").read_text().splitlines()[0]
    for column in ("speedup vs AR", "speedup vs hf", "AR-equal", "hf-equal"):
        assert column in header
    rows = {r["method"]: r for r in json.loads((eval_dir / "summary.json").read_text())["methods"]}
    records = [json.loads(line) for line in
               (eval_dir / "per_prompt.jsonl").read_text().splitlines()]
    tps = {(r["method"], r["prompt_id"]): r["tokens_per_s"] for r in records}
    prompts = sorted({p for _, p in tps})

    def paired(method: str, ref: str) -> float:  # the median per-prompt ratio of tokens/s
        return statistics.median(tps[method, p] / tps[ref, p] for p in prompts)

    for method, row in rows.items():
        assert row["hf_equal_share"] == 1.0 and row["ar_equal_share"] == 1.0, method
        assert row["speedup_vs_hf"] == pytest.approx(paired(method, "hf")), method
        assert row["speedup_vs_ar"] == pytest.approx(paired(method, "ar")), method
    assert rows["ar"]["speedup_vs_ar"] == rows["hf"]["speedup_vs_hf"] == 1.0
    assert rows["hf-assisted"]["drafted_per_token"] is None
    twin = rows["hf-generate:heuristic"]
    assert twin["decoder_twin"] == "heuristic"
    assert twin["speedup_vs_twin"] == pytest.approx(paired("hf-generate:heuristic", "heuristic"))
    assert twin["tau"] == rows["heuristic"]["tau"]  # the same decoder, the same steps
    assert "of heuristic (median paired ratio" in (eval_dir / "report.md").read_text()


def test_bench_reports_ar_and_hf(toy_tiny, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert mcsd(["bench", "--target", str(toy_tiny / "target"), "--draft",
                 str(toy_tiny / "draft"), "--limit", "2", "--max-new-tokens", "8",
                 "--k-config", "2,1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["methods"]) == ["ar", "hf", "mcsd:2,1"]
    for m in report["methods"].values():
        assert m["hf_equal_share"] == 1.0 and 0 < m["forward_fraction"] <= 1
        assert m["new_tokens"] == 2 * 8  # greedy, no EOS reached in 8 tokens here
    ar, hf, sd = report["methods"].values()
    assert ar["speedup_vs_ar"] == hf["speedup_vs_hf"] == 1.0 and ar["tau"] == hf["tau"] == 1.0
    assert sd["tau"] > 1  # drafts were accepted
    assert report["hf_divergences"] == []
    assert "vs hf" in capsys.readouterr().out


def test_hf_generate_needs_a_stopper_spec():
    from mcsd_runtime.errors import MCSDError
    from mcsd_runtime.evaluate.methods import check_method

    for name in ("hf", "hf-generate:heuristic", "hf-generate:confidence:0.4"):
        check_method(name)
    for name in ("hf-generate:warp", "hf-generate", "hf-generate:"):
        with pytest.raises(MCSDError, match=f"unknown method '{name}'"):
            check_method(name)
    with pytest.raises(MCSDError, match="/some/artifact is not a stopper artifact"):
        check_method("hf-generate:stopper:/some/artifact")  # checked as loading will check it


def test_ar_takes_its_first_token_from_the_prefill(pair):
    """One target forward per new token, like generate(): the prefill gives the first token."""
    from mcsd_runtime.decode.decoder import ARDecoder
    from mcsd_runtime.evaluate.runners import ForwardMeter

    prompt = [5, 9, 13, 2]
    x = torch.tensor([prompt])
    ref = pair.target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12,
                               do_sample=False)[0, 4:].tolist()
    for max_new, eos in ((12, None), (1, None), (12, ref[0]), (12, ref[3])):
        dec = ARDecoder(pair, DecodeConfig(max_new_tokens=max_new,
                                           eos_token_ids=None if eos is None else (eos,)))
        with ForwardMeter({"target": pair.target}) as meter:
            out = dec.generate(prompt)
        want = ref[:max_new] if eos is None else ref[: ref.index(eos) + 1]
        assert out.token_ids == want
        assert meter.calls["target"] == out.stats.target_calls == len(want)


def test_ar_sampling_follows_the_target():
    """The first token (from the prefill) and the second (from a step) at temperature 0.7: 500
    draws, at which a sampler ignoring the temperature (p about 1e-15 at these seeds) or drawing
    from p squared (p about 1e-56) is rejected."""
    from scipy.stats import chisquare

    from conftest import make_pair
    from mcsd_runtime.decode.decoder import ARDecoder

    micro = make_pair(vocab=6, seed=3, init_range=0.5)
    prompt, vocab, temp, n = [1, 4, 2], 6, 0.7, 500
    with torch.no_grad():
        first = torch.softmax(micro.target(torch.tensor([prompt])).logits[0, -1] / temp, -1)
        ctx = torch.tensor([prompt + [x] for x in range(vocab)])
        second = torch.softmax(micro.target(ctx).logits[:, -1] / temp, -1)
    expected = (first[:, None] * second).flatten() * n
    dec = ARDecoder(micro, DecodeConfig(temperature=temp, max_new_tokens=2))
    counts = torch.zeros(vocab * vocab)
    # the seeds as rows of one batch: each row draws with its own generator, as alone (seed 0)
    rows = dec.generate_batch([prompt] * n, batch_size=n, seeds=range(n))
    assert dec.generate(prompt, seed=0).token_ids == rows[0].token_ids
    for r in rows:
        x1, x2 = r.token_ids
        counts[x1 * vocab + x2] += 1
    keep = expected >= 5
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
    assert chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3
