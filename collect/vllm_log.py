"""Import a JSONL log of vLLM server responses as an engine trace (`collect.traces`).

    mcsd collect --from-vllm-log responses.jsonl [--out DIR] [--force]

Each non-blank line of the file is one JSON object, in one of three shapes:

- a response as the server returned it: a completion (`/v1/completions`) or chat completion
  (`/v1/chat/completions`), or the final usage chunk of a streamed one (sent when the request
  asks for `stream_options: {"include_usage": true}`: vLLM puts the metrics on that chunk only);
- `{"request": REQUEST, "response": RESPONSE}`: a response beside the request that asked for it;
- a line of `vllm run-batch`'s output: `{"id", "custom_id", "response": {"status_code",
  "request_id", "body": RESPONSE}, "error"}`.

The response must carry `metrics.speculative_decoding` at the detailed level (a server started
with `--per-request-spec-decode-metrics detailed`; vLLM reports it only for requests with one
prompt and n == 1). Each request's rows take:

- request_id: the response's `id`;
- prompt_id: the line's top-level `"prompt_id"`, else run-batch's `custom_id`, else the
  response's `id`;
- category: the line's top-level `"category"`, else its `"metadata": {"category": ...}`, else
  the request's `metadata.category`; none if absent;
- prompt_hash: of the prompt's token ids when the response holds them (a request with
  `"return_token_ids": true`: `prompt_token_ids` of a chat response, of a completion's choice),
  or when a completion request's `prompt` is a list of token ids;
- method: the line's top-level `"method"` (vLLM's responses do not name it), else "unknown";
- the steps that drafted nothing (vLLM logs only those that verified a draft): placed from the
  response's `usage.completion_tokens`, as rows with drafted = accepted = 0.

The engine version comes from the responses' `system_fingerprint` (`vllm-<version>-...`) when
all agree. Any bad line stops the import with its line number, what is missing and the fix,
before anything is written.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from collect.traces import append_columns, rows_from_metrics
from mcsd_runtime.errors import MCSDError

ENGINE = "vllm"
LARGE_BYTES = 8 << 20  # a progress bar for logs over 8 MiB
SERVER_HINT = ("start the server with a --speculative-config and "
               "--per-request-spec-decode-metrics detailed")
FINGERPRINT = re.compile(r"^vllm-(\d[^-]*)")


def read_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number from 1, JSON object) of every non-blank line; MCSDError on a bad one."""
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as err:
                raise MCSDError(f"{path} line {number}: not valid JSON ({err}); each line must be "
                                f"one vLLM response object") from None
            if not isinstance(obj, dict):
                raise MCSDError(f"{path} line {number}: a JSON {type(obj).__name__}, not an "
                                f"object; each line must be one vLLM response object")
            yield number, obj


