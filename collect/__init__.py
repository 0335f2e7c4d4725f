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
from typing import TYPE_CHECKING, Any

from collect.defaults import DEFAULT_PROMPTS as DEFAULT_PROMPTS
from collect.defaults import DEFAULT_SHARD_PROMPTS as DEFAULT_SHARD_PROMPTS

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time `__getattr__` imports on use
    from collect.recorder import RowRecorder as RowRecorder
    from collect.run import CollectJob as CollectJob
    from collect.run import collect_prompts as collect_prompts
    from collect.run import format_summary as format_summary
    from collect.run import run_job as run_job
    from collect.schema import row_schema as row_schema
    from collect.store import IDENTITY_FIELDS as IDENTITY_FIELDS
    from collect.store import load_manifest as load_manifest
    from collect.store import load_rows as load_rows

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
