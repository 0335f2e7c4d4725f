"""collect: row schema, labels against the decoder, dense runs, resume, refusal, CLI errors."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from collect import load_manifest, load_rows
from collect import run as collect_run
from collect.recorder import RowRecorder
from collect.run import CollectJob, Tally, collect_prompts, prompt_seed
from collect.schema import IDENTITY, prompt_hash, row_schema
from collect.store import LOCK, run_lock, shard_paths, write_shard
from conftest import make_pair
from mcsd_runtime.cli import main as mcsd
from mcsd_runtime.decisions.features import FEATURE_NAMES
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts.sets import Prompt

K = (3, 2, 1)


def id_prompts(n: int, vocab: int = 64, seed: int = 0) -> list[Prompt]:
    g = torch.Generator().manual_seed(seed)
    return [Prompt(id=f"p{i}", text=torch.randint(0, vocab, (3 + i % 4,), generator=g).tolist(),
                   source="test") for i in range(n)]


def decode_with_rows(pair, config, prompt):
    rec = RowRecorder(config.k_config, "run", config.init)
    dec = MCSDDecoder(pair, config, recorder=rec)
    rec.begin("p", prompt)
    res = dec.generate(prompt, seed=config.seed)
    return res, rec.finish().to_pandas()


def test_schema_round_trip(pair, tmp_path):
    for hidden in (False, True):
        rec = RowRecorder(K, "run", "draft", save_hidden=hidden)
        dec = MCSDDecoder(pair, DecodeConfig(k_config=K, max_new_tokens=12), recorder=rec)
        rec.begin("p0", [1, 2, 3])
        dec.generate([1, 2, 3])
        table = rec.finish()
        assert table.schema.equals(row_schema(hidden))
        n = len(IDENTITY)
        assert [f.name for f in table.schema][n:n + len(FEATURE_NAMES)] == list(FEATURE_NAMES)
        assert set(table.column("prompt_hash").to_pylist()) == {prompt_hash([1, 2, 3])}
        path = tmp_path / f"train-000000-r000-{hidden}.parquet"
        write_shard(path, table, {"prompt_indices": [0]})
        back = pq.read_table(path)
        assert back.schema.equals(row_schema(hidden))  # metadata aside
        assert back.equals(table)
        if hidden:
            h = back.column("hidden").to_pylist()
            assert len(h) == table.num_rows and len(h[0]) == pair.draft.config.hidden_size


def plain_forward_probs(pair, committed: list[int], g: pd.DataFrame, temperature: float,
                        init: str) -> tuple[np.ndarray, np.ndarray]:
    """p_target(x) and q(x) of one step's rows from plain forwards of each model over the
    node's own context (the committed tokens, then its ancestors): no tree mask, no cache.
    The proposal of a target-initialized root is the target's distribution."""
    token, parent = dict(zip(g.node, g.token, strict=True)), dict(zip(g.node, g.parent,
                                                                      strict=True))
    dists: dict = {}

    def dist(model, node: int) -> torch.Tensor:
        chain, n = [], parent[node]
        while n:
            chain.append(token[n])
            n = parent[n]
        ctx = tuple(committed + chain[::-1])
        if (model, ctx) not in dists:
            with torch.no_grad():
                logits = model(torch.tensor([ctx])).logits[0, -1]
            dists[model, ctx] = torch.softmax(logits.double() / (temperature or 1.0), -1)
        return dists[model, ctx]

    rows = list(zip(g.node, g.token, g.depth, strict=True))
    p = [float(dist(pair.target, n)[x]) for n, x, _ in rows]
    q = [float(dist(pair.target if init == "target" and d == 1 else pair.draft, n)[x])
         for n, x, d in rows]
    return np.array(p), np.array(q)


@pytest.mark.parametrize("init,temperature", [("draft", 0.0), ("draft", 0.9), ("target", 0.0),
                                              ("target", 0.9)])
