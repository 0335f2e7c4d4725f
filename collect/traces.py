"""Engine traces: what a serving engine drafted and accepted at each verify step of each request.

A trace folder is a run folder of another kind than `collect.store`'s: no per-node features,
one row per (request, verify step), as an engine reports it (vLLM's
`--per-request-spec-decode-metrics detailed`, see `collect.vllm_log`).

    trace_dir/
      trace-000000.parquet    rows (TRACE_SCHEMA), at most ROWS_PER_FILE a file, in order
      manifest.json           written last: format, kind "engine-trace", engine, engine_version,
                              method, source, run_id, created, files, counts, summary

The folder is built beside its destination and renamed into place whole
(`mcsd_runtime.paths.build_folder`), so a failed write leaves no partial folder behind.

    rows_from_metrics(request_id, prompt_id, metrics, ...) -> list[dict]  one payload's rows
    write_traces(folder, rows, manifest, force=False) -> dict             the manifest written
    load_traces(folder) -> pandas.DataFrame;  load_trace_manifest(folder) -> dict
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mcsd_runtime.errors import MCSDError

FORMAT = "mcsd-engine-trace"
KIND = "engine-trace"
TRACE_SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
FILE_GLOB = "trace-*.parquet"
ROWS_PER_FILE = 1_000_000
INT16_MAX = 32767

# (column, pyarrow type name, nullable), in order; `trace_schema()` builds the Arrow schema.
COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("run_id", "string", False),
    ("request_id", "string", False),
    ("prompt_id", "string", False),
    ("prompt_hash", "string", True),  # collect.schema.prompt_hash of the prompt's token ids
    ("category", "string", True),
    ("step", "int32", False),  # verify step within the request, from 0
    ("drafted", "int16", False),  # draft tokens proposed at the step
    ("accepted", "int16", False),  # of them accepted by the target (the bonus token aside)
    ("batch_size", "int32", True),  # requests in the step, where the engine says
    ("engine", "string", False),  # "vllm"
    ("method", "string", False),  # "ngram", "draft_model", "eagle", "custom_class", ...
    ("num_spec_tokens", "int16", False),  # the configured most drafted per step (K)
)
COLUMN_NAMES = tuple(name for name, _, _ in COLUMNS)
DETAILED_HINT = ("start vLLM with --per-request-spec-decode-metrics detailed (offline: "
                 "LLM(..., per_request_spec_decode_metrics=\"detailed\"))")


def trace_schema():
    """The Arrow schema of a trace row (see COLUMNS)."""
    import pyarrow as pa

    return pa.schema([pa.field(name, getattr(pa, kind)(), nullable=nullable)
                      for name, kind, nullable in COLUMNS],
                     metadata={"trace_schema_version": str(TRACE_SCHEMA_VERSION)})


# --- one payload into rows ----------------------------------------------------------------------


def _count(value: Any, what: str, who: str, upper: int = INT16_MAX) -> int:
    """`value` as a count in [0, upper] (MCSDError naming `what` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= upper:
        raise MCSDError(f"{who}: {what} is {value!r}, not a whole number from 0 to {upper}")
    return value


def _per_step(metrics: Mapping[str, Any], who: str) -> tuple[list[int], list[int]] | None:
    """The payload's (accepted, drafted) per step, checked; None if it took no verify step."""
    accepted, drafted = metrics.get("per_step_accepted"), metrics.get("per_step_drafted")
    steps = metrics.get("num_spec_steps")
    if accepted is None and drafted is None:
        if steps == 0:  # vLLM leaves the arrays out when no step was taken
            return None
        if isinstance(steps, int) and steps > 0:
            raise MCSDError(f"{who}: the metrics are summary-level (num_spec_steps={steps}, no "
                            f"per_step_accepted/per_step_drafted); {DETAILED_HINT}")
        raise MCSDError(f"{who}: the metrics have no per_step_accepted and per_step_drafted; "
                        f"{DETAILED_HINT}")
    for name, seq in (("per_step_accepted", accepted), ("per_step_drafted", drafted)):
        if not isinstance(seq, list):
            raise MCSDError(f"{who}: {name} is {type(seq).__name__}, not a list of counts; "
                            f"{DETAILED_HINT}")
    if len(accepted) != len(drafted):
        raise MCSDError(f"{who}: per_step_accepted has {len(accepted)} steps but "
                        f"per_step_drafted {len(drafted)}; the payload is damaged or cut short")
    if isinstance(steps, int) and steps != len(accepted):
        raise MCSDError(f"{who}: num_spec_steps is {steps} but the per-step arrays hold "
                        f"{len(accepted)} steps; the payload is damaged or cut short")
    for step, (a, d) in enumerate(zip(accepted, drafted, strict=True)):
        _count(a, f"per_step_accepted[{step}]", who)
        _count(d, f"per_step_drafted[{step}]", who)
        if a > d:
            raise MCSDError(f"{who}: step {step} accepted {a} draft tokens of {d} drafted; "
                            f"accepted cannot exceed drafted")
    return accepted, drafted


def rows_from_metrics(request_id: str, prompt_id: str, metrics: Mapping[str, Any], *,
                      run_id: str, method: str, engine: str = "vllm",
                      category: str | None = None, prompt_tokens: Sequence[int] | None = None,
                      prompt_hash: str | None = None,
                      batch_sizes: Sequence[int | None] | None = None,
                      new_tokens: int | None = None) -> list[dict[str, Any]]:
    """The rows of one request from a `RequestSpecDecodeMetrics.to_dict()`-shaped payload
    (detailed level: per_step_accepted, per_step_drafted), in step order.

    vLLM logs only the steps that verified a draft. With `new_tokens`, the request's generated
    token count, the steps that drafted nothing (the n-gram matcher found no match) are added
    after the logged ones, as rows with drafted = accepted = 0: new_tokens - 1 (the prefill's
    token) less the tokens the logged steps committed. Without them a replay sees only the
    steps that drafted and overstates what speculation buys.

    `prompt_hash` defaults to `collect.schema.prompt_hash(prompt_tokens)` when the prompt's token
    ids are given; `batch_sizes`, when the engine reports them, has one entry per step. A payload
    whose request took no verify step gives no rows but its undrafted ones. MCSDError names what
    is wrong and the fix.
    """
    who = f"request {request_id}"
    if not isinstance(metrics, Mapping):
        raise MCSDError(f"{who}: the speculative-decoding metrics are "
                        f"{type(metrics).__name__}, not an object; {DETAILED_HINT}")
    k = _count(metrics.get("num_spec_tokens"), "num_spec_tokens", who)
    per_step = _per_step(metrics, who)
    accepted, drafted = per_step if per_step is not None else ([], [])
    if batch_sizes is not None and len(batch_sizes) != len(accepted):
        raise MCSDError(f"{who}: {len(batch_sizes)} batch sizes for {len(accepted)} steps")
    if prompt_hash is None and prompt_tokens is not None:
        from collect.schema import prompt_hash as hash_tokens

        prompt_hash = hash_tokens(prompt_tokens)
    base = {"run_id": str(run_id), "request_id": str(request_id), "prompt_id": str(prompt_id),
            "prompt_hash": prompt_hash, "category": category, "engine": engine,
            "method": method, "num_spec_tokens": k}
    rows = [base | {"step": step, "drafted": d, "accepted": a,
                    "batch_size": None if batch_sizes is None else batch_sizes[step]}
            for step, (a, d) in enumerate(zip(accepted, drafted, strict=True))]
    plain = _undrafted(new_tokens, accepted, who)
    return rows + [base | {"step": len(rows) + i, "drafted": 0, "accepted": 0,
                           "batch_size": None} for i in range(plain)]


def _undrafted(new_tokens: int | None, accepted: Sequence[int], who: str) -> int:
    """The steps that drafted nothing, of a request that generated `new_tokens` (0 unknown)."""
    if new_tokens is None:
        return 0
    plain = new_tokens - 1 - len(accepted) - sum(accepted)
    # the last step may overshoot: it verifies its drafts whole, and the output is cut at
    # max_tokens (or a stop token) by at most that step's accepted drafts
    if plain < -max(accepted, default=0):
        raise MCSDError(f"{who}: {new_tokens} generated tokens, but its verify steps alone "
                        f"committed {len(accepted) + sum(accepted)} after the first: the "
                        f"token count and the metrics are of different requests")
    return max(plain, 0)


# --- writing ------------------------------------------------------------------------------------


def describe_folder(folder: Path) -> str | None:
    """What an existing, non-empty `folder` holds, in words; None if it is missing or empty."""
    if not folder.exists():
        return None
    if not folder.is_dir():
        return "a file"
    names = sorted(p.name for p in folder.iterdir())
    if not names:
        return None
    kind = _manifest_kind(folder)
    if kind == KIND:
        return "an engine trace"
    if kind == "mcsd-collect-run":
        return "a node collection (mcsd collect)"
    return f"other files ({', '.join(names[:3])})"


def check_destination(folder: str | Path, force: bool = False) -> None:
    """MCSDError unless `folder` can be written: missing, empty, or (with `force`) a folder
    whose contents will be replaced. A file is never replaced."""
    folder = Path(folder)
    held = describe_folder(folder)
    if held == "a file":
        raise MCSDError(f"{folder} exists and is a file; choose another --out")
    if held is not None and not force:
        raise MCSDError(f"{folder} already holds {held}; choose another --out, or pass --force "
                        f"(force=True) to replace it")


def append_columns(cols: dict[str, list[Any]] | None,
                   rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Append `rows` to the column lists `cols` (new ones when None); returns `cols`. Columns
    hold a long log in far less memory than one dict per row."""
    if cols is None:
        cols = {name: [] for name in COLUMN_NAMES}
    for row in rows:
        for name in COLUMN_NAMES:
            cols[name].append(row.get(name))
    return cols


def _summary(table) -> tuple[dict[str, int], dict[str, float | None]]:
    """Counts and summary of a trace table (pyarrow)."""
    import pyarrow.compute as pc

    steps = table.num_rows
    drafted = int(pc.sum(table["drafted"]).as_py() or 0)
    accepted = int(pc.sum(table["accepted"]).as_py() or 0)
    requests = len(pc.unique(table["request_id"])) if steps else 0
    counts = {"requests_with_steps": requests, "steps": steps, "drafted_tokens": drafted,
              "accepted_tokens": accepted}
    summary = {"mean_accepted": accepted / steps if steps else None,
               "mean_drafted": drafted / steps if steps else None,
               "acceptance_rate": accepted / drafted if drafted else None,
               "mean_acceptance_length": 1 + accepted / steps if steps else None}
    return counts, summary


def write_traces(folder: str | Path, rows: Iterable[Mapping[str, Any]] | Any,
                 manifest: Mapping[str, Any], force: bool = False) -> dict[str, Any]:
    """Write `rows` (row mappings, or a pyarrow Table of TRACE_SCHEMA) as a trace folder.

    `manifest` gives at least `engine` and `source` (a log file's path or a live run's
    settings), and may give engine_version, method, run_id and counts (e.g. `requests`,
    including requests without a verify step); the format, kind, files, counts of the rows and
    their summary are added. The Parquet files are written first, manifest.json last, into a
    folder beside `folder` that is renamed into place. MCSDError if `folder` is not empty and
    `force` is off. Returns the manifest written."""
    import pyarrow as pa

    from mcsd_runtime.paths import build_folder

    for key in ("engine", "source"):
        if manifest.get(key) in (None, ""):
            raise MCSDError(f"a trace manifest needs {key!r}; pass it in the manifest")
    folder = Path(folder)
    check_destination(folder, force)
    schema = trace_schema()
    try:
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_pydict(
            append_columns(None, rows), schema=schema)
        table = table.select(list(COLUMN_NAMES))
        empty = [f.name for f in schema if not f.nullable and table[f.name].null_count]
        if empty:
            raise MCSDError(f"some rows lack {', '.join(empty)}")
        table = table.cast(schema)
    except (pa.ArrowException, KeyError, ValueError) as err:
        raise MCSDError(f"the trace rows do not fit the trace schema ({err}); build them with "
                        f"collect.traces.rows_from_metrics") from None
    counts, summary = _summary(table)
    fixed = {"format": FORMAT, "kind": KIND, "trace_schema_version": TRACE_SCHEMA_VERSION}
    full = {**fixed, "engine_version": None, **manifest, **fixed, "created": _now(),
            "columns": list(COLUMN_NAMES), "summary": summary}
    full["counts"] = counts | {"requests": counts["requests_with_steps"]} | dict(
        manifest.get("counts") or {})
    full.setdefault("run_id", folder.name)
    return build_folder(folder, "the engine trace", "choose another --out",
                        lambda staging: _write_files(staging, table, full))


def _write_files(staging: Path, table, manifest: dict[str, Any]) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from collect.store import TMP_PREFIX, atomic_write_bytes

    files = []
    for i, start in enumerate(range(0, max(table.num_rows, 1), ROWS_PER_FILE)):
        name = f"trace-{i:06d}.parquet"
        tmp = staging / f"{TMP_PREFIX}{name}"
        pq.write_table(table.slice(start, ROWS_PER_FILE), tmp, compression="zstd")
        tmp.replace(staging / name)
        files.append(name)
    manifest["files"] = files
    atomic_write_bytes(staging / MANIFEST, json.dumps(manifest, indent=2).encode())
    return manifest


def _now() -> str:
    from collect.store import now

    return now()


# --- reading ------------------------------------------------------------------------------------


def _manifest_kind(folder: Path) -> str | None:
    """The kind of run folder `folder` is by its manifest (KIND, "mcsd-collect-run"), or None."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    return manifest.get("kind") or manifest.get("format")


def load_trace_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest.json of a trace folder (MCSDError naming the folder when it is not one)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MCSDError(f"{folder} is not an engine trace folder: no such folder")
    path = folder / MANIFEST
    if not path.exists():
        raise MCSDError(f"{folder} is not an engine trace folder: it has no {MANIFEST} (a "
                        f"trace being written, or another kind of folder)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise MCSDError(f"{folder} is not an engine trace folder: cannot read {path} ({err})"
                        ) from None
    kind = _manifest_kind(folder)
    if kind == "mcsd-collect-run":
        raise MCSDError(f"{folder} is a node collection (one row per drafted node, from mcsd "
                        f"collect), not an engine trace; load it with collect.load_rows")
    if kind != KIND:
        raise MCSDError(f"{folder} is not an engine trace folder: its {MANIFEST} has kind "
                        f"{kind!r}, not {KIND!r}")
    return manifest


def load_traces(folder: str | Path):
    """Every row of a trace folder as a pandas DataFrame, in the order written (request, then
    step). MCSDError naming the folder when it is not a trace folder or a file is missing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    manifest = load_trace_manifest(folder)
    names = manifest.get("files") or sorted(p.name for p in folder.glob(FILE_GLOB))
    try:
        tables = [pq.read_table(folder / name) for name in names]
        table = pa.concat_tables(tables) if tables else trace_schema().empty_table()
    except (OSError, pa.ArrowException) as err:
        raise MCSDError(f"cannot read the engine trace in {folder} ({err}); write it again"
                        ) from None
    steps = (manifest.get("counts") or {}).get("steps")
    if steps is not None and steps != table.num_rows:
        raise MCSDError(f"the engine trace in {folder} has {table.num_rows} rows but its "
                        f"manifest counts {steps}; it was modified, write it again")
    frame = table.to_pandas()
    frame["batch_size"] = frame["batch_size"].astype("Int32")  # nullable: <NA>, not NaN
    return frame
