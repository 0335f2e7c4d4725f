"""One pipeline for every learned decision (`mcsd train --decision stop|copy|width`).

Each decision is trained by the same stages, which `train` runs in order:

- **prepare** the data: collected runs (stop) or the target's own outputs of prompt sets
  (copy, width; `collect.outputs`);
- **fit** the model (LightGBM or an MLP; isotonic calibrations for the width);
- **choose** its settings by replayed throughput (`replay`: the rules of
  `mcsd_runtime.pricing.step_model`, priced by a cost profile), reported against the statics
  a user would deploy and the hindsight oracle;
- **write** the artifact's files into a staging folder beside `--out`, then its
  `decision.json` (one artifact kind: `mcsd_runtime.stop.decision`); the folder replaces
  `--out` only once complete, so an interrupted run leaves no folder that looks trained;
- **check** (with `--check-prompts`, and for the stopper `--domains`): decode held-out prompts
  end to end beside the replay (`replay.check`) and write the result to `check.json`.

A `Trainer` is one decision's stages; `train/stop`, `train/copy` and `train/width` hold only
what differs between them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Protocol

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import atomic_write_text, tmp_beside
from mcsd_runtime.stop.decision import write_manifest

CHECK_FILE = "check.json"


class Trainer(Protocol):
    """One learned decision's training stages (module docstring). `out` is the artifact folder
    the run writes; the stages between `fit` and `write` see the staging folder instead."""

    decision: str  # "stop", "copy" or "width" (mcsd_runtime.stop.decision.SPEC_FILES)
    out: Path

    def prepare(self) -> Any:
        """The data to fit and replay on."""
        ...

    def fit(self, data: Any, folder: Path) -> Any:
        """The fitted model (its files may go to `folder` already)."""
        ...

    def choose(self, data: Any, fitted: Any) -> Any:
        """The settings chosen by replay, with the replay's report (printed here)."""
        ...

    def write(self, data: Any, fitted: Any, chosen: Any, folder: Path) -> str:
        """Write the artifact's files to `folder`; returns how to decode it (a command line
        naming `self.out`)."""
        ...

    def check(self, data: Any, chosen: Any) -> dict | None:
        """The end-to-end check of the artifact in `self.out` (printed here), or None when not
        asked for."""
        ...


def refuse_existing(out: Path, force: bool) -> None:
    """MCSDError when `out` holds files and `force` is off."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise MCSDError(f"--out {out} exists and is not empty; pass --force to replace it")


def run_stages(trainer: Trainer, folder: Path) -> tuple[Any, Any, str]:
    """prepare, fit, choose and write into `folder`, `decision.json` last; returns the data, the
    choice and how to decode the artifact."""
    data = trainer.prepare()
    fitted = trainer.fit(data, folder)
    chosen = trainer.choose(data, fitted)
    decode = trainer.write(data, fitted, chosen, folder)
    write_manifest(folder, trainer.decision, decode)
    return data, chosen, decode


def train(trainer: Trainer, force: bool = False) -> int:
    """Run the trainer's stages into a staging folder that then replaces `trainer.out`, and
    its check there (module docstring); returns 0."""
    out = trainer.out
    refuse_existing(out, force)
    staging = tmp_beside(out, f"the {trainer.decision} decision", "pass another --out")
    try:
        data, chosen, decode = run_stages(trainer, staging)
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"-> {out} (decode with `{decode}`)", flush=True)
    check = trainer.check(data, chosen)
    if check is not None:
        atomic_write_text(out / CHECK_FILE, json.dumps(check, indent=1, default=float))
    return 0