def test_labels_agree_with_decoder(pair, init, temperature):
    config = DecodeConfig(k_config=(4, 2, 2, 1), init=init, temperature=temperature,
                          max_new_tokens=24, seed=3)
    res, df = decode_with_rows(pair, config, [5, 9, 2, 7])
    drafted_steps = [i for i, s in enumerate(res.steps) if s.tree_size]
    assert sorted(df.step.unique()) == drafted_steps
    tokens = res.token_ids
    for step, g in df.groupby("step"):
        rec = res.steps[step]
        assert (g.accepted_length == rec.accepted).all()
        assert (g.drafted_depth == rec.drafted).all()
        assert len(g) == rec.tree_size and list(g.node) == list(range(1, rec.tree_size + 1))
        path = g[g.on_accepted_path].sort_values("depth")
        # one root-to-leaf prefix: depths 1..n, each node the child of the previous one
        assert list(path.depth) == list(range(1, len(path) + 1))
        assert list(path.parent) == [0, *path.node.tolist()][: len(path)]
        assert len(path) == rec.accepted + (1 if init == "target" else 0)
        # the accepted drafts (for target-init: the chosen root first) are the tokens committed
        pos, n = int(g.position.iloc[0]), min(len(path), rec.committed)
        assert path.token.tolist()[:n] == tokens[pos : pos + n]
        p, q = plain_forward_probs(pair, [5, 9, 2, 7] + tokens[:pos], g, temperature, init)
        assert np.allclose(g.p_target, p, rtol=1e-5) and np.allclose(g.draft_prob, q, rtol=1e-5)
        assert np.allclose(g.soft_label, np.minimum(1, p / q), rtol=1e-5)
        if temperature == 0 and init == "draft":
            assert (g[g.on_accepted_path].soft_label > 0).all()
    assert df.prompt_id.eq("p").all() and df.run_id.eq("run").all() and df.init.eq(init).all()


@pytest.mark.parametrize("init", ["draft", "target"])
def test_recorded_features_describe_the_proposing_distribution(pair, init):
    """Greedy candidates are the proposal's top-k, so the first two siblings' q(x) are its top-1
    and top-2 at every depth; the target-initialized roots' proposal is the target's
    distribution of that step (not the one committed for the next step)."""
    config = DecodeConfig(k_config=(4, 2, 2, 1), init=init, max_new_tokens=40)
    _, df = decode_with_rows(pair, config, [5, 9, 2, 7])
    first, second = df[df.sibling_rank == 0], df[df.sibling_rank == 1]
    assert len(first) and len(second)
    assert np.allclose(first.draft_prob, first.q_top1, rtol=1e-5, atol=1e-7)
    assert np.allclose(second.draft_prob, second.q_top2, rtol=1e-5, atol=1e-7)


def test_dense_greedy_run_walks_the_ar_output(pair, tmp_path):
    prompts = id_prompts(3)
    config = DecodeConfig(k_config=K, max_new_tokens=20)
    job = CollectJob(prompts=prompts, out=str(tmp_path / "dense"), config=config, dense=True,
                     progress=False)
    manifest = collect_prompts(job, pair)
    df = load_rows(tmp_path / "dense")
    ar = ARDecoder(pair, config)
    dense = MCSDDecoder(pair, job.config)
    for p in prompts:
        want = ar.generate(p.text).token_ids
        res = dense.generate(p.text)
        assert res.token_ids == want  # commits the AR output
        assert len(res.steps) == len(want) and all(s.committed == 1 for s in res.steps)
        rows = df[df.prompt_id == p.id]
        # one step per committed position, a tree at each but the last (no budget left)
        assert sorted(rows.step.unique()) == list(range(len(want) - 1))
        assert (rows.position == rows.step).all()
        for t, g in rows.groupby("step"):
            path = g[g.on_accepted_path].sort_values("depth")
            assert path.token.tolist() == want[t : t + len(path)]
    assert manifest["dense"] and manifest["counts"]["steps"] == 3 * 20
    assert manifest["summary"]["tau"] == 1.0


def test_dense_refuses_sampling_and_target_init(tmp_path):
    with pytest.raises(MCSDError, match="greedy"):
        CollectJob(prompts=id_prompts(1), out=str(tmp_path), dense=True,
                   config=DecodeConfig(k_config=K, temperature=0.5))
    with pytest.raises(MCSDError, match="init draft"):
        CollectJob(prompts=id_prompts(1), out=str(tmp_path), dense=True,
                   config=DecodeConfig(k_config=K, init="target"))


def test_run_ids_with_a_slash_are_refused(tmp_path):
    with pytest.raises(MCSDError, match="may not contain '/'"):
        CollectJob(prompts=id_prompts(1), out=str(tmp_path), config=DecodeConfig(k_config=K),
                   run_id="a/b")


