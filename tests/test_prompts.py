"""Prompt sets: toy code prompts cut from held-out stdlib files, benchmark file formats, and the
errors a user can run into."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from mcsd_runtime import cli
from mcsd_runtime.cli.toy import register as toy_register
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts import sets as prompts
from mcsd_runtime.prompts.sets import Prompt, cut_code, load_prompts
from mcsd_runtime.toy.corpus import source_files, split_of

SAMPLES = Path(__file__).resolve().parent.parent / "data" / "prompts"


def mcsd(argv: list[str]) -> int:
    """The `mcsd` CLI with only this package's commands (as `cli.main` runs them)."""
    return cli.run_parser(cli.build_parser([toy_register]), argv)


def test_toy_code_sets_are_held_out_disjoint_and_deterministic():
    evals = load_prompts("toy-code")
    collect = load_prompts("toy-code-collect")
    assert len(evals) >= 100 and len(collect) >= 100
    eval_files = {p.id.rsplit(":", 1)[0] for p in evals}
    collect_files = {p.id.rsplit(":", 1)[0] for p in collect}
    assert not eval_files & collect_files
    train_files = {f.rel for f in source_files("train")}
    assert not (eval_files | collect_files) & train_files
    assert all(split_of(f) == "eval" for f in eval_files)
    assert len({p.id for p in evals}) == len(evals)
    for p in evals + collect:
        assert 220 <= len(p.text) <= 640
        assert not p.text.endswith("\n")
    assert {p.source for p in evals} == {"toy-code"}
    assert load_prompts("toy-code") == evals


def test_cut_code_ends_inside_a_function():
    source = "import os\n\n\ndef f(x):\n" + "".join(f"    y{i} = x + {i}\n" for i in range(60))
    cuts = cut_code(source, "example.py")
    assert cuts
    line, text = cuts[0]
    assert text.splitlines()[-1].startswith("    y")
    assert source.splitlines()[line - 1].startswith("    y")  # continuation is in the body
    assert cut_code("def broken(:\n", "x.py") == []


def test_limit_is_a_seeded_sample_in_order():
    full = load_prompts("toy-code")
    a = load_prompts("toy-code", limit=10, seed=1)
    assert len(a) == 10 and a == load_prompts("toy-code", limit=10, seed=1)
    assert a != load_prompts("toy-code", limit=10, seed=2)
    positions = [full.index(p) for p in a]
    assert positions == sorted(positions)
    assert len(load_prompts("toy-code", limit=10**6)) == len(full)


def test_benchmark_formats_from_local_files():
    mt = load_prompts(f"mt-bench={SAMPLES / 'mt-bench.sample.jsonl'}")
    assert [p.id for p in mt] == ["1", "2", "3"]
    assert mt[0].text.count("\n\n") == 1 and mt[0].source == "mt-bench"
    alpaca = load_prompts(f"alpaca={SAMPLES / 'alpaca.sample.json'}")
    assert alpaca[1].text.startswith("Summarize the text in one sentence.\n\nThe library")
    assert alpaca[0].text == "Give three tips for keeping a houseplant alive."
    tqa = load_prompts(f"trivia-qa={SAMPLES / 'trivia-qa.sample.jsonl'}")
    assert tqa[0] == Prompt("tqa_sample_1", "Which planet is known as the Red Planet?", "trivia-qa",
                            category="qa", kind="instruction")
    wmt = load_prompts(f"wmt-de={SAMPLES / 'wmt-de.sample.jsonl'}")
    assert wmt[0].text == "Translate English to German: The house is small.\nGerman:"
    generic = load_prompts(str(SAMPLES / "generic.sample.jsonl"))
    assert [p.id for p in generic] == ["g1", "g2", "g3"]
    assert generic[1].text.startswith("Explain speculative decoding")


