"""Engine traces (collect.traces) and their import from a vLLM response log (collect.vllm_log,
`mcsd collect --from-vllm-log`).

The vLLM tests build their payloads and responses with vLLM's own classes and are skipped where
vLLM is not installed: `/work/vv/bin/python -m pytest -p no:xdist -q tests/test_traces.py`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collect import traces
from collect.traces import (
    COLUMN_NAMES,
    load_trace_manifest,
    load_traces,
    rows_from_metrics,
    write_traces,
)
from mcsd_runtime.cli import main as mcsd
from mcsd_runtime.errors import MCSDError

K = 4
FINGERPRINT = "vllm-0.32.0-abcd1234"


def payload(accepted: list[int], drafted: list[int], k: int = K,
            detailed: bool = True) -> dict[str, Any]:
    """A `RequestSpecDecodeMetrics.to_dict()`-shaped payload, written by hand."""
    hist = [0] * (k + 1)
    for a in accepted:
        hist[a] += 1
    out: dict[str, Any] = {
        "mean_acceptance_length": 1 + sum(accepted) / len(accepted) if accepted else 1.0,
        "draft_acceptance_rate": sum(accepted) / sum(drafted) if sum(drafted) else 0.0,
        "acceptance_histogram": hist, "num_spec_steps": len(accepted),
        "num_accepted_draft_tokens": sum(accepted), "num_draft_tokens": sum(drafted),
        "num_spec_tokens": k}
    if detailed and accepted:
        out |= {"per_step_accepted": list(accepted), "per_step_drafted": list(drafted)}
    return out


def rows(request_id: str, accepted: list[int], drafted: list[int], **kw: Any) -> list[dict]:
    kw = {"run_id": "r", "method": "ngram"} | kw
    return rows_from_metrics(request_id, f"p-{request_id}", payload(accepted, drafted), **kw)


# --- rows_from_metrics --------------------------------------------------------------------------


def test_rows_from_metrics_gives_one_row_per_verify_step_in_order() -> None:
    from collect.schema import prompt_hash

    got = rows("a", [2, 0, 4], [4, 3, 4], category="code", prompt_tokens=[5, 6, 7],
               batch_sizes=[8, 7, None])
    assert [(r["step"], r["accepted"], r["drafted"], r["batch_size"]) for r in got] == \
        [(0, 2, 4, 8), (1, 0, 3, 7), (2, 4, 4, None)]
    assert all(set(r) == set(COLUMN_NAMES) for r in got)
    first = got[0]
    assert (first["request_id"], first["prompt_id"], first["category"], first["engine"],
            first["method"], first["num_spec_tokens"], first["run_id"]) == \
        ("a", "p-a", "code", "vllm", "ngram", K, "r")
    assert first["prompt_hash"] == prompt_hash([5, 6, 7]) != prompt_hash([5, 6, 8])
    assert rows("b", [1], [4])[0]["prompt_hash"] is None


def test_a_request_without_a_verify_step_gives_no_rows() -> None:
    assert rows("a", [], []) == []


@pytest.mark.parametrize("metrics, message", [
    (payload([1, 2], [4, 4], detailed=False), "summary-level.*--per-request-spec-decode-metrics "
                                              "detailed"),
    ({"num_spec_tokens": K}, "no per_step_accepted and per_step_drafted.*detailed"),
    (payload([1, 2], [4, 4]) | {"per_step_drafted": [4]}, "2 steps but per_step_drafted 1"),
    (payload([1, 2], [4, 4]) | {"per_step_drafted": None}, "per_step_drafted is NoneType"),
    (payload([1, 2], [4, 4]) | {"num_spec_steps": 3}, "num_spec_steps is 3 but .* 2 steps"),
    (payload([3, 2], [2, 4]), "step 0 accepted 3 draft tokens of 2 drafted"),
    (payload([1, 2], [4, 4]) | {"per_step_accepted": [1, -1]}, r"per_step_accepted\[1\] is -1"),
    (payload([1, 2], [4, 4]) | {"per_step_drafted": [4, 4.0]}, r"per_step_drafted\[1\] is 4.0"),
    (payload([1], [4]) | {"per_step_accepted": [True]}, r"per_step_accepted\[0\] is True"),
    (payload([1], [4]) | {"num_spec_tokens": None}, "num_spec_tokens is None"),
    ([1, 2], "not an object"),
])
def test_rows_from_metrics_refuses_bad_payloads(metrics, message) -> None:
    with pytest.raises(MCSDError, match=f"request x: .*{message}"):
        rows_from_metrics("x", "p", metrics, run_id="r", method="ngram")


def test_batch_sizes_must_match_the_steps() -> None:
    with pytest.raises(MCSDError, match="1 batch sizes for 2 steps"):
        rows("a", [1, 2], [4, 4], batch_sizes=[3])


def vllm_metrics(steps: list[tuple[int, int]], detailed: bool = True) -> dict[str, Any]:
    """vLLM's own payload: RequestSpecDecodeMetrics over (drafted, accepted) steps."""
    stats = pytest.importorskip("vllm.v1.metrics.stats")
    m = stats.RequestSpecDecodeMetrics.new(K)
    for drafted, accepted in steps:
        m.observe(num_draft_tokens=drafted, num_accepted=accepted, detailed=detailed)
    return m.to_dict()


