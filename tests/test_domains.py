"""Prompt sets by domain: what each cutter keeps, held-out splits, and the table across domains."""

from __future__ import annotations

import json

import pytest

from mcsd_runtime import cli
from mcsd_runtime.cli.eval import register
from mcsd_runtime.evaluate.domain_report import domain_rows, markdown, worst_domains
from mcsd_runtime.evaluate.record import Record
from mcsd_runtime.prompts.domains import (
    DOMAIN_SETS,
    MAX_CHARS,
    MIN_CHARS,
    cut_prose,
    cut_shift,
    prose_paragraphs,
)
from mcsd_runtime.prompts.sets import load_prompts

BODY = "\n".join(f"    value_{i} = compute_something(value_{i - 1}, option={i})"
                 for i in range(1, 9))
SOURCE = f'''def zero(value_0):
{BODY}
    return value_8


def first(a, b):
    """Add two numbers and return the result.

    The numbers may be ints or floats; anything else raises TypeError, as the
    built-in addition would, and the message names the offending type so that
    callers can tell which of the two arguments was wrong without a debugger.
    """
{BODY}
    return a + b


def second(x):
    """Double x."""
{BODY}
    # Keep the result small: callers rely on the value fitting
    # in a machine word, and this is cheaper than checking later.
    y = x * 2
    return y
'''


def _continuation(source: str, line: int) -> str:
    return source.splitlines()[line - 1]


def test_cut_prose_ends_inside_the_prose():
    cuts = cut_prose(SOURCE, "demo.py")
    assert cuts
    for line, text in cuts:
        assert text in SOURCE
        nxt = _continuation(SOURCE, line).strip()
        assert nxt and (nxt.startswith("#") or nxt[0].isalpha() or nxt.startswith('"""')), nxt
        assert not nxt.startswith(("def ", "return", "value_"))


def test_cut_shift_ends_on_code_before_a_docstring_or_comment():
    cuts = cut_shift(SOURCE, "demo.py")
    assert cuts
    for line, text in cuts:
        assert text.rstrip().splitlines()[-1].strip() and text in SOURCE
        nxt = _continuation(SOURCE, line).strip()
        assert nxt.startswith(('"""', "#")), nxt


def test_prose_paragraphs_leave_out_code_tables_and_headings():
    readme = (
        "# Title\n\nThis library computes things quickly and it explains each of them in plain "
        "words, with more words after these ones so that the paragraph is long.\n\n"
        "```python\nimport thing\nthing.run()\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "    indented code block that should be left out of the prose entirely ok\n\n"
        "Another paragraph of running prose follows here; it has enough letters to count as "
        "prose and no links at all, so it is kept.\n")
    paras = prose_paragraphs(readme)
    assert len(paras) == 2
    assert all("import" not in p and "|" not in p and not p.startswith("#") for p in paras)


@pytest.mark.parametrize("name", ["toy-doc", "toy-doc-collect", "toy-shift", "pkg-code",
                                  "pkg-prose"])
def test_every_domain_loads_within_the_length_bounds(name):
    prompts = load_prompts(name)
    assert len(prompts) >= 20, name
    assert all(MIN_CHARS <= len(p.text) <= MAX_CHARS for p in prompts)
    assert len({p.id for p in prompts}) == len(prompts)
    assert load_prompts(name, limit=5) == load_prompts(name, limit=5)


def test_training_and_evaluation_sets_share_no_file():
    def files(name):
        return {p.id.rsplit(":", 1)[0] for p in load_prompts(name)}

    collect = files("toy-code-collect") | files("toy-doc-collect")
    for held_out in ("toy-code", "toy-doc", "toy-shift"):
        assert not collect & files(held_out), held_out
    assert all(not pid.startswith("mcsd-stoppers") for pid in files("pkg-prose"))


def test_prompts_list_names_every_domain(capsys):
    from mcsd_runtime.cli.prompts import register as register_prompts

    code = cli.run_parser(cli.build_parser([register_prompts]), ["prompts", "--list"])
    out = capsys.readouterr().out
    assert code == 0 and all(name in out for name in DOMAIN_SETS)
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "instruction; category qa" in lines["inst-qa-eval"]
    assert "categories explain" in lines["inst-mix"] and "(text)" in lines["humaneval"]
    assert "prompts: text)" in lines["toy-code"] and "spec-bench=FILE" in lines


def _rec(method: str, prompt: str, tps: float, tokens: list[int]) -> Record:
    return Record(method, prompt, tokens, 10, 10 / tps, 5, 5, 10, 5, 0.5, True, [])


def test_domain_rows_compare_with_each_baseline_and_find_the_worst_domain():
    by_domain = {}
    # "a": the learned method is 1.2x static:2 (the deploy) and 1.0x the heuristic;
    # "b": static:1 is best there and the learned method is 0.8x of it.
    speeds = {"a": {"ar": 100, "static:1": 110, "static:2": 150, "heuristic": 180, "learned": 180},
              "b": {"ar": 100, "static:1": 125, "static:2": 100, "heuristic": 120, "learned": 100}}
    for dom, methods in speeds.items():
        by_domain[dom] = [_rec(m, f"p{i}", tps * (1 + 0.01 * i), [i])
                          for i in range(6) for m, tps in methods.items()]
    rows = domain_rows(by_domain, deploy="static:2", heuristic="heuristic")
    got = {(r["domain"], r["method"]): r for r in rows}
    assert got[("a", "learned")]["vs_deploy"] == pytest.approx(1.2)
    assert got[("a", "learned")]["vs_heuristic"] == pytest.approx(1.0)
    assert got[("b", "learned")]["best_static"] == "static:1"
    assert got[("b", "learned")]["vs_best_static"] == pytest.approx(0.8)
    assert got[("a", "learned")]["ar_equal"] is True
    worst = {w["method"]: w for w in worst_domains(rows)}["learned"]
    assert worst["best_static"]["domain"] == "b" and worst["deploy"]["domain"] == "b"
    assert "| b | learned |" in markdown(rows, worst_domains(rows), "static:2", "heuristic")


def test_eval_across_domains_writes_one_folder_per_domain_and_the_table(toy_tiny, tmp_path,
                                                                        capsys):
    out = tmp_path / "run"
    code = cli.run_parser(cli.build_parser([register]), [
        "eval", "--target", str(toy_tiny / "target"), "--draft", str(toy_tiny / "draft"),
        "--prompts", "toy-code,toy-shift", "--limit", "2", "--max-new-tokens", "8",
        "--k-config", "1,1,1", "--methods", "ar,static:1,heuristic", "--deploy", "static:2",
        "--out", str(out)])
    assert code == 0
    report = json.loads((out / "domains.json").read_text())
    settings = report["settings"]
    assert settings["deploy"] == "static:2" and settings["heuristic"] == "heuristic"
    assert {r["domain"] for r in report["rows"]} == {"toy-code", "toy-shift"}
    assert {r["method"] for r in report["rows"]} == {"ar", "static:1", "static:2", "heuristic"}
    assert all(r["ar_equal"] for r in report["rows"])
    assert (out / "toy-code" / "summary.json").is_file()
    assert (out / "toy-shift" / "report.md").is_file()
    printed = capsys.readouterr().out
    assert "Worst domain per method" in printed
    assert "deploy = `static:2` (given by --deploy)" in printed  # not "chosen on validation"
