"""collect through its command line: kill -9 and resume, two Fabric processes, the folder's
lock, --help.

The pair is a tiny random Llama pair saved to folders with a character-level tokenizer, so the
CLI loads it like any local model."""

from __future__ import annotations

import json
import os
import signal
import string
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from collect import load_manifest, load_rows
from collect.store import LOCK, scan_shards
from conftest import make_pair
from mcsd_runtime.cli import main as mcsd

ROOT = Path(__file__).resolve().parents[1]
N_PROMPTS = 10


def save_char_pair(root: Path) -> tuple[Path, Path]:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0}
    for ch in string.ascii_lowercase + string.digits + " .,:()=_\n":
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    pair = make_pair(vocab=64)
    dirs = root / "target", root / "draft"
    for d, model in zip(dirs, (pair.target, pair.draft), strict=True):
        model.save_pretrained(d)
        fast.save_pretrained(d)
    return dirs


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("collect_cli")
    target, draft = save_char_pair(root)
    prompts = root / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(N_PROMPTS):
            f.write(json.dumps({"id": f"q{i}", "prompt": f"def f{i}(x):\n    return x" + " +" * i})
                    + "\n")
    args = ["--target", str(target), "--draft", str(draft), "--device", "cpu", "--dtype",
            "float64", "--prompts", str(prompts), "--k-config", "3,2,1", "--temperature", "0.8",
            "--max-new-tokens", "40", "--seed", "1", "--run-id", "cli", "--threads", "1",
            "--shard-prompts", "1", "--no-progress"]
    ref = root / "ref"
    assert mcsd(["collect", *args, "--out", str(ref)]) == 0
    return root, args, load_rows(ref), load_manifest(ref)