STEPS = [(4, 4), (4, 0), (3, 2), (4, 1)]


def test_rows_from_vllm_own_metrics() -> None:
    metrics = vllm_metrics(STEPS)
    got = rows_from_metrics("cmpl-1", "q1", metrics, run_id="r", method="draft_model")
    assert [(r["drafted"], r["accepted"]) for r in got] == STEPS
    assert sum(r["accepted"] for r in got) == metrics["num_accepted_draft_tokens"] == 7
    assert {r["num_spec_tokens"] for r in got} == {K}
    with pytest.raises(MCSDError, match="summary-level.*detailed"):
        rows_from_metrics("cmpl-1", "q1", vllm_metrics(STEPS, detailed=False), run_id="r",
                          method="draft_model")
    assert rows_from_metrics("c", "q", vllm_metrics([]), run_id="r", method="ngram") == []


# --- write_traces / load_traces -----------------------------------------------------------------


def sample_rows() -> list[dict]:
    return (rows("a", [2, 0, 4], [4, 3, 4], batch_sizes=[8, 7, 6], category="code",
                 prompt_tokens=[1, 2])
            + rows("b", [1, 1], [4, 2], method="custom_class"))


MANIFEST = {"engine": "vllm", "engine_version": "0.32.0", "source": {"type": "test"}}


def test_write_then_load_round_trip(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(traces, "ROWS_PER_FILE", 2)  # three files, read back in order
    out = tmp_path / "trace"
    manifest = write_traces(out, sample_rows(), MANIFEST)
    assert manifest["files"] == [f"trace-{i:06d}.parquet" for i in range(3)]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *manifest["files"]]
    df = load_traces(out)
    assert list(df.columns) == list(COLUMN_NAMES)
    assert {c: str(df[c].dtype) for c in ("step", "drafted", "accepted", "batch_size",
                                          "num_spec_tokens")} == \
        {"step": "int32", "drafted": "int16", "accepted": "int16", "batch_size": "Int32",
         "num_spec_tokens": "int16"}
    assert df[["request_id", "step", "accepted", "drafted"]].values.tolist() == \
        [["a", 0, 2, 4], ["a", 1, 0, 3], ["a", 2, 4, 4], ["b", 0, 1, 4], ["b", 1, 1, 2]]
    assert df["batch_size"].isna().tolist() == [False] * 3 + [True] * 2
    assert df["category"].isna().tolist() == [False] * 3 + [True] * 2
    assert df["method"].tolist() == ["ngram"] * 3 + ["custom_class"] * 2
    disk = load_trace_manifest(out)
    assert disk == json.loads((out / "manifest.json").read_text())
    assert (disk["kind"], disk["engine"], disk["engine_version"], disk["run_id"]) == \
        ("engine-trace", "vllm", "0.32.0", "trace")
    assert disk["counts"] | {} == {"requests": 2, "requests_with_steps": 2, "steps": 5,
                                   "drafted_tokens": 17, "accepted_tokens": 8}
    assert disk["summary"]["acceptance_rate"] == pytest.approx(8 / 17)
    assert disk["summary"]["mean_accepted"] == pytest.approx(8 / 5)


