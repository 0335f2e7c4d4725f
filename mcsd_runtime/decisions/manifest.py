"""One artifact kind for every learned decision, its manifest `decision.json`, and the `Decision`
protocol they share.

The decoder makes four choices a model can learn: how deep to draft (the depth stopper,
`stopper:PATH`), whether to draft at all (the stopper's skip gate, in the same artifact), how
many tokens of a prompt-lookup match to copy or whether to draft instead (`lookup-learned:PATH`),
and how wide the draft's first depth is (`width:PATH`). Each is trained by `mcsd train
--decision stop|copy|width` into a folder holding its own spec file (`stopper.json`,
`copy_length.json`, `width.json`) and model files, and one `decision.json`, written last (a
folder that has it is complete). A fifth, the verification budget of a batch
(`budget:PATH`, `mcsd train --decision budget`), holds a stopper's node model with
`budget.json` (its calibration and cost profile):

    {"format": "mcsd-decision", "version": 1, "decision": "stop" | "copy" | "width" | "budget",
     "spec": "stopper.json", "decode": "mcsd eval --methods stopper:PATH", "created": "..."}

`read_decision(folder)` names the decision of such a folder, from its `decision.json`;
`load_decision(folder)` loads its runtime object.

A `Decision` is what the three runtime objects (`LearnedStopper`, `CopyLength`, `WidthPolicy`)
have in common: the decision it is, the temperature of the outputs it was trained on, and
loading from its folder. How each is consulted in a step differs by where it sits in the step
(`Stopper.should_continue` after a depth, `CopyLength.choose` before the forwards,
`WidthPolicy.choose` after the draft's first forward).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, Protocol

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import atomic_write_text

FORMAT, VERSION, FILE = "mcsd-decision", 1, "decision.json"
SPEC_FILES = {"stop": "stopper.json", "copy": "copy_length.json", "width": "width.json",
              "budget": "budget.json"}
METHODS = {"stop": "stopper:{path}", "copy": "lookup-learned:{path}", "width": "width:{path}",
           "budget": "budget:{path}"}


class Decision(Protocol):
    """A learned decision's runtime object, loaded from its artifact folder."""

    decision: ClassVar[str]  # one of SPEC_FILES

    @property
    def temperature(self) -> float:
        """Of the outputs it was trained on (0: greedy)."""
        ...

    @classmethod
    def load(cls, folder: str | Path) -> Decision: ...


def write_manifest(folder: Path, decision: str, decode: str) -> Path:
    """Write `folder/decision.json` (atomically; call it after every other file)."""
    if decision not in SPEC_FILES:
        raise MCSDError(f"unknown decision {decision!r} (known: {', '.join(SPEC_FILES)})")
    path = folder / FILE
    atomic_write_text(path, json.dumps({
        "format": FORMAT, "version": VERSION, "decision": decision, "spec": SPEC_FILES[decision],
        "decode": decode, "created": datetime.now(UTC).isoformat(timespec="seconds")}, indent=1))
    return path


def read_decision(folder: str | Path) -> str:
    """The decision a trained folder holds, from its `decision.json`; MCSDError naming the fix
    when it has none or cannot be read."""
    folder = Path(folder)
    path = folder / FILE
    if not path.is_file():
        raise MCSDError(f"{folder} holds no trained decision (no {FILE}): train one with `mcsd "
                        f"train --decision {'|'.join(SPEC_FILES)} --out {folder}`")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise MCSDError(f"{path} is not readable JSON ({err}): retrain with `mcsd train`"
                        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise MCSDError(f"{path} is not a decision manifest (format {FORMAT!r})")
    if data.get("version") != VERSION or data.get("decision") not in SPEC_FILES:
        raise MCSDError(f"{path}: version {data.get('version')} decision "
                        f"{data.get('decision')!r}; this release reads version {VERSION} "
                        f"of {', '.join(SPEC_FILES)}: retrain with `mcsd train`")
    return data["decision"]


def load_decision(folder: str | Path) -> Decision:
    """The runtime object of the decision trained into `folder`."""
    kind = read_decision(folder)
    if kind == "stop":
        from mcsd_runtime.decisions.learned import load_stopper

        return load_stopper(folder)
    if kind == "copy":
        from mcsd_runtime.decisions.copy_length import CopyLength

        return CopyLength.load(folder)
    if kind == "budget":
        from mcsd_runtime.decisions.verify_budget import load_budget

        return load_budget(folder)
    from mcsd_runtime.decisions.width import WidthPolicy

    return WidthPolicy.load(folder)


def method(decision: str, path: str | Path) -> str:
    """The `mcsd eval --methods` name that decodes a decision trained into `path`."""
    return METHODS[decision].format(path=path)
