"""Edges of three small contracts the wider tests pass through without reaching: an existing
*file* as a trainer's `--out`, a calibration's scores outside its knots on the device, and a
step's pending draft tokens when the caller says whether they were fed."""

from __future__ import annotations

import pytest
from test_decision import _Trainer

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.step_model import step_outcome
from train.decision import refuse_existing, train


def test_an_existing_file_as_out_is_refused_and_replaced_with_force(tmp_path):
    out = tmp_path / "model.txt"
    out.write_text("not a folder")
    with pytest.raises(MCSDError, match="exists and is not empty"):
        refuse_existing(out, force=False)
    refuse_existing(out, force=True)
    assert train(_Trainer(out), force=True) == 0  # replaced once the staging folder is complete
    assert out.is_dir() and (out / "decision.json").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    refuse_existing(empty, force=False)
    refuse_existing(tmp_path / "absent", force=False)


def test_step_outcome_follows_fed_when_given():
    # by default the pending tokens go through the draft exactly when it drafts
    assert step_outcome(3, 0, pending=2).pending == 2 + 1
    assert step_outcome(3, 2, pending=2).pending == 0 + 1 + 1
    # in a batch a row that drafts nothing is fed with the rows that draft
    assert step_outcome(3, 0, pending=2, fed=True).pending == 0 + 1
    # and a row whose draft was not fed keeps its pending tokens
    assert step_outcome(3, 2, pending=2, fed=False).pending == 2 + 1 + 1
