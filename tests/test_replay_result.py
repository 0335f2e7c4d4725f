"""`replay.result`: one replayed comparison (`Comparison`) and one report writer (`Report`),
through which every decision (stop, copy, width, budget) records and prints its report, and
the one geometric mean and oracle share (`mcsd_runtime.metrics`) they all compute with."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

from mcsd_runtime import metrics
from replay.result import ABSENT, Column, Comparison, Report, ci, pct

ROOT = Path(__file__).resolve().parents[1]


def copy_comparison(domain: str = "code", trained: bool = True) -> Comparison:
    outputs = {"learned": [2.0, 1.5, 1.8], "oracle": [2.5, 2.0, 2.2],
               "lookup:8:3": [1.5, 1.2, 1.4], "lookup:15:2": [1.6, 1.3, 1.5]}
    return Comparison.of_outputs(domain, outputs, "lookup:8:3",
                                 ["lookup:8:3", "lookup:15:2"], trained=trained)


def test_a_comparison_takes_its_speeds_ratios_and_share_from_metrics():
    c = copy_comparison()
    assert c.speeds["learned"] == metrics.geomean([2.0, 1.5, 1.8])
    assert c.best_static == "lookup:15:2" and c.n == 3
    assert c.ratio() == c.speeds["learned"] / c.speeds["lookup:8:3"]
    assert c.ratio(over="missing") is None
    assert c.share() == metrics.oracle_share(c.speeds["learned"], c.speeds["lookup:8:3"],
                                             c.speeds["oracle"])
    assert c.paired(over="lookup:15:2") == metrics.paired_speedup([2.0, 1.5, 1.8],
                                                                  [1.6, 1.3, 1.5])
    # equals: the first static named is the best one, as `max` keeps it
    tie = Comparison.of_outputs("t", {"learned": [1.0], "oracle": [2.0], "a": [1.0],
                                      "b": [1.0]}, "b", ["a", "b"])
    assert tie.best_static == "a" and tie.share() == 0.0
    # pooled: the parts' outputs concatenated, then their geometric means
    mix = Comparison.pooled("mix", [copy_comparison("a"), copy_comparison("b")])
    assert mix.n == 6 and mix.speeds["learned"] == pytest.approx(c.speeds["learned"])
    more = mix.with_outputs({"out of fold": [1.0, 4.0]})
    assert more.speeds["out of fold"] == pytest.approx(2.0) and "out of fold" not in mix.speeds
    assert more.share("out of fold") == pytest.approx(
        (2.0 - mix.speeds["lookup:8:3"]) / (mix.speeds["oracle"] - mix.speeds["lookup:8:3"]))


def test_a_report_records_its_keys_in_order_and_prints_its_table():
    report = Report(
        (Column("domain", lambda c: c.group),
         Column("n", lambda c: c.n, "n", str),
         Column("share", lambda c: c.share(), "share", pct),
         Column("extra", lambda c: c.facts.get("extra", ABSENT), "extra"),
         Column("hidden", lambda c: 7, "hidden", str, recorded=False),
         Column("vs_deploy", lambda c: c.paired(), "vs deploy", ci)),
        label=Column("label", lambda c: c.group.upper(), "domain"),
        printed=("vs_deploy", "n", "extra", "share"),
        order=lambda r: r["vs_deploy"]["geomean"])
    slow = Comparison.of_outputs("slow", {"learned": [1.0, 1.1], "oracle": [3.0, 3.0],
                                          "s": [1.0, 1.0]}, "s")
    fast = Comparison.of_outputs("fast", {"learned": [2.0, 2.2], "oracle": [3.0, 3.0],
                                          "s": [1.0, 1.0]}, "s", facts={"extra": 1.5})
    records, table = report.write([fast, slow])
    assert [list(r) for r in records] == [["domain", "n", "share", "extra", "vs_deploy"],
                                          ["domain", "n", "share", "vs_deploy"]]  # ABSENT: out
    assert records[0]["share"] == fast.share() and report.record(slow) == records[1]
    lines = table.splitlines()
    assert lines[0].split() == ["domain", "vs", "deploy", "n", "extra", "share"]
    assert lines[1].startswith("SLOW") and lines[2].startswith("FAST")  # sorted by `order`
    assert lines[1].split()[-2:] == ["-", pct(slow.share())]  # ABSENT printed as "-"
    assert "hidden" not in table  # not among the printed columns
    # a printed column no group has is left out of the table
    _, alone = report.write([slow])
    assert "extra" not in alone
    assert pct(None) == "-" and pct(float("nan")) == "-" and pct(0.25) == "25%"


def stop_results() -> dict:
    def split(learned: float) -> dict:
        return {"static:1": {"throughput": 100.0}, "static:2": {"throughput": 110.0},
                "oracle": {"throughput": 150.0}, "ar": {"throughput": 50.0},
                "learned": {"throughput": learned},
                "cumprod:0.5(tuned)": {"throughput": 105.0},
                "learned(threshold)": {"throughput": learned}}
    return {"val": split(120.0), "test": split(130.0) | {
        "oracle-bound(drafting)": {"throughput": 140.0}}}


def stop_headline() -> tuple[dict, str]:
    from train.stop.pipeline import _headline

    chosen = {"aggregation": "max", "threshold": 0.5, "min_depth": 1, "min_depth_gate": 0.0}
    return _headline(stop_results(), chosen, "exact", True, {"median_us": 10.0}, 1e-5)


def budget_record() -> dict:
    from train.budget.trainer import REPORT, comparison

    fams = {name: {"best": setting, "tokens_per_s": tps} for name, setting, tps in (
        ("padded static", "static:2", 100.0), ("ragged static", "static:2", 105.0),
        ("cumprod", "cumprod:0.9", 104.0), ("survival", "survival:1", 103.0),
        ("survival-online", "survival-online:0.05", 102.0), ("oracle-budget", "oracle-budget",
                                                             140.0),
        ("oracle", "oracle", 150.0), ("learned budget", "learned budget", 120.0))}
    return REPORT.record(comparison(4, {"ar": 90.0, "families": fams}))


def test_the_four_decisions_record_the_keys_their_artifacts_hold():
    from replay.copy import DOMAINS, MIX
    from replay.width import report as width_report

    headline, table = stop_headline()
    assert list(headline) == [
        "metric", "units", "replay_mode", "best_static", "best_static_value", "oracle_value",
        "learned_value", "speedup_vs_best_static", "oracle_gain_captured", "aggregation",
        "threshold", "min_depth", "min_depth_gate", "skip_rate", "skip_probe", "rule", "rate",
        "online_strength", "threshold_rule_value", "expected_rate_rule_value", "learned_vs_ar",
        "best_peer", "learned_vs_best_peer", "decision_latency_us", "replay_decision_us",
        "drafting_bound_value", "drafting_gain_captured"]
    assert headline["best_static"] == "static:2" and headline["best_peer"] == "cumprod:0.5"
    assert headline["oracle_gain_captured"] == pytest.approx(0.5)
    assert headline["drafting_gain_captured"] == pytest.approx(2 / 3)
    assert headline["learned_vs_best_peer"] == pytest.approx(130 / 105)
    assert table.splitlines()[1].startswith("val") and "static:2" in table
    assert budget_record() == {
        "learned_tokens_per_s": 120.0, "best_padded": "static:2", "vs_best_padded": 1.2,
        "best_peer": "ragged static (static:2)", "vs_best_peer": 120 / 105,
        "oracle_vs_best_padded": 1.5, "oracle_share": 0.4}
    (row,), _ = DOMAINS.write([copy_comparison()])
    assert list(row) == ["domain", "trained", "prompts", "learned_vs_ar", "best_static",
                         "best_static_vs_ar", "deploy", "deploy_vs_ar", "oracle_vs_ar",
                         "oracle_share", "vs_deploy", "vs_best_static"]
    mix = Comparison.pooled("training mix", [copy_comparison()],
                            facts={"outputs": 3, "folds": 0})
    assert list(MIX.record(mix)) == [
        "outputs", "learned_vs_ar", "deploy_vs_ar", "oracle_vs_ar", "oracle_share", "folds",
        "out_of_fold_vs_ar", "out_of_fold_share"]
    widths = {f"width {w}": [w * 1.0, w * 1.1] for w in (1, 2, 3)} | {
        "learned": [3.0, 3.5], "oracle": [3.5, 4.0]}
    category = Comparison.of_outputs("code", widths, "width 3", facts={"mean_width": 2.5})
    assert list(width_report(3).record(category)) == [
        "domain", "trained", "outputs", "width 1", "width 2", "learned", "mean_width", "oracle"]


def test_every_decision_computes_its_means_and_shares_with_metrics(monkeypatch):
    """Swapped for stand-ins, `metrics.geomean` and `metrics.oracle_share` show up in every
    decision's report: none computes its own."""
    from replay.copy import DOMAINS, MIX
    from replay.width import report as width_report

    monkeypatch.setattr(metrics, "geomean", lambda values: float(max(values)))
    monkeypatch.setattr(metrics, "oracle_share", lambda ours, base, oracle: 0.123)
    (row,), _ = DOMAINS.write([copy_comparison()])
    assert row["learned_vs_ar"] == 2.0 and row["oracle_share"] == 0.123
    mix = Comparison.pooled("training mix", [copy_comparison()],
                            facts={"outputs": 3, "folds": 2}).with_outputs(
        {"out of fold": [1.0, 3.0]})
    assert MIX.record(mix)["out_of_fold_vs_ar"] == 3.0
    assert MIX.record(mix)["out_of_fold_share"] == 0.123
    assert budget_record()["oracle_share"] == 0.123
    headline, _ = stop_headline()
    assert headline["oracle_gain_captured"] == headline["drafting_gain_captured"] == 0.123
    category = Comparison.of_outputs("code", {"width 1": [1.0, 2.0], "width 2": [2.0, 2.0],
                                              "learned": [1.5, 2.5], "oracle": [3.0, 3.0]},
                                     "width 2", facts={"mean_width": 1.5})
    _, table = width_report(2).write([category])
    assert "12%" in table and category.speeds["learned"] == 2.5