def test_parquet_and_wrapped_json(tmp_path):
    lines = (SAMPLES / "mt-bench.sample.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    pd.DataFrame(rows).to_parquet(tmp_path / "mt.parquet")
    mt = load_prompts(f"mt-bench={tmp_path / 'mt.parquet'}")  # turns come back as arrays
    assert len(mt) == 3 and "\n\n" in mt[0].text
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": [{"question": "Why?"}]}))
    assert load_prompts(str(tmp_path / "wrapped.json"))[0].text == "Why?"


def test_hub_failure_names_the_dataset_and_the_fix(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'mandarjoshi/trivia_qa' on the Hub")

    monkeypatch.setattr(prompts, "_hub_load", offline)
    with pytest.raises(MCSDError) as err:
        load_prompts("trivia-qa", limit=5)
    msg = str(err.value)
    assert "mandarjoshi/trivia_qa" in msg and "unreachable" in msg and "local file" in msg


def test_hub_rows_use_the_set_format(monkeypatch):
    rows = [{"prompt": ["Hi?", "More?"], "prompt_id": 81, "category": "writing"}]
    monkeypatch.setattr(prompts, "_hub_load", lambda *a, **k: rows)
    assert load_prompts("mt-bench") == [Prompt("81", "Hi?\n\nMore?", "mt-bench",
                                               category="writing", kind="instruction")]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mt-bemch", "unknown prompt set 'mt-bemch'; use one of toy-code"),
        ("nosuch=x.jsonl", "unknown prompt set 'nosuch'"),
        ("missing/file.jsonl", "does not exist"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(MCSDError, match=message):
        load_prompts(spec)


def test_bad_files(tmp_path):
    (tmp_path / "nofield.jsonl").write_text('{"answer": "x"}\n')
    with pytest.raises(MCSDError, match="no record has a usable prompt field"):
        load_prompts(str(tmp_path / "nofield.jsonl"))
    with pytest.raises(MCSDError, match="`turns` list"):
        load_prompts(f"mt-bench={tmp_path / 'nofield.jsonl'}")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(MCSDError, match="gave no prompts"):
        load_prompts(str(tmp_path / "empty.jsonl"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(MCSDError, match="cannot read prompt file"):
        load_prompts(str(tmp_path / "bad.json"))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(MCSDError, match="cannot read prompt file"):
        load_prompts(str(tmp_path / "bad.parquet"))
    with pytest.raises(MCSDError, match="positive"):
        load_prompts("toy-code", limit=0)


def test_cli_unknown_set_exits_2_without_traceback(capsys):
    assert mcsd(["prompts", "mt-bemch"]) == 2
    err = capsys.readouterr().err
    assert "unknown prompt set 'mt-bemch'" in err and "Traceback" not in err


def test_cli_exports_jsonl_readable_back(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    assert mcsd(["prompts", "toy-code", "--limit", "5", "--jsonl", str(out)]) == 0
    back = load_prompts(str(out))
    assert [p.text for p in back] == [p.text for p in load_prompts("toy-code", limit=5)]
    assert "wrote 5 prompts" in capsys.readouterr().out
    spec = f"spec-bench={SAMPLES / 'spec-bench.sample.jsonl'}"  # kinds and categories too
    assert mcsd(["prompts", spec, "--jsonl", str(out)]) == 0
    back = [(p.id, p.text, p.category, p.kind) for p in load_prompts(str(out))]
    assert back == [(p.id, p.text, p.category, p.kind) for p in load_prompts(spec)]


def test_a_record_without_a_prompt_is_refused_with_its_line(tmp_path):
    """One bad record among good ones is an error naming its line, not a silently shorter set;
    a JSON error names the file's line, not line 1 of the record."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "one"}\n\n{"answer": "x"}\n{"text": "three"}\n')
    with pytest.raises(MCSDError, match=r"p.jsonl, line 3: no usable prompt field"):
        load_prompts(str(path))
    path.write_text('{"text": "one"}\n{"text": "two"}\n{"text": "thr\n')
    with pytest.raises(MCSDError, match=r"p.jsonl, line 3: Unterminated string"):
        load_prompts(str(path))
    (tmp_path / "p.json").write_text('[{"text": "one"}, {"answer": 2}]')
    with pytest.raises(MCSDError, match=r"p.json, record 2: no usable prompt field"):
        load_prompts(str(tmp_path / "p.json"))
