"""Shared fixtures: tiny random Llama pairs built in memory (float64 so that tree attention and
incremental decoding agree to the last bit and greedy comparisons are exact).

Under pytest-xdist (`make test` runs two workers) every worker is its own process: it builds the
session fixtures below once for itself, into its own base temporary folder (`tmp_path_factory`
gives each worker a folder of its own), so two workers never write the same toy pair; the tiny
pair's build takes seconds. No fixture here writes to the user cache ($MCSD_CACHE)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch
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


@pytest.fixture(scope="session")
def toy_tiny_build(tmp_path_factory) -> tuple[Path, str]:
    """The tiny toy pair, built once per test session, and its build's stdout (a log: not a
    terminal), with a progress line at every training step."""
    from mcsd_runtime.toy import build as toy_build
    from mcsd_runtime.toy import build_pair
    from mcsd_runtime.toy import training as toy_train

    log = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(log):
        mp.setattr(toy_train, "PROGRESS_INTERVAL", 0.0)
        mp.setattr(toy_build, "LATENCY_MAX_SECONDS", 0.5)  # the card's latency: not under test
        root = build_pair("tiny", out=tmp_path_factory.mktemp("toy") / "tiny")
    return root, log.getvalue()


@pytest.fixture(scope="session")
def toy_tiny(toy_tiny_build) -> Path:
    """The tiny toy pair's folder (with its tokenizer)."""
    return toy_tiny_build[0]


@pytest.fixture(scope="session")
def toy_pair(toy_tiny):
    from mcsd_runtime.models.pair import load_pair

    return load_pair(toy_tiny / "target", toy_tiny / "draft", device="cpu", dtype="float32")