def test_the_trainers_report_through_the_one_writer():
    """Each decision's choose (the stop's `_headline`) writes its report with `Report.write`
    (directly, or through its replay module's `write_report`)."""
    sites = {"train/copy/trainer.py": "choose", "train/width/trainer.py": "choose",
             "train/budget/trainer.py": "choose", "train/stop/pipeline.py": "_headline"}
    for path, name in sites.items():
        tree = ast.parse((ROOT / path).read_text())
        fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
        calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                 for n in ast.walk(fn) if isinstance(n, ast.Call)}
        assert calls & {"write", "write_report"}, path
    for module in ("replay/copy.py", "replay/width.py"):
        text = (ROOT / module).read_text()
        assert re.search(r"\.write\(", text.split("def write_report", 1)[1]), module


GEOMEAN = re.compile(r"exp\(.*(log\(.*\.mean\(|(mean|fmean|sum)\(.*log)")
SHARE = re.compile(r"\(\s*[\w\[\]\"'.]+\s*-\s*([\w\[\]\"'.]+)\s*\)\s*/\s*\(\s*[\w\[\]\"'.]+"
                   r"\s*-\s*\1\s*\)")


def test_no_other_geometric_mean_or_oracle_share_in_the_project():
    found = []
    for package in ("replay", "train", "collect", "mcsd_runtime"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "mcsd_runtime" / "metrics.py":  # the one definition
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                # the share's shape is also an interpolation's: looked for where shares live
                share = package in ("replay", "train") and SHARE.search(line)
                if GEOMEAN.search(line) or share:
                    found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "use mcsd_runtime.metrics.geomean / oracle_share:\n" + "\n".join(found)
    assert GEOMEAN.search("math.exp(statistics.mean(math.log(x) for x in xs))")
    assert GEOMEAN.search("float(np.exp(np.log(values).mean()))")
    assert SHARE.search("(s - b) / (o - b)") and SHARE.search('(v - best[m]) / (o - best[m])')
    assert not math.isnan(metrics.geomean([1.0, 4.0]))
