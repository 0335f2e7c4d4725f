"""`costmodel.step_breakdown`: a step's forwards against the decoder's own work, and the
host syncs per step, on a random-weight pair of a known shape."""

from __future__ import annotations

import json

import pytest
import torch

from mcsd_runtime.costmodel import step_breakdown as sb
from mcsd_runtime.stop.builtin import StaticStopper

ARGS = ["--shape", "tiny", "--draft-layers", "1", "--device", "cpu", "--dtype", "fp32",
        "--k-config", "1,1", "--max-new-tokens", "8", "--prompts", "1", "--prompt-tokens", "16"]


def test_each_method_splits_its_steps_into_forwards_and_the_rest(tmp_path, capsys):
    out = tmp_path / "steps.json"
    assert sb.main([*ARGS, "--methods", "ar,static:2", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    rows = {r["method"]: r for r in got["rows"]}
    assert set(rows) == {"ar", "static:2"} and got["device"] == "cpu"
    assert rows["ar"]["draft_ms_per_call"] == 0 and rows["static:2"]["draft_ms_per_call"] > 0
    for r in rows.values():
        assert r["steps"] > 0 and r["forwards_ms_per_step"] > 0
        assert r["forwards_ms_per_step"] + r["other_ms_per_step"] == pytest.approx(
            r["step_ms_synced"], abs=2e-3)
    assert got["launches"]["static:2"]["steps"] > 0
    assert '"method": "static:2"' in capsys.readouterr().out


def test_decisions_are_timed_per_stopper_on_request(tmp_path):
    out = tmp_path / "steps.json"
    assert sb.main([*ARGS, "--methods", "ar,static:2,confidence:0.5", "--decisions",
                    "--out", str(out)]) == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["ar"]["decision_us"] is None
    assert rows["static:2"]["decision_us"] > 0 and rows["confidence:0.5"]["decision_us"] > 0
    assert sb.main([*ARGS, "--methods", "static:2", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["rows"][0]["decision_us"] is None


def test_launch_counts_see_a_stopper_that_syncs_on_every_decision(monkeypatch):
    pair = sb.shaped_pair("tiny", 1, "cpu", torch.float32)
    prompt = list(range(3, 19))
    clean = sb.launch_counts(pair, "static:2", (1, 1), prompt, 8)

    def syncing(self, frontier):
        torch.ones(1).item()  # a hidden host sync in the hot path
        return self.depth is None or frontier.depth < self.depth

    monkeypatch.setattr(StaticStopper, "should_continue", syncing)
    broken = sb.launch_counts(pair, "static:2", (1, 1), prompt, 8)
    assert broken["aten::_local_scalar_dense"] >= clean["aten::_local_scalar_dense"] + 1


def test_bad_input_is_an_error_not_a_traceback(capsys):
    assert sb.main([*ARGS, "--methods", "ar,static:5"]) == 2
    err = capsys.readouterr().err
    assert "static:5 needs a tree of at least 5 depths" in err and "Traceback" not in err
    assert sb.main([*ARGS, "--prompts", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err
