"""Resuming a collect run with another number of processes (`--devices`): the rows come out as
one uninterrupted process writes them. Ranks run here as threads meeting at a real barrier,
as Fabric's processes do."""

from __future__ import annotations

import threading

import pandas as pd
import pytest
from test_collect import _Crash, _job, crash_after_shards, id_prompts

from collect import load_rows
from collect.run import collect_prompts
from collect.store import shard_paths

N_PROMPTS = 6


def two_ranks(job, pair) -> dict:
    """`job` on two ranks (threads); rank 0's manifest."""
    barrier = threading.Barrier(2, timeout=120)
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            results[r] = collect_prompts(job, pair, r, 2, barrier.wait)
        except BaseException as err:  # noqa: BLE001 - re-raised below
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    assert results[1]["rank"] == 1
    return results[0]


@pytest.fixture(scope="module")
def uninterrupted(pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "run"
    manifest = collect_prompts(_job(out, id_prompts(N_PROMPTS), shard_prompts=1), pair)
    return load_rows(out), manifest


def test_two_processes_then_one(pair, tmp_path, uninterrupted):
    """Two ranks, one of whose shards is lost (a rank killed before writing it), resumed by
    one process: only the lost prompt is decoded again."""
    out = tmp_path / "run"
    job = _job(out, id_prompts(N_PROMPTS), shard_prompts=1)
    first = two_ranks(job, pair)
    assert first["status"] == "complete" and first["sessions"][-1]["world_size"] == 2
    lost = next(p for p in shard_paths(out) if p.name.endswith("-r001.parquet"))
    lost.unlink()
    resumed = collect_prompts(job, pair)
    assert resumed["sessions"][-1]["prompts"] == 1
    assert [s["world_size"] for s in resumed["sessions"]] == [2, 1]
    rows, manifest = uninterrupted
    pd.testing.assert_frame_equal(load_rows(out), rows)
    assert resumed["counts"] == manifest["counts"] and resumed["summary"] == manifest["summary"]


def test_one_process_then_two(pair, tmp_path, monkeypatch, uninterrupted):
    out = tmp_path / "run"
    job = _job(out, id_prompts(N_PROMPTS), shard_prompts=1)
    with monkeypatch.context() as m, pytest.raises(_Crash):
        crash_after_shards(m, 2)
        collect_prompts(job, pair)
    assert len(shard_paths(out)) == 2
    resumed = two_ranks(job, pair)
    assert resumed["sessions"][-1]["prompts"] == N_PROMPTS - 2
    assert resumed["sessions"][-1]["world_size"] == 2
    rows, manifest = uninterrupted
    pd.testing.assert_frame_equal(load_rows(out), rows)
    assert resumed["counts"] == manifest["counts"] and resumed["summary"] == manifest["summary"]