def test_tally_gives_the_manifest_counts_summary_and_timings():
    metas = [{"rows": 10, "steps": 4, "new_tokens": 9, "target_calls": 5, "acceptance_sum": 1.5,
              "drafting_steps": 3, "seconds": 0.5, "accepted_hist": [1, 2, 1, 0]},
             {"rows": 0, "steps": 1, "new_tokens": 1, "target_calls": 2, "acceptance_sum": 0.0,
              "drafting_steps": 0, "seconds": 0.25, "accepted_hist": [1, 0, 0, 0]}]
    tally = Tally.of(metas, depth=3)
    assert tally.rates(2.0) == "5.0 tok/s, 5 rows/s"
    assert tally.manifest_fields(prompts=5, shards=2, wall_seconds=2.00049) == {
        "counts": {"prompts_done": 2, "rows": 10, "steps": 5, "new_tokens": 10,
                   "target_calls": 7, "shards": 2, "prompts": 5},
        "summary": {"tau": 10 / 7, "mean_accepted": 4 / 5, "acceptance_rate": 0.5,
                    "accepted_length_histogram": {"0": 2, "1": 2, "2": 1, "3": 0}},
        "timings": {"decode_seconds": 0.75, "rows_per_decode_s": 13.3, "wall_seconds": 2.0},
    }
    empty = Tally(depth=2).manifest_fields(prompts=1, shards=0, wall_seconds=0.0)
    assert empty["summary"] == {"tau": 0.0, "mean_accepted": 0.0, "acceptance_rate": 0.0,
                                "accepted_length_histogram": {"0": 0, "1": 0, "2": 0}}
    assert empty["timings"]["rows_per_decode_s"] == 0.0


def _job(out, prompts, **kw):
    config = kw.pop("config", DecodeConfig(k_config=K, max_new_tokens=16, temperature=0.7,
                                           seed=5))
    return CollectJob(prompts=prompts, out=str(out), config=config, progress=False,
                      run_id="r", prompt_set="ids", **kw)


class _Crash(Exception):
    """A crash between two shards, injected by `crash_after_shards`."""


def crash_after_shards(monkeypatch, n: int) -> None:
    """Make a collect job crash once it has written `n` shards."""
    flush = collect_run._ShardWriter.flush

    def flush_then_crash(self) -> None:
        flush(self)
        if len(self.written) >= n:
            raise _Crash(f"crashed after {len(self.written)} shards")

    monkeypatch.setattr(collect_run._ShardWriter, "flush", flush_then_crash)


def test_resume_after_interruption_gives_the_uninterrupted_rows(pair, tmp_path, monkeypatch):
    prompts = id_prompts(7)
    full = collect_prompts(_job(tmp_path / "full", prompts, shard_prompts=2), pair)
    assert full["counts"]["prompts_done"] == 7 and full["status"] == "complete"

    part = tmp_path / "part"
    with monkeypatch.context() as m, pytest.raises(_Crash):
        crash_after_shards(m, 2)
        collect_prompts(_job(part, prompts, shard_prompts=2), pair)
    assert len(shard_paths(part)) == 2
    (part / ".tmp-train-000004-r000.parquet.999").write_bytes(b"half a shard")  # a kill -9
    resumed = collect_prompts(_job(part, prompts, shard_prompts=2), pair)
    assert resumed["sessions"][-1]["prompts"] == 3  # only the missing prompts were decoded
    assert not any(p.name.startswith(".tmp-") for p in part.iterdir())
    a, b = load_rows(tmp_path / "full"), load_rows(part)
    pd.testing.assert_frame_equal(a, b)
    assert resumed["counts"] == full["counts"] and resumed["summary"] == full["summary"]
    # a finished run rerun decodes nothing
    again = collect_prompts(_job(part, prompts, shard_prompts=2), pair)
    assert again["sessions"][-1]["prompts"] == 0
    pd.testing.assert_frame_equal(a, load_rows(part))


def test_manifest_counts_are_the_decoders_statistics(pair, tmp_path):
    job = _job(tmp_path / "run", id_prompts(3), shard_prompts=2)
    m = collect_prompts(job, pair)
    dec = MCSDDecoder(pair, job.config, stopper="static")
    results = [dec.generate(p.text, seed=prompt_seed(job.config.seed, p.id))
               for p in job.prompts]
    stats = [r.stats for r in results]
    tokens, calls = sum(s.new_tokens for s in stats), sum(s.target_calls for s in stats)
    assert (m["counts"]["new_tokens"], m["counts"]["target_calls"]) == (tokens, calls)
    assert m["counts"]["steps"] == sum(len(r.steps) for r in results)
    assert m["summary"]["tau"] == pytest.approx(tokens / calls)
    assert m["summary"]["acceptance_rate"] == pytest.approx(
        sum(s.acceptance_sum for s in stats) / sum(s.drafting_steps for s in stats))
    session = m["sessions"][-1]
    assert (session["prompts"], session["rows"]) == (3, m["counts"]["rows"]) and m["counts"]["rows"]
    assert m["timings"]["wall_seconds"] == session["wall_seconds"]