def unwrap(obj: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(response, request or None) of a line in any of the module's three shapes."""
    response: Any = obj
    if "response" in obj or "custom_id" in obj:
        response = obj.get("response")
        if isinstance(response, dict) and "body" in response:  # vllm run-batch
            status = response.get("status_code", 200)
            if status != 200:
                raise MCSDError(f"{where}: the request failed (status {status}); drop failed "
                                f"requests from the log")
            response = response.get("body")
    if not isinstance(response, dict):
        error = obj.get("error")
        raise MCSDError(f"{where}: no response object" + (f" (error: {_text(error)})" if error
                                                          else "") +
                        "; each line must hold one vLLM response, see collect.vllm_log")
    if response.get("error") is not None or response.get("object") == "error":
        raise MCSDError(f"{where}: an error response ({_text(response.get('error') or response)})"
                        f", not a completion; drop failed requests from the log")
    request = obj.get("request")
    return response, request if isinstance(request, dict) else None


def completion_tokens(response: dict[str, Any]) -> int | None:
    """The response's generated tokens (`usage.completion_tokens`), which place the steps that
    drafted nothing (`collect.traces.rows_from_metrics`); None where it does not say."""
    usage = response.get("usage")
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def spec_metrics(response: dict[str, Any], where: str) -> dict[str, Any]:
    """The response's `metrics.speculative_decoding`; MCSDError naming what is missing and why."""
    metrics = response.get("metrics")
    choices = response.get("choices")
    n = len(choices) if isinstance(choices, list) else 0
    if not isinstance(metrics, dict):
        field = "metrics" if metrics is None else f"metrics ({type(metrics).__name__})"
        why = (f" vLLM leaves them out of a response with {n} choices (it reports them only for "
               f"n == 1 and one prompt)." if n > 1 else "")
        if str(response.get("object", "")).endswith(".chunk") or _is_delta(choices):
            why += (" A streamed response carries them on its final usage chunk only: send "
                    "stream_options {\"include_usage\": true} and log that chunk.")
        raise MCSDError(f"{where}: the response has no {field}.{why} Fix: {SERVER_HINT}, and "
                        f"log each response whole")
    spec = metrics.get("speculative_decoding")
    if not isinstance(spec, dict):
        raise MCSDError(f"{where}: the response has no metrics.speculative_decoding (the server "
                        f"ran without speculative decoding or without per-request spec-decode "
                        f"metrics); {SERVER_HINT}")
    return spec


def _is_delta(choices: Any) -> bool:
    return isinstance(choices, list) and any(isinstance(c, dict) and "delta" in c
                                             for c in choices)


def _text(value: Any) -> str:
    if isinstance(value, dict):
        value = value.get("message", value)
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 200 else text[:197] + "..."


def prompt_tokens(response: dict[str, Any], request: dict[str, Any] | None) -> list[int] | None:
    """The prompt's token ids where the line holds them (see the module's doc), else None."""
    candidates = [response.get("prompt_token_ids")]
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        candidates.append(choices[0].get("prompt_token_ids"))
    if request is not None:
        candidates.append(request.get("prompt"))
    for ids in candidates:
        if isinstance(ids, list) and ids and all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return ids
    return None


def _label(value: Any, what: str, where: str) -> str | None:
    """A label (id, category, method) as text; MCSDError for an object or a list."""
    if value is None:
        return None
    if isinstance(value, dict | list):
        raise MCSDError(f"{where}: {what} is a JSON {type(value).__name__}; give it as text")
    return str(value)


def line_labels(obj: dict[str, Any], response: dict[str, Any], request: dict[str, Any] | None,
                where: str) -> dict[str, str | None]:
    """request_id, prompt_id, category and method of a line (see the module's doc)."""
    request_id = _label(response.get("id"), "the response's id", where)
    if request_id is None and isinstance(obj.get("response"), dict):
        request_id = _label(obj["response"].get("request_id"), "request_id", where)
    if not request_id:
        raise MCSDError(f"{where}: the response has no id; log the server's response unchanged")
    prompt_id = _label(obj.get("prompt_id"), "prompt_id", where) or \
        _label(obj.get("custom_id"), "custom_id", where) or request_id
    category = obj.get("category")
    for meta in (obj.get("metadata"), (request or {}).get("metadata")):
        if category is None and isinstance(meta, dict):
            category = meta.get("category")
    return {"request_id": request_id, "prompt_id": prompt_id,
            "category": _label(category, "category", where),
            "method": _label(obj.get("method"), "method", where) or "unknown"}


def _line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def _check_file(path: Path) -> None:
    if not path.exists():
        raise MCSDError(f"--from-vllm-log {path}: no such file")
    if not path.is_file():
        raise MCSDError(f"--from-vllm-log {path} is not a file; give a JSONL file of vLLM "
                        f"responses")


class LogReader:
    """Reads a log line by line into trace columns, checking each line; see the module doc."""

    def __init__(self, path: Path, run_id: str) -> None:
        self.path, self.run_id = path, run_id
        self.cols: dict[str, list[Any]] = append_columns(None, [])
        self.lines_of: dict[str, int] = {}  # request id -> its line
        self.fingerprints: set[str] = set()
        self.methods: set[str] = set()

    def add(self, number: int, obj: dict[str, Any]) -> None:
        """One line's rows (MCSDError naming the line if it is bad)."""
        where = f"{self.path} line {number}"
        response, request = unwrap(obj, where)
        labels = line_labels(obj, response, request, where)
        rid = labels["request_id"]
        if rid in self.lines_of:
            raise MCSDError(f"{where}: repeats the response id {rid} of line "
                            f"{self.lines_of[rid]}; log each response once")
        spec = spec_metrics(response, where)
        try:
            rows = rows_from_metrics(rid, labels["prompt_id"], spec, run_id=self.run_id,
                                     method=labels["method"], engine=ENGINE,
                                     category=labels["category"],
                                     prompt_tokens=prompt_tokens(response, request),
                                     new_tokens=completion_tokens(response))
        except MCSDError as err:
            raise MCSDError(f"{where}: {err}") from None
        self.lines_of[rid] = number
        self.methods.add(labels["method"])
        if isinstance(response.get("system_fingerprint"), str):
            self.fingerprints.add(response["system_fingerprint"])
        append_columns(self.cols, rows)

    def read(self, show_progress: bool = True) -> None:
        """Every line of the file, with a progress bar when it is large."""
        from mcsd_runtime.progress import progress

        large = show_progress and self.path.stat().st_size > LARGE_BYTES
        total = _line_count(self.path) if large else None
        with progress(total=total, desc=f"reading {self.path.name}", unit="line",
                      disable=not large) as bar:
            last = 0
            for number, obj in read_lines(self.path):
                self.add(number, obj)
                bar.update(number - last)
                last = number
            bar.update(max((total or last) - last, 0))  # blank lines at the end
        if not self.lines_of:
            raise MCSDError(f"{self.path} holds no responses; log one vLLM response per line")

    def engine_version(self) -> str | None:
        versions = {m.group(1) for f in self.fingerprints if (m := FINGERPRINT.match(f))}
        return versions.pop() if len(versions) == 1 else None


def import_vllm_log(path: str | Path, out: str | Path, force: bool = False,
                    run_id: str | None = None, show_progress: bool = True) -> dict[str, Any]:
    """Read the JSONL log `path` (see the module's doc) and write its rows as a trace folder
    `out` (`collect.traces.write_traces`); returns the manifest. Every line is checked before
    anything is written, so a bad line leaves no folder behind."""
    import pyarrow as pa

    from collect.traces import check_destination, trace_schema, write_traces
    from mcsd_runtime.paths import file_sha256

    path, out = Path(path), Path(out)
    _check_file(path)
    check_destination(out, force)  # before reading a long log
    reader = LogReader(path, run_id or out.name)
    reader.read(show_progress)
    table = pa.Table.from_pydict(reader.cols, schema=trace_schema())
    methods = sorted(reader.methods)
    manifest = {
        "engine": ENGINE, "engine_version": reader.engine_version(),
        "method": methods[0] if len(methods) == 1 else methods, "run_id": run_id or out.name,
        "source": {"type": "vllm-log", "path": str(path.resolve()),
                   "sha256": file_sha256(path), "responses": len(reader.lines_of)},
        "system_fingerprints": sorted(reader.fingerprints)[:10],
        "counts": {"requests": len(reader.lines_of)},
    }
    return write_traces(out, table, manifest, force=force)


def format_summary(manifest: Mapping[str, Any]) -> str:
    """Requests, steps, mean accepted per step and acceptance rate of a trace's manifest."""
    counts, summary = manifest["counts"], manifest["summary"]
    line = (f"engine trace ({manifest['engine']} {manifest.get('engine_version') or ''}".rstrip()
            + f"): {counts['requests']} requests, {counts['steps']} steps")
    if counts["steps"]:
        line += (f", mean accepted per step {summary['mean_accepted']:.3f} of "
                 f"{summary['mean_drafted']:.3f} drafted, acceptance rate "
                 f"{summary['acceptance_rate'] or 0:.3f}")
    if counts["requests_with_steps"] < counts["requests"]:
        line += f" ({counts['requests'] - counts['requests_with_steps']} requests without a step)"
    return line


def default_out(path: Path) -> Path:
    """`$MCSD_DATA/runs/trace-vllm-<file stem>`."""
    from mcsd_runtime.paths import runs_dir

    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-.")[-40:] or "log"
    return runs_dir() / f"trace-vllm-{stem}"


def run_from_args(args: argparse.Namespace) -> int:
    """`mcsd collect --from-vllm-log FILE [--out DIR] [--force] [--run-id ID]`."""
    from mcsd_runtime.extras import require_toolkit

    require_toolkit("mcsd collect --from-vllm-log", "pyarrow")
    path = Path(args.from_vllm_log)
    out = Path(args.out) if args.out else default_out(path)
    manifest = import_vllm_log(path, out, force=args.force, run_id=args.run_id,
                               show_progress=not args.no_progress)
    print(format_summary(manifest))
    print(f"rows in {out} (collect.traces.load_traces)")
    return 0