def test_an_empty_trace_loads_with_its_columns(tmp_path: Path) -> None:
    write_traces(tmp_path / "t", [], MANIFEST | {"counts": {"requests": 3}})
    df = load_traces(tmp_path / "t")
    assert len(df) == 0 and list(df.columns) == list(COLUMN_NAMES)
    assert load_trace_manifest(tmp_path / "t")["counts"]["requests"] == 3


def test_write_refuses_a_folder_that_holds_something(tmp_path: Path) -> None:
    out = tmp_path / "t"
    out.mkdir()  # an empty folder is taken
    write_traces(out, sample_rows(), MANIFEST)
    with pytest.raises(MCSDError, match="already holds an engine trace.*--force"):
        write_traces(out, sample_rows()[:1], MANIFEST)
    assert len(load_traces(out)) == 5  # untouched
    write_traces(out, sample_rows()[:1], MANIFEST, force=True)
    assert len(load_traces(out)) == 1
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    with pytest.raises(MCSDError, match=r"other files \(notes.txt\)"):
        write_traces(other, [], MANIFEST)
    (tmp_path / "file").write_text("x")
    with pytest.raises(MCSDError, match="is a file"):
        write_traces(tmp_path / "file", [], MANIFEST, force=True)


def test_write_checks_the_manifest_and_the_rows(tmp_path: Path) -> None:
    with pytest.raises(MCSDError, match="needs 'source'"):
        write_traces(tmp_path / "t", [], {"engine": "vllm"})
    written = write_traces(tmp_path / "k", [], MANIFEST | {"kind": "other", "format": "x"})
    assert (written["kind"], written["format"]) == ("engine-trace", "mcsd-engine-trace")
    bad = [sample_rows()[0] | {"request_id": None}]
    with pytest.raises(MCSDError, match="lack request_id"):
        write_traces(tmp_path / "t", bad, MANIFEST)
    assert not (tmp_path / "t").exists()


def test_a_failed_write_leaves_no_folder(tmp_path: Path, monkeypatch) -> None:
    def fail(staging: Path, *_: Any) -> None:
        (staging / "trace-000000.parquet").write_text("half")
        raise OSError("disk full")

    monkeypatch.setattr(traces, "_write_files", fail)
    with pytest.raises(OSError, match="disk full"):
        write_traces(tmp_path / "t", sample_rows(), MANIFEST)
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its staging copy


def test_load_names_the_folder_and_what_it_is(tmp_path: Path) -> None:
    with pytest.raises(MCSDError, match=f"{tmp_path / 'none'} is not an engine trace folder"):
        load_traces(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MCSDError, match="empty is not an engine trace folder: it has no "
                                        "manifest.json"):
        load_traces(tmp_path / "empty")
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    (nodes / "manifest.json").write_text(json.dumps({"format": "mcsd-collect-run"}))
    with pytest.raises(MCSDError, match="nodes is a node collection.*collect.load_rows"):
        load_traces(nodes)
    write_traces(tmp_path / "t", sample_rows(), MANIFEST)
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    manifest["counts"]["steps"] = 4
    (tmp_path / "t" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(MCSDError, match="has 5 rows but its manifest counts 4"):
        load_traces(tmp_path / "t")


# --- mcsd collect --from-vllm-log ---------------------------------------------------------------


UNDRAFTED = 2  # steps that drafted nothing in each `completion` fixture, per its usage


def completion(rid: str, metrics: dict | None, **extra: Any) -> dict[str, Any]:
    """A non-streamed /v1/completions response as the server returns it (nulls included); its
    usage counts the tokens of its verify steps and of UNDRAFTED steps that drafted nothing."""
    accepted = (metrics or {}).get("per_step_accepted") or []
    tokens = 1 + len(accepted) + sum(accepted) + UNDRAFTED
    return {"id": rid, "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": "x", "finish_reason": "length",
                         "prompt_token_ids": None}],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens,
                      "total_tokens": 3 + tokens},
            "system_fingerprint": FINGERPRINT,
            "metrics": None if metrics is None else {"time_to_first_token_ms": None,
                                                     "speculative_decoding": metrics}} | extra