def test_incompatible_reuse_is_refused(pair, tmp_path):
    prompts = id_prompts(2)
    out = tmp_path / "run"
    collect_prompts(_job(out, prompts), pair)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    changes = {
        "temperature": {"config": DecodeConfig(k_config=K, max_new_tokens=16, temperature=0.5,
                                               seed=5)},
        "k_config": {"config": DecodeConfig(k_config=(2, 2), max_new_tokens=16,
                                            temperature=0.7, seed=5)},
        "save_hidden": {"save_hidden": True},
    }
    for field, kw in changes.items():
        with pytest.raises(MCSDError, match=f"different {field}"):
            collect_prompts(_job(out, prompts, **kw), pair)
    with pytest.raises(MCSDError, match="different prompt_ids"):
        collect_prompts(_job(out, id_prompts(3)), pair)
    with pytest.raises(MCSDError, match="different pair"):
        collect_prompts(_job(out, prompts), make_pair(seed=1))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing overwritten
    manifest = load_manifest(out)  # a run collected by an older version (row schema 1)
    (out / "manifest.json").write_text(json.dumps(manifest | {"row_schema_version": 1}))
    with pytest.raises(MCSDError, match=r"different row_schema_version \(stored 1, now 2\).*"
                                        r"cannot add rows to it \(its rows still load\)"):
        collect_prompts(_job(out, prompts), pair)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(MCSDError, match="not empty"):
        collect_prompts(_job(other, prompts), pair)


def test_manifest_fields_and_loaders(pair, tmp_path):
    out = tmp_path / "run"
    collect_prompts(_job(out, id_prompts(3), shard_prompts=2), pair)
    m = load_manifest(out)
    for key in ("pair", "k_config", "temperature", "init", "verify", "max_new_tokens", "seed",
                "dense", "feature_schema_version", "row_schema_version", "prompt_set",
                "prompt_ids", "counts", "summary", "timings", "sessions", "run_id", "status"):
        assert key in m, key
    assert m["k_config"] == list(K) and m["prompt_ids"] == ["p0", "p1", "p2"]
    hist = m["summary"]["accepted_length_histogram"]
    assert sum(hist.values()) == m["counts"]["steps"]
    df = load_rows(out)
    assert len(df) == m["counts"]["rows"] and list(df.prompt_id.unique()) == ["p0", "p1", "p2"]
    hashes = df.groupby("prompt_id")["prompt_hash"].unique()
    assert {k: list(v) for k, v in hashes.items()} == {
        p.id: [prompt_hash(p.text)] for p in id_prompts(3)}  # the prompt's tokens, one per prompt
    assert list(load_rows(out, columns=["soft_label"]).columns) == ["soft_label"]
    import datasets

    ds = datasets.load_dataset("parquet", data_dir=str(out), split="train")
    assert ds.num_rows == len(df) and set(ds.column_names) == set(df.columns)
    with pytest.raises(MCSDError, match="no manifest.json"):
        load_manifest(tmp_path)


def test_cli_errors_are_clear(tmp_path, capsys):
    assert mcsd(["collect", "--prompts", "no-such-set", "--out", str(tmp_path / "a")]) == 2
    assert "unknown prompt set 'no-such-set'" in capsys.readouterr().err
    missing = tmp_path / "missing.jsonl"
    assert mcsd(["collect", "--prompts", str(missing), "--out", str(tmp_path / "b")]) == 2
    assert f"prompt file {missing} does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert mcsd(["collect", "--prompts", str(bad), "--out", str(tmp_path / "c")]) == 2
    assert "cannot read prompt file" in capsys.readouterr().err
    locked = tmp_path / "locked.jsonl"  # a file that is there but cannot be read
    if Path("/proc/self/mem").exists():  # Linux: EIO at offset 0, even for root (as CI runs)
        locked.symlink_to("/proc/self/mem")
    else:
        locked.write_text(json.dumps({"prompt": "x"}))
        locked.chmod(0)
        assert not os.access(locked, os.R_OK), "run as a user that file modes apply to"
    assert mcsd(["collect", "--prompts", str(locked), "--out", str(tmp_path / "d")]) == 2
    assert "cannot read prompt file" in capsys.readouterr().err
    assert not any(Path(tmp_path).glob("*/manifest.json"))


