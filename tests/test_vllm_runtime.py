"""From vLLM's traces to a table vLLM serves, through the commands a user runs
(`mcsd collect --engine vllm`, `mcsd profile --engine vllm`, `mcsd train --decision schedule`,
`mcsd export`, `mcsd eval --engine vllm --methods ar,table:PATH`), on the tiny toy pair in fp32,
every engine started in-process (`MCSD_VLLM_IN_PROCESS=1`).

- the trace holds one row per request and verify step, as vLLM counted them;
- the engine profile has a step time for every (concurrency, K), each positive;
- the trained table loads in vLLM, is exported in vLLM's format, and decodes the same outputs
  as vLLM plain, at one request and over waves of one and two requests in turn.
"""

from __future__ import annotations

import json

import pytest

from mcsd_runtime.cli import main

pytest.importorskip("vllm")

COMMON = ["--prompts", "toy-code", "--limit", "6", "--max-new-tokens", "24", "--dtype", "fp32",
          "--eos", "ignore"]


@pytest.fixture(scope="module")
def pipeline(toy_tiny, tmp_path_factory):
    """The folders each command wrote (name -> path), each command's exit code checked."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MCSD_VLLM_IN_PROCESS", "1")
    root = tmp_path_factory.mktemp("vllm-pipeline")
    target = str(toy_tiny / "target")
    out = {name: root / name for name in ("trace", "profile.json", "schedule", "vllm.json",
                                          "eval")}
    try:
        assert main(["collect", "--engine", "vllm", "--vllm-method", "ngram:3:1:3", "--target",
                     target, *COMMON, "--batch-size", "2", "--out", str(out["trace"])]) == 0
        assert main(["profile", "--engine", "vllm", "--target", target, "--prompts", "toy-code",
                     "--limit", "2", "--batch-size", "1,2", "--draft-lengths", "0,1,2,3",
                     "--max-new-tokens", "24", "--dtype", "fp32",
                     "--out", str(out["profile.json"])]) == 0
        assert main(["train", "--decision", "schedule", "--runs", str(out["trace"]),
                     "--cost-profile", str(out["profile.json"]),
                     "--out", str(out["schedule"])]) == 0
        assert main(["export", str(out["schedule"]), "--engine", "vllm",
                     "--out", str(out["vllm.json"])]) == 0
        assert main(["eval", "--engine", "vllm", "--target", target, *COMMON, "--methods",
                     f"ar,table:{out['schedule']}", "--concurrency", "1,1+2",
                     "--out", str(out["eval"])]) == 0
    finally:
        mp.undo()
    return out


def test_the_trace_counts_vllm_steps(pipeline):
    from collect.traces import load_traces

    rows = load_traces(pipeline["trace"])
    assert set(rows["prompt_id"]) and rows["prompt_id"].nunique() == 6
    assert (rows["drafted"] <= 3).all() and (rows["accepted"] <= rows["drafted"]).all()
    assert (rows["num_spec_tokens"] == 3).all() and set(rows["method"]) == {"ngram"}
    for _, steps in rows.groupby("prompt_id"):  # steps numbered in order from 0
        assert list(steps["step"]) == list(range(len(steps)))
    # at most one verify step per committed token after the first
    assert rows.groupby("prompt_id").size().max() <= 23


def test_the_profile_times_every_point(pipeline):
    from mcsd_runtime.serving.engine_profile import EngineProfile

    profile = EngineProfile.load(pipeline["profile.json"])
    assert {(p.concurrency, p.k) for p in profile.points} == {
        (c, k) for c in (1, 2) for k in range(4)}
    assert all(p.step_seconds > 0 and p.steps > 0 for p in profile.points + profile.plain)
    assert [p.concurrency for p in profile.plain] == [1, 2]  # the engine without speculation
    assert profile.engine == "vllm" and profile.dtype == "float32"


def test_the_table_serves_in_vllm_and_changes_no_output(pipeline):
    exported = json.loads(pipeline["vllm.json"].read_text())
    table = exported["num_speculative_tokens_per_batch_size"]
    bands = list(zip(table, table[1:], strict=False))
    assert table[0][0] == 1 and all(b[0] == a[1] + 1 for a, b in bands)
    rows = json.loads((pipeline["eval"] / "concurrency.json").read_text())["rows"]
    assert {(r["concurrency"], r["method"].split(":")[0]) for r in rows} == {
        (c, m) for c in (1, "1+2") for m in ("ar", "table")}
    assert all(r["equal_to_ar"] == 1.0 for r in rows)
    # waves of 1 and 2 in turn: 6 prompts in 4 waves, each paired across the methods
    varying = [json.loads(line) for line in
               (pipeline["eval"] / "c1+2" / "per_prompt.jsonl").read_text().splitlines()]
    ar = sorted((r["batch_id"], r["prompt_id"]) for r in varying if r["method"] == "ar")
    assert len(ar) == 6 and len({w for w, _ in ar}) == 4
    assert sorted((r["batch_id"], r["prompt_id"]) for r in varying if r["method"] != "ar") == ar
    schedule = json.loads((pipeline["schedule"] / "schedule.json").read_text())
    assert schedule["meta"]["prompt_lookup_min"] == 1  # the matcher the trace ran
