"""One artifact kind and one pipeline for every learned decision: `decision.json`, which names
a folder's decision, and `train.decision.train`'s staging (an interrupted run leaves no folder that
looks trained; an existing --out is refused without --force)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mcsd_runtime.decisions.copy_length import CopyLength
from mcsd_runtime.decisions.learned import LearnedStopper
from mcsd_runtime.decisions.manifest import load_decision, read_decision, write_manifest
from mcsd_runtime.decisions.width import WidthPolicy
from mcsd_runtime.errors import MCSDError
from train.decision import train

FIXTURES = Path(__file__).parent / "fixtures" / "stoppers-b8df3aa"


def _width(k: int = 2) -> WidthPolicy:
    return WidthPolicy(k=k, calibration=[([0.0, 1.0], [0.0, 1.0])] * k, seconds=[1.0] * k,
                       rate=1.0)


def test_a_folder_names_its_decision_by_its_manifest(tmp_path):
    stopper = tmp_path / "stopper"
    shutil.copytree(next(p for p in FIXTURES.iterdir() if p.is_dir()), stopper)
    width = tmp_path / "width"
    _width().save(width)
    for folder in (stopper, width):  # a spec file alone does not name the decision
        with pytest.raises(MCSDError, match="holds no trained decision"):
            read_decision(folder)
    write_manifest(stopper, "stop", f"mcsd eval --methods stopper:{stopper}")
    write_manifest(width, "width", f"mcsd eval --methods width:{width}")
    manifest = json.loads((width / "decision.json").read_text())
    assert manifest["decision"] == "width" and manifest["spec"] == "width.json"
    assert read_decision(stopper) == "stop" and read_decision(width) == "width"
    assert isinstance(load_decision(stopper), LearnedStopper)
    assert isinstance(load_decision(width), WidthPolicy)
    assert LearnedStopper.decision == "stop" and CopyLength.decision == "copy"
    assert WidthPolicy.decision == "width"


def test_a_manifest_that_disagrees_or_no_spec_is_refused(tmp_path):
    with pytest.raises(MCSDError, match="holds no trained decision"):
        read_decision(tmp_path)
    (tmp_path / "decision.json").write_text(json.dumps({"format": "mcsd-decision",
                                                        "version": 9, "decision": "stop"}))
    with pytest.raises(MCSDError, match="version 9"):
        read_decision(tmp_path)
    with pytest.raises(MCSDError, match="unknown decision"):
        write_manifest(tmp_path, "depth", "")


class _Trainer:
    """A trainer that writes a width policy, failing at `fail` (a stage name) if given."""

    decision = "width"

    def __init__(self, out: Path, fail: str | None = None) -> None:
        self.out, self.fail, self.stages = out, fail, []

    def _stage(self, name: str) -> None:
        self.stages.append(name)
        if name == self.fail:
            raise MCSDError(f"{name} failed")

    def decode(self):
        return f"mcsd eval --methods width:{self.out}"

    def prepare(self):
        self._stage("prepare")
        return "data"

    def fit(self, data, folder):
        self._stage("fit")
        return _width()

    def choose(self, data, fitted):
        self._stage("choose")
        return fitted

    def write(self, data, fitted, chosen, folder):
        chosen.save(folder)
        self._stage("write")
        return "written"

    def check(self, data, chosen, written):
        assert written == "written"
        self._stage("check")
        return {"checked": True}


def test_train_runs_the_stages_in_order_into_a_finished_folder(tmp_path, capsys):
    out = tmp_path / "w"
    trainer = _Trainer(out)
    assert train(trainer) == 0
    assert trainer.stages == ["prepare", "fit", "choose", "write", "check"]
    assert sorted(p.name for p in out.iterdir()) == ["check.json", "decision.json", "width.json"]
    assert read_decision(out) == "width" and isinstance(load_decision(out), WidthPolicy)
    assert f"-> {out} (decode with `mcsd eval --methods width:{out}`)" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["w"]  # no staging folder left


@pytest.mark.parametrize("stage", ["fit", "choose", "write"])
def test_an_interrupted_run_leaves_the_old_folder_and_no_staging(tmp_path, stage):
    out = tmp_path / "w"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    with pytest.raises(MCSDError, match="exists and is not empty"):
        train(_Trainer(out))
    with pytest.raises(MCSDError, match=f"{stage} failed"):
        train(_Trainer(out, fail=stage), force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["w"]
    assert [p.name for p in out.iterdir()] == ["mine.txt"]  # replaced only once complete
    assert train(_Trainer(out), force=True) == 0
    assert not (out / "mine.txt").exists() and (out / "decision.json").is_file()