def _cmd(args: list[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "collect", *args, "--out", str(out)]


def test_kill_9_then_rerun_completes_the_missing_prompts_only(setup, capsys):
    root, args, ref_rows, ref_manifest = setup
    out = root / "killed"
    proc = subprocess.Popen(_cmd(args, out), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if len(list(out.glob("train-*.parquet"))) >= 2:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = sum(len(m["prompt_indices"]) for m in scan_shards(out).values())
    assert 0 < done < N_PROMPTS, "the run was not interrupted half-way"
    assert load_manifest(out)["status"] == "running"
    assert json.loads((out / LOCK).read_text())["pid"] == proc.pid  # left by the killed job
    assert mcsd(["collect", *args, "--out", str(out)]) == 0  # its stale lock does not block
    assert "rows in" in capsys.readouterr().out
    assert not (out / LOCK).exists()
    manifest = load_manifest(out)
    assert manifest["sessions"][-1]["prompts"] == N_PROMPTS - done
    assert manifest["counts"] == ref_manifest["counts"]
    pd.testing.assert_frame_equal(load_rows(out), ref_rows)
    # a finished run says so, with no empty progress bar
    assert mcsd(["collect", *[a for a in args if a != "--no-progress"], "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"all {N_PROMPTS} prompts already collected" in err and "stopped" not in err


def check_two_ranks(out: Path, ref_rows, ref_manifest, stdout: str) -> None:
    """Two ranks wrote `out`: each its own shards, every prompt exactly once, the rows and
    counts of one process, the summary printed and the lock released."""
    shards = scan_shards(out)
    ranks = {meta["rank"] for meta in shards.values()}
    assert ranks == {0, 1} and all(name.endswith(f"-r{meta['rank']:03d}.parquet")
                                   for name, meta in shards.items())
    indices = [i for meta in shards.values() for i in meta["prompt_indices"]]
    assert sorted(indices) == list(range(N_PROMPTS))  # every prompt exactly once
    manifest = load_manifest(out)
    assert manifest["status"] == "complete" and manifest["sessions"][-1]["world_size"] == 2
    assert manifest["counts"] == ref_manifest["counts"]
    pd.testing.assert_frame_equal(load_rows(out), ref_rows)  # same rows as one process
    assert "tau" in stdout and "accepted length histogram" in stdout
    assert not (out / LOCK).exists()


def test_two_fabric_processes_cover_every_prompt_once(setup):
    """`--devices 2`: two real Fabric processes (spawned, gloo barriers)."""
    root, args, ref_rows, ref_manifest = setup
    out = root / "fabric-devices"
    res = subprocess.run(_cmd(args, out) + ["--devices", "2"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    check_two_ranks(out, ref_rows, ref_manifest, res.stdout)


class ThreadFabric:
    """Stands in for `lightning.fabric.Fabric`: `launch` runs the worker once per rank, each in
    a thread of this process with real barriers and broadcasts, and returns rank 0's result
    (the real, spawned processes: `test_two_fabric_processes_cover_every_prompt_once`)."""

    made: list[dict] = []

    def __init__(self, accelerator, devices, num_nodes, strategy) -> None:
        self.made.append({"accelerator": accelerator, "devices": devices,
                          "num_nodes": num_nodes})
        self.world_size, self._barrier = devices * num_nodes, threading.Barrier(devices)
        self._sent: list = [None]

    def launch(self, fn, *args):
        results: list = [None] * self.world_size

        def rank(r: int) -> None:
            try:
                results[r] = fn(_Rank(self, r), *args)
            except BaseException as err:  # noqa: BLE001 - handed to the test below
                results[r] = err
                self._barrier.abort()

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results[0]


class _Rank:
    def __init__(self, fabric: ThreadFabric, rank: int) -> None:
        import torch

        self.fabric, self.global_rank, self.world_size = fabric, rank, fabric.world_size
        self.device = torch.device("cpu")

    def barrier(self) -> None:
        self.fabric._barrier.wait(timeout=300)

    def broadcast(self, obj, src: int = 0):
        if self.global_rank == src:
            self.fabric._sent[0] = obj
        self.barrier()
        value = self.fabric._sent[0]
        self.barrier()
        return value


def test_processes_per_device_share_the_named_device(setup, monkeypatch, capsys):
    """`--device cpu:0 --processes-per-device 2`: two processes (Fabric on CPU, threads here)
    that both load the pair on the device --device names, not Fabric's, and together collect
    what one process does."""
    import lightning.fabric

    import collect.run

    root, args, ref_rows, ref_manifest = setup
    loaded, real_load = [], collect.run._load_pair
    one_at_a_time, all_loaded = threading.Lock(), threading.Barrier(2)

    def spy(job, device, say=True):
        # loading sets torch's default dtype for a while: a thread's concern only here, so
        # the ranks load in turn and decode once both have loaded
        with one_at_a_time:
            loaded.append((device, say))
            try:
                pair = real_load(job, device, say)
            except BaseException:
                all_loaded.abort()  # the other rank stops waiting
                raise
        all_loaded.wait(timeout=300)
        return pair

    monkeypatch.setattr(ThreadFabric, "made", [])
    monkeypatch.setattr(lightning.fabric, "Fabric", ThreadFabric)
    monkeypatch.setattr(collect.run, "_load_pair", spy)
    out = root / "fabric-per-device"
    capsys.readouterr()
    assert mcsd(["collect", *args, "--out", str(out), "--device", "cpu:0",
                 "--processes-per-device", "2"]) == 0
    assert ThreadFabric.made == [{"accelerator": "cpu", "devices": 2, "num_nodes": 1}]
    assert sorted(loaded) == [("cpu:0", False), ("cpu:0", True)]  # one rank says it
    check_two_ranks(out, ref_rows, ref_manifest, capsys.readouterr().out)


def test_second_job_on_a_folder_is_refused_at_once(setup, capsys, monkeypatch):
    root, args, ref_rows, ref_manifest = setup
    out = root / "busy"
    first = subprocess.Popen(_cmd(args, out), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and first.poll() is None and not list(out.glob("train-*")):
        time.sleep(0.02)
    assert first.poll() is None, "the first job ended before the second one started"
    import collect.run

    def no_pair(*_):
        raise AssertionError("the second job loaded its pair")

    monkeypatch.setattr(collect.run, "_load_pair", no_pair)
    assert mcsd(["collect", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"is in use by another collect job (pid {first.pid} on" in err
    assert "Traceback" not in err
    assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    assert load_manifest(out)["counts"] == ref_manifest["counts"]  # the first job was unharmed
    pd.testing.assert_frame_equal(load_rows(out), ref_rows)
    assert not (out / LOCK).exists()


def test_refused_configuration_exits_2(setup, capsys):
    root, args, _, _ = setup
    changed = [a if a != "0.8" else "0.5" for a in args]
    assert mcsd(["collect", *changed, "--out", str(root / "ref")]) == 2
    err = capsys.readouterr().err
    assert "different temperature" in err and "stored 0.8, now 0.5" in err
    assert mcsd(["collect", *args, "--dense", "--out", str(root / "x")]) == 2
    assert "--dense needs greedy" in capsys.readouterr().err


def test_help_is_quick_and_documented():
    res = subprocess.run([sys.executable, "-m", "collect", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    for flag in ("--prompts", "--k-config", "--dense", "--devices", "--save-hidden", "--out"):
        assert flag in res.stdout


@pytest.mark.parametrize("extra, message", [
    (["--devices", "2", "--processes-per-device", "2"], "use it without --devices"),
    (["--devices", "2", "--device", "cpu:0"], "to share one device, --processes-per-device N"),
    (["--processes-per-device", "0"], "--processes-per-device must be >= 1"),
])
def test_processes_sharing_a_device_refuse_what_they_cannot_do(setup, extra, message, capsys):
    root, args, _, _ = setup
    assert mcsd(["collect", *args, *extra, "--out", str(root / "refused")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (root / "refused").exists() or not list((root / "refused").glob("train-*"))


def test_a_capped_tree_is_collected_and_named(setup):
    """`--k-config 3,1/1,1`: the manifest records the capped tree, each step's rows are its
    3 + 1 + 1 nodes at most, and training reads the tree back from the manifest."""
    from mcsd_runtime.tree import parse_k_config
    from replay.runs import collected_k_config

    root, args, _, _ = setup
    i = args.index("--k-config")
    capped = [*args[: i + 1], "3,1/1,1", *args[i + 2 :]]
    out = root / "capped"
    assert mcsd(["collect", *capped, "--limit", "3", "--out", str(out)]) == 0
    manifest = load_manifest(out)
    assert manifest["k_config"] == "3,1/1,1"
    assert collected_k_config([manifest]) == parse_k_config("3,1/1,1")
    rows = load_rows(out)
    per_depth = rows.groupby(["prompt_id", "step", "depth"]).size().groupby("depth").max()
    assert per_depth.to_dict() == {1: 3, 2: 1, 3: 1}
    deeper = rows[rows["depth"] > 1]
    assert set(deeper["parent"]) <= {1, 4}  # under the likeliest candidate, then its child
