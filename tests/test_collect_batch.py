"""`mcsd collect --batch-size B`: the rows of batch size 1, whatever B, resumable."""

from __future__ import annotations

import pandas as pd
import pytest
from test_collect import K, _Crash, _job, crash_after_shards, id_prompts

from collect import load_rows
from collect.run import collect_prompts
from collect.store import shard_paths
from mcsd_runtime.cli import main as mcsd
from mcsd_runtime.decode.decoder import DecodeConfig

LABELS = ["run_id", "prompt_id", "prompt_hash", "init", "step", "position", "node", "parent",
          "token", "on_accepted_path", "accepted_length", "drafted_depth"]


def sorted_rows(folder) -> pd.DataFrame:
    rows = load_rows(folder)
    return rows.sort_values(["prompt_id", "step", "node"]).reset_index(drop=True)


def assert_same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Identity and labels exactly; float features within 1e-5 (batched forwards may round
    differently)."""
    assert len(a) == len(b) > 0
    pd.testing.assert_frame_equal(a[LABELS], b[LABELS])
    floats = [c for c in a.columns if c not in LABELS and a[c].dtype.kind == "f"]
    pd.testing.assert_frame_equal(a[floats], b[floats], check_exact=False, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("dense", "temperature"), [(True, 0.0), (False, 0.0), (False, 0.7)])
def test_rows_at_batch_size_4_are_those_of_batch_size_1(pair, tmp_path, dense, temperature):
    prompts = id_prompts(9)
    config = DecodeConfig(k_config=K, max_new_tokens=14, temperature=temperature, seed=5)
    one = collect_prompts(_job(tmp_path / "b1", prompts, config=config, dense=dense), pair)
    four = collect_prompts(_job(tmp_path / "b4", prompts, config=config, dense=dense,
                                batch_size=4), pair)
    assert_same_rows(sorted_rows(tmp_path / "b1"), sorted_rows(tmp_path / "b4"))
    assert four["counts"] == one["counts"] and four["summary"] == one["summary"]
    assert [s["batch_size"] for s in four["sessions"]] == [4]
    # each prompt is charged the wall time it added, so they sum to the decode time
    assert 0 < four["timings"]["decode_seconds"] <= four["sessions"][0]["wall_seconds"]


def test_a_batched_run_resumes_at_another_batch_size(pair, tmp_path, monkeypatch):
    prompts = id_prompts(7)
    config = DecodeConfig(k_config=K, max_new_tokens=12, seed=5)
    collect_prompts(_job(tmp_path / "full", prompts, config=config, dense=True), pair)
    part = tmp_path / "part"
    with monkeypatch.context() as m, pytest.raises(_Crash):
        crash_after_shards(m, 1)
        collect_prompts(_job(part, prompts, config=config, dense=True, shard_prompts=2,
                             batch_size=4), pair)
    assert len(shard_paths(part)) == 1
    resumed = collect_prompts(_job(part, prompts, config=config, dense=True, shard_prompts=2,
                                   batch_size=3), pair)
    assert resumed["sessions"][-1]["prompts"] == 5
    assert resumed["status"] == "complete"
    assert_same_rows(sorted_rows(tmp_path / "full"), sorted_rows(part))


def test_batch_size_errors(tmp_path, capsys):
    assert mcsd(["collect", "--batch-size", "0", "--out", str(tmp_path / "x")]) != 0
    err = capsys.readouterr().err
    assert "--batch-size must be 1 or more" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()