def log_lines() -> list[dict[str, Any]]:
    """The three shapes of a line: a response, a request/response pair, a run-batch line; a
    chat response with its prompt's token ids; a streamed final usage chunk; a response of a
    request that took no verify step."""
    chat = {"id": "chatcmpl-2", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
            "prompt_token_ids": [7, 8, 9],
            "metrics": {"speculative_decoding": payload([0, 3], [4, 4])}}
    chunk = {"id": "chatcmpl-4", "object": "chat.completion.chunk", "model": "m", "choices": [],
             "metrics": {"speculative_decoding": payload([4], [4])}}
    return [
        completion("cmpl-1", payload([2, 1, 4], [4, 4, 4]), category="code", method="ngram"),
        {"request": {"model": "m", "messages": [], "metadata": {"category": "chat"}},
         "response": chat},
        {"id": "batch_req_3", "custom_id": "q3",
         "response": {"status_code": 200, "request_id": "cmpl-3",
                      "body": completion("cmpl-3", payload([1], [2]))}, "error": None},
        chunk,
        completion("cmpl-5", payload([], [])),
    ]


def write_log(path: Path, lines: list[Any], blank: bool = True) -> Path:
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    path.write_text(text + ("\n\n" if blank else "\n"))
    return path


def test_import_a_vllm_log_through_the_cli(tmp_path: Path, capsys) -> None:
    from collect.schema import prompt_hash

    log = write_log(tmp_path / "responses.jsonl", log_lines())
    out = tmp_path / "runs" / "trace"
    assert mcsd(["collect", "--from-vllm-log", str(log), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    # the completions' usage places 2 undrafted steps each (cmpl-5's are its only ones); the
    # chat response and the streamed chunk carry no usage: their verify steps alone
    assert "5 requests, 13 steps" in printed and "without a step" not in printed
    assert "mean accepted per step 1.154 of 2.000 drafted, acceptance rate 0.577" in printed
    df = load_traces(out)
    by_request = df.groupby("request_id", sort=False)
    assert list(by_request.groups) == ["cmpl-1", "chatcmpl-2", "cmpl-3", "chatcmpl-4", "cmpl-5"]
    assert by_request["accepted"].apply(list).tolist() == [
        [2, 1, 4, 0, 0], [0, 3], [1, 0, 0], [4], [0, 0]]
    assert by_request["drafted"].apply(list).tolist()[2] == [2, 0, 0]
    first = df.drop_duplicates("request_id").set_index("request_id")
    assert first["prompt_id"].tolist() == ["cmpl-1", "chatcmpl-2", "q3", "chatcmpl-4", "cmpl-5"]
    assert first["category"].tolist()[:2] == ["code", "chat"]
    assert first["category"].isna().tolist()[2:] == [True, True, True]
    assert first["method"].tolist() == ["ngram", "unknown", "unknown", "unknown", "unknown"]
    assert first.loc["chatcmpl-2", "prompt_hash"] == prompt_hash([7, 8, 9])
    assert first["prompt_hash"].isna().tolist() == [True, False, True, True, True]
    assert set(df["run_id"]) == {"trace"} and set(df["engine"]) == {"vllm"}
    manifest = load_trace_manifest(out)
    assert manifest["engine_version"] == "0.32.0"
    assert manifest["method"] == ["ngram", "unknown"]
    assert manifest["source"]["path"] == str(log.resolve())
    assert manifest["counts"]["requests"] == 5 and manifest["counts"]["steps"] == 13


def test_import_refuses_an_existing_folder_unless_forced(tmp_path: Path, capsys) -> None:
    log = write_log(tmp_path / "log.jsonl", log_lines()[:1])
    out = tmp_path / "t"
    argv = ["collect", "--from-vllm-log", str(log), "--out", str(out), "--no-progress"]
    assert mcsd(argv) == 0
    write_log(log, log_lines()[1:2])
    assert mcsd(argv) == 2
    assert "already holds an engine trace" in capsys.readouterr().err
    assert load_traces(out)["request_id"].unique().tolist() == ["cmpl-1"]
    assert mcsd([*argv, "--force"]) == 0
    assert load_traces(out)["request_id"].unique().tolist() == ["chatcmpl-2"]


def test_import_shows_progress_on_a_large_log(tmp_path: Path, capsys, monkeypatch) -> None:
    from collect import vllm_log

    monkeypatch.setattr(vllm_log, "LARGE_BYTES", 0)
    log = write_log(tmp_path / "log.jsonl", log_lines())
    assert mcsd(["collect", "--from-vllm-log", str(log), "--out", str(tmp_path / "t")]) == 0
    err = capsys.readouterr().err  # not a terminal: lines, not a bar
    assert "reading log.jsonl: 6 lines, started" in err and "6/6 lines (100%)" in err, err


GOOD = completion("cmpl-0", payload([1], [4]))
BAD_LOGS = {
    "missing metrics": ([GOOD, completion("cmpl-1", None)],
                        r"line 2: the response has no metrics\. Fix: start the server with a "
                        r"--speculative-config and --per-request-spec-decode-metrics detailed"),
    "n > 1": ([completion("cmpl-1", None, choices=[{"index": 0}, {"index": 1}])],
              "line 1: the response has no metrics. vLLM leaves them out of a response with 2 "
              "choices"),
    "no speculative_decoding": ([completion("cmpl-1", None) | {"metrics": {"mean_itl_ms": 1.0}}],
                                "line 1: the response has no metrics.speculative_decoding"),
    "streamed chunk without metrics": (
        [{"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}}]}],
        "final usage chunk only: send stream_options"),
    "summary-only": ([GOOD, GOOD | {"id": "cmpl-2"},
                      completion("cmpl-3", payload([1, 2], [4, 4], detailed=False))],
                     "line 3: request cmpl-3: the metrics are summary-level .*start vLLM with "
                     "--per-request-spec-decode-metrics detailed"),
    "mismatched lengths": ([completion("cmpl-1", payload([1, 2], [4, 4])
                                       | {"per_step_drafted": [4, 4, 4]})],
                           "line 1: request cmpl-1: per_step_accepted has 2 steps but "
                           "per_step_drafted 3"),
    "malformed JSON": ([GOOD, '{"id": "cmpl-1", "metrics": '],
                       "line 2: not valid JSON .*one vLLM response object"),
    "not an object": ([[GOOD]], "line 1: a JSON list, not an object"),
    "error response": ([{"error": {"message": "model not found", "code": 404}}],
                       "line 1: an error response .model not found., not a completion"),
    "failed batch line": ([{"id": "b", "custom_id": "q", "response": None,
                            "error": {"message": "boom"}}],
                          r"line 1: no response object \(error: boom\)"),
    "batch status": ([{"id": "b", "custom_id": "q", "response": {"status_code": 400,
                                                                 "body": {"x": 1}}}],
                     r"line 1: the request failed \(status 400\)"),
    "repeated id": ([GOOD, GOOD], "line 2: repeats the response id cmpl-0 of line 1"),
    "no id": ([completion("cmpl-1", payload([1], [4]), id=None)], "line 1: the response has no "
                                                                  "id"),
    "empty": ([], "holds no responses"),
}


@pytest.mark.parametrize("case", sorted(BAD_LOGS))
def test_a_bad_log_is_refused_with_its_line_and_fix(case: str, tmp_path: Path, capsys) -> None:
    lines, message = BAD_LOGS[case]
    log = write_log(tmp_path / "log.jsonl", lines, blank=False)
    out = tmp_path / "runs" / "t"
    assert mcsd(["collect", "--from-vllm-log", str(log), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("mcsd: error: ")
    if case != "empty":
        assert f"{log} line" in err
    import re

    assert re.search(message, err), err
    assert not out.exists() and not (tmp_path / "runs").exists()


def test_a_missing_log_file_is_named(tmp_path: Path, capsys) -> None:
    assert mcsd(["collect", "--from-vllm-log", str(tmp_path / "none.jsonl"), "--out",
                 str(tmp_path / "t")]) == 2
    assert "none.jsonl: no such file" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


# --- vLLM's own response classes ----------------------------------------------------------------


def test_import_responses_serialized_by_vllm(tmp_path: Path, capsys) -> None:
    """Responses built and serialized as vLLM's server does (the non-streamed body with
    `model_dump()`, the final usage chunk with `exclude_none`), imported through the CLI."""
    vllm_metrics([])  # skips without vLLM
    from vllm.entrypoints.generate.base.protocol import (
        PerRequestMetrics,
        SpeculativeDecodingMetrics,
    )
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionStreamResponse
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponse,
        CompletionResponseChoice,
    )
    from vllm.entrypoints.serve.engine.protocol import UsageInfo

    def spec(steps, detailed=True):
        return PerRequestMetrics(speculative_decoding=SpeculativeDecodingMetrics(
            **vllm_metrics(steps, detailed)))

    def usage(steps, undrafted):  # the tokens the steps commit, the first, and undrafted steps
        tokens = 1 + sum(1 + a for _, a in steps) + undrafted
        return UsageInfo(prompt_tokens=2, completion_tokens=tokens, total_tokens=2 + tokens)

    body = CompletionResponse(id="cmpl-a", model="m", usage=usage(STEPS, 1),
                              system_fingerprint=FINGERPRINT,
                              choices=[CompletionResponseChoice(index=0, text="x",
                                                                prompt_token_ids=[3, 4])],
                              metrics=spec(STEPS))
    chunk = ChatCompletionStreamResponse(id="chatcmpl-b", model="m", choices=[],
                                         usage=usage(STEPS[:2], 0),
                                         metrics=spec(STEPS[:2]))
    summary = body.model_copy(update={"id": "cmpl-c", "metrics": spec(STEPS, detailed=False)})
    log = write_log(tmp_path / "log.jsonl", [
        body.model_dump(), json.loads(chunk.model_dump_json(exclude_unset=True,
                                                            exclude_none=True))])
    out = tmp_path / "t"
    assert mcsd(["collect", "--from-vllm-log", str(log), "--out", str(out)]) == 0
    assert "2 requests, 7 steps" in capsys.readouterr().out  # cmpl-a's undrafted one too
    import pyarrow.parquet as pq

    got = pq.read_table(out / "trace-000000.parquet").to_pylist()
    assert [(r["request_id"], r["drafted"], r["accepted"]) for r in got] == \
        [("cmpl-a", d, a) for d, a in STEPS] + [("cmpl-a", 0, 0)] + \
        [("chatcmpl-b", d, a) for d, a in STEPS[:2]]
    assert got[0]["num_spec_tokens"] == K and got[0]["prompt_hash"] is not None
    write_log(log, [summary.model_dump()])
    assert mcsd(["collect", "--from-vllm-log", str(log), "--out", str(tmp_path / "s")]) == 2
    assert "summary-level" in capsys.readouterr().err and not (tmp_path / "s").exists()
