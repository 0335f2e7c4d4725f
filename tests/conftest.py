"""Shared fixtures: tiny random Llama pairs built in memory (float64 so that tree attention and
incremental decoding agree to the last bit and greedy comparisons are exact).

Under pytest-xdist (`make test` runs two workers) every worker is its own process. What takes
seconds to build and is only read afterwards (the tiny toy pair, `shared_build`'s values) is
built once per run: the first worker to ask builds it into the run's base temporary folder,
which the workers share, under a file lock, and the others wait for it and read it back. No
fixture here writes to the user cache ($MCSD_CACHE)."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import torch
from filelock import FileLock
from transformers import LlamaConfig, LlamaForCausalLM

from mcsd_runtime.models.pair import Pair

# tiny models: threads only add contention on a shared 2-core machine, and under xdist each
# worker process imports this file, so each decodes on one thread
torch.set_num_threads(1)


def tiny_llama(vocab: int, layers: int, hidden: int, seed: int, eos: int | None = None,
               max_positions: int = 256, init_range: float = 0.2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_positions, initializer_range=init_range,
                      eos_token_id=eos, bos_token_id=None, pad_token_id=None,
                      attn_implementation="sdpa", tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.float64).eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos if eos is not None else 0
    return model


def make_pair(vocab: int = 64, eos: int | None = None, seed: int = 0, noise: float = 0.02,
              **kw) -> Pair:
    """A target and a *correlated* draft: the draft is the target with noise added to every
    weight, so that drafts are often (not always) accepted and every branch gets exercised."""
    target = tiny_llama(vocab, 2, 32, seed, eos, **kw)
    draft = tiny_llama(vocab, 2, 32, seed, eos, **kw)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for dp, tp in zip(draft.parameters(), target.parameters(), strict=True):
            dp.copy_(tp + noise * torch.randn(tp.shape, generator=gen, dtype=tp.dtype))
    return Pair(target, draft)


def fake_cpu_flags(monkeypatch: pytest.MonkeyPatch, folder: Path, flags: str | None) -> None:
    """Make `mcsd_runtime.backend.cpu` read a two-CPU /proc/cpuinfo with these flags (None: no
    such file), e.g. to run the native-bf16 paths on a CPU without them."""
    from mcsd_runtime.backend import cpu

    info = folder / "cpuinfo"
    if flags is not None:
        info.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\n"
                        f"processor\t: 1\nflags\t\t: {flags}\n")
    monkeypatch.setattr(cpu, "CPUINFO", info)


@pytest.fixture(scope="session")
def pair() -> Pair:
    return make_pair()


T = TypeVar("T")
_RUN_FOLDER: list[Path] = []  # set by `shared_run_folder`: the folder the run's workers share


@pytest.fixture(scope="session", autouse=True)
def shared_run_folder(tmp_path_factory) -> Path | None:
    """Under pytest-xdist, the run's base temporary folder (each worker's own lies inside it);
    None in a run of one process."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return None
    _RUN_FOLDER[:] = [tmp_path_factory.getbasetemp().parent]
    return _RUN_FOLDER[0]


def shared_build(name: str, build: Callable[[], T]) -> T:
    """`build()`, once per run: under pytest-xdist the first worker to ask pickles it into the
    run's shared folder (`name`.pkl, under a file lock) and the others load that; otherwise (or
    asked before the session's fixtures start) built here. For values no test changes."""
    if not _RUN_FOLDER:
        return build()
    path = _RUN_FOLDER[0] / f"{name}.pkl"
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            value = build()
            path.with_suffix(".tmp").write_bytes(pickle.dumps(value))
            path.with_suffix(".tmp").replace(path)
            return value
    return pickle.loads(path.read_bytes())


def _build_toy_tiny(out: Path) -> tuple[Path, str]:
    from mcsd_runtime.toy import build as toy_build
    from mcsd_runtime.toy import build_pair
    from mcsd_runtime.toy import training as toy_train

    log = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(log):
        mp.setattr(toy_train, "PROGRESS_INTERVAL", 0.0)
        mp.setattr(toy_build, "LATENCY_MAX_SECONDS", 0.5)  # the card's latency: not under test
        root = build_pair("tiny", out=out)
    return root, log.getvalue()


@pytest.fixture(scope="session")
def toy_tiny_build(tmp_path_factory, shared_run_folder) -> tuple[Path, str]:
    """The tiny toy pair, built once per test run (under xdist: by the first worker that needs
    it, into the folder the workers share; the others wait for it), and its build's stdout (a
    log: not a terminal), with a progress line at every training step. Tests only read it."""
    if shared_run_folder is None:
        return _build_toy_tiny(tmp_path_factory.mktemp("toy") / "tiny")
    root, log_file = shared_run_folder / "toy" / "tiny", shared_run_folder / "toy-tiny.log"
    with FileLock(str(shared_run_folder / "toy-tiny.lock")):
        if not log_file.exists():  # written once the build is complete
            import shutil

            shutil.rmtree(root, ignore_errors=True)  # what a failed build left
            root, log = _build_toy_tiny(root)
            log_file.write_bytes(log.encode())  # bytes: the log's characters exactly
    return root, log_file.read_bytes().decode()


@pytest.fixture(scope="session")
def toy_tiny(toy_tiny_build) -> Path:
    """The tiny toy pair's folder (with its tokenizer)."""
    return toy_tiny_build[0]


@pytest.fixture(scope="session")
def toy_pair(toy_tiny):
    from mcsd_runtime.models.pair import load_pair

    return load_pair(toy_tiny / "target", toy_tiny / "draft", device="cpu", dtype="float32")
