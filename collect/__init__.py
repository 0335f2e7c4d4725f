"""collect: run the MCSD decoder over prompt sets and log one row per drafted node.

    mcsd collect --target toy --prompts toy-code-collect --limit 64      (or python -m collect)

    load_rows(run_dir, columns=None) -> pandas.DataFrame    every row of a run folder
    load_manifest(run_dir) -> dict                          its manifest.json
    RowRecorder(k_config, run_id, init, save_hidden=False)  the decoder's recorder
    CollectJob(prompts, out, config, ...), collect_prompts(job, pair), run_job(job, devices)

Names are imported lazily so that `mcsd --help` does not load torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

DEFAULT_PROMPTS = "toy-code-collect"  # the prompt set `mcsd collect` and its bench default to
DEFAULT_SHARD_PROMPTS = 8  # prompts per Parquet shard (`--shard-prompts`, `CollectJob`)

_EXPORTS = {
    "load_rows": "collect.store",
    "load_manifest": "collect.store",
    "IDENTITY_FIELDS": "collect.store",
    "RowRecorder": "collect.recorder",
    "CollectJob": "collect.run",
    "collect_prompts": "collect.run",
    "run_job": "collect.run",
    "format_summary": "collect.run",
    "row_schema": "collect.schema",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
