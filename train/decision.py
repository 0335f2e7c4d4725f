"""One pipeline for every learned decision (`mcsd train --decision stop|copy|width|budget`).

Each decision is trained by the same stages, which `train` runs in order, each taking what the
ones before it returned and nothing else:

- **prepare** the data: collected runs (stop, budget) or the target's own outputs of prompt
  sets (copy, width; `train.outputs`), with what prices them;
- **fit** the model (LightGBM or an MLP; isotonic calibrations for the width);
- **choose** its settings by replayed throughput (`replay`: the rules of
  `mcsd_runtime.pricing.step_model`, priced by a cost profile), reported against the statics
  a user would deploy and the hindsight oracle;
- **write** the artifact's files into a staging folder beside `--out`, then its
  `decision.json` (one artifact kind: `mcsd_runtime.decisions.manifest`); the folder replaces
  `--out` only once complete (`mcsd_runtime.paths.build_folder`), so an interrupted run leaves
  no folder that looks trained;
- **check** (with `--check-prompts`, and for the stopper `--domains`): decode held-out prompts
  end to end beside the replay (`replay.check`) and write the result to `check.json`.

A `Trainer` is one decision's stages, typed by what each passes on (`Trainer[Data, Fitted,
Chosen, Written]`), over that decision's frozen config (built by `train.cli` from the command
line); `train/stop`, `train/copy`, `train/width` and `train/budget` hold only what differs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, TypeVar

from mcsd_runtime.decisions.manifest import write_manifest
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import atomic_write_text, build_folder

CHECK_FILE = "check.json"
Data = TypeVar("Data")  # what prepare gives: the data and what prices it
Fitted = TypeVar("Fitted")  # what fit gives: the model (and where its files are)
Chosen = TypeVar("Chosen")  # what choose gives: the settings and the replay's report
Written = TypeVar("Written")  # what write gives the check (None where it needs nothing)


class Trainer(Protocol[Data, Fitted, Chosen, Written]):
    """One learned decision's training stages (module docstring). `out` is the artifact folder
    the run writes; the stages between `fit` and `write` see the staging folder instead."""

    decision: str  # "stop", "copy", "width" or "budget" (mcsd_runtime.decisions.manifest)
    out: Path

    def decode(self) -> str:
        """How to decode the artifact in `out`: a command line naming it (decision.json's
        `decode`)."""
        ...

    def prepare(self) -> Data:
        """The data to fit and replay on."""
        ...

    def fit(self, data: Data, folder: Path) -> Fitted:
        """The fitted model (its files may go to `folder` already)."""
        ...

    def choose(self, data: Data, fitted: Fitted) -> Chosen:
        """The settings chosen by replay, with the replay's report (printed here)."""
        ...

    def write(self, data: Data, fitted: Fitted, chosen: Chosen, folder: Path) -> Written:
        """Write the artifact's files to `folder`; returns what the check reads besides."""
        ...

    def check(self, data: Data, chosen: Chosen, written: Written) -> dict | None:
        """The end-to-end check of the artifact in `out` (printed here), or None when not
        asked for."""
        ...


def refuse_existing(out: Path, force: bool) -> None:
    """MCSDError when `out` holds files and `force` is off."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise MCSDError(f"--out {out} exists and is not empty; pass --force to replace it")


def run_stages(trainer: Trainer[Data, Fitted, Chosen, Written], folder: Path
               ) -> tuple[Data, Chosen, Written]:
    """prepare, fit, choose and write into `folder`, `decision.json` last; returns the data, the
    choice and what write returned: what the check reads."""
    data = trainer.prepare()
    fitted = trainer.fit(data, folder)
    chosen = trainer.choose(data, fitted)
    written = trainer.write(data, fitted, chosen, folder)
    write_manifest(folder, trainer.decision, trainer.decode())
    return data, chosen, written


def train(trainer: Trainer, force: bool = False) -> int:
    """Run the trainer's stages into a staging folder that then replaces `trainer.out`, and
    its check there (module docstring); returns 0."""
    out = trainer.out
    refuse_existing(out, force)
    data, chosen, written = build_folder(out, f"the {trainer.decision} decision",
                                         "pass another --out",
                                         lambda staging: run_stages(trainer, staging))
    print(f"-> {out} (decode with `{trainer.decode()}`)", flush=True)
    check = trainer.check(data, chosen, written)
    if check is not None:
        atomic_write_text(out / CHECK_FILE, json.dumps(check, indent=1, default=float))
    return 0