def test_prompts_without_rows_count_as_done(pair, tmp_path):
    # max_new_tokens=1: the step commits the target's token and drafts nothing
    config = DecodeConfig(k_config=K, max_new_tokens=1)
    job = _job(tmp_path / "run", id_prompts(3), config=config, shard_prompts=2)
    m = collect_prompts(job, pair)
    assert m["counts"]["prompts_done"] == 3 and m["counts"]["rows"] == 0
    assert not list((tmp_path / "run").glob("train-*"))  # datasets cannot read empty Parquet
    assert collect_prompts(job, pair)["sessions"][-1]["prompts"] == 0
    df = load_rows(tmp_path / "run")
    assert len(df) == 0 and "soft_label" in df.columns


def _write_lock(folder: Path, pid: int, host: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK
    path.write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(),
                                "started": "earlier"}))
    return path


def test_run_lock_refuses_a_live_holder_and_takes_over_a_dead_one(pair, tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(["sleep", "60"])
    try:
        lock = _write_lock(out, holder.pid)
        with pytest.raises(MCSDError, match=f"in use by another collect job \\(pid {holder.pid} "
                                            f"on {socket.gethostname()}, started earlier\\)"):
            collect_prompts(_job(out, id_prompts(2)), pair)
        assert lock.is_file() and not (out / "manifest.json").exists()  # nothing was touched
    finally:
        holder.kill()
        holder.wait()
    m = collect_prompts(_job(out, id_prompts(2)), pair)  # its process is gone: a stale lock
    assert m["status"] == "complete" and not lock.exists()
    _write_lock(out, os.getpid())  # this process does not hold it: left by an earlier one
    assert collect_prompts(_job(out, id_prompts(2)), pair)["status"] == "complete"


def test_run_lock_refuses_unknown_holders(tmp_path):
    lock = _write_lock(tmp_path / "a", 1, host="elsewhere")  # cannot tell from here: refused
    refused = f"pid 1 on elsewhere, started earlier.*delete {re.escape(str(lock))} and rerun"
    with pytest.raises(MCSDError, match=refused), run_lock(lock.parent):
        pass
    lock.write_text("not json")
    with pytest.raises(MCSDError, match="cannot read the lock"), run_lock(lock.parent):
        pass
    lock.write_text(json.dumps({"pid": 0, "host": socket.gethostname()}))
    with pytest.raises(MCSDError, match="is not a collect lock"), run_lock(lock.parent):
        pass
    assert lock.is_file()  # left for the user to judge


def test_run_lock_is_reentrant_and_leaves_no_trace(pair, tmp_path):
    out = tmp_path / "new"
    with run_lock(out):
        assert (out / LOCK).is_file()
        with run_lock(out):  # the job's own process, e.g. collect_prompts under run_job
            pass
        assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    assert not out.exists()  # created for a job that wrote nothing: removed again
    (tmp_path / "file").write_text("x")
    with pytest.raises(MCSDError, match="exists and is not a folder"), run_lock(tmp_path / "file"):
        pass
    # a lock's leftover temporary file does not make a new folder look foreign
    out.mkdir()
    (out / f"{LOCK}.12345").write_text("{}")
    assert collect_prompts(_job(out, id_prompts(1)), pair)["status"] == "complete"


class _FakeFabric:
    """Rank `rank` of two, with a broadcast that hands every rank what rank 0 sent."""

    def __init__(self, rank: int, sent: list) -> None:
        self.global_rank, self.world_size, self.device, self.sent = rank, 2, "cpu", sent

    def broadcast(self, obj, src: int = 0):
        if self.global_rank == src:
            self.sent.append(obj)
        return self.sent[0]


def test_every_rank_stops_when_rank_0_finds_the_folder_locked(tmp_path):
    """Several processes: rank 0 takes the job's one lock and tells the others it could not,
    so no rank loads a pair or waits at a barrier for the others."""
    import pickle

    from collect.run import _fabric_worker

    out = tmp_path / "run"
    holder = subprocess.Popen(["sleep", "60"])
    try:
        _write_lock(out, holder.pid)
        job = _job(out, id_prompts(2), pair_args={"target": str(tmp_path / "no-such-model")})
        sent: list = []
        results = [_fabric_worker(_FakeFabric(rank, sent), pickle.dumps(job)) for rank in (0, 1)]
    finally:
        holder.kill()
        holder.wait()
    assert len(sent) == 1 and all(r == {"error": sent[0]} for r in results)
    assert f"in use by another collect job (pid {holder.pid}" in sent[0]
    assert sorted(p.name for p in out.iterdir()) == [LOCK]
