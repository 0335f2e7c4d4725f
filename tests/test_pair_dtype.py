"""The dtype a pair runs in: the library's `load_pair(dtype="auto")` keeps the target
checkpoint's own dtype (as transformers does), even on a CPU with native bf16; a command's
`--dtype auto` runs in the device's fast dtype, bf16 on such a CPU, and says so once."""

from __future__ import annotations

import shutil

import pytest
import torch

from conftest import fake_cpu_flags
from mcsd_runtime.backend import device as device_mod
from mcsd_runtime.backend.device import command_dtype
from mcsd_runtime.models.pair import load_pair

NATIVE = "fpu avx2 amx_bf16"
EMULATED = "fpu avx2"


@pytest.fixture
def said_nothing(monkeypatch):
    monkeypatch.setattr(device_mod, "_SAID_CPU_BF16", False)


@pytest.fixture(scope="module")
def bf16_target(toy_tiny, tmp_path_factory):
    """The tiny toy target saved as a bf16 checkpoint."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("bf16") / "target"
    shutil.copytree(toy_tiny / "target", folder)
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("flags", [NATIVE, EMULATED])
def test_auto_keeps_the_checkpoints_dtype_on_any_cpu(toy_tiny, bf16_target, tmp_path,
                                                     monkeypatch, flags, said_nothing, capsys):
    fake_cpu_flags(monkeypatch, tmp_path, flags)
    pair = load_pair(toy_tiny / "target", toy_tiny / "draft", device="cpu")  # fp32 checkpoints
    assert pair.target.dtype == pair.draft.dtype == torch.float32
    # a bf16 target stays bf16, and its fp32 draft runs in bf16 beside it: one dtype a pair
    pair = load_pair(bf16_target, toy_tiny / "draft", device="cpu", dtype="auto")
    assert pair.target.dtype == pair.draft.dtype == torch.bfloat16
    assert capsys.readouterr().err == ""  # the library chooses nothing, so says nothing


def test_a_named_dtype_casts_both(toy_tiny, bf16_target):
    pair = load_pair(toy_tiny / "target", toy_tiny / "draft", device="cpu", dtype="bf16")
    assert pair.target.dtype == pair.draft.dtype == torch.bfloat16
    pair = load_pair(bf16_target, toy_tiny / "draft", device="cpu", dtype=torch.float32)
    assert pair.target.dtype == pair.draft.dtype == torch.float32


def test_a_commands_auto_is_bf16_on_a_native_bf16_cpu_and_says_so_once(tmp_path, monkeypatch,
                                                                       said_nothing, capsys):
    fake_cpu_flags(monkeypatch, tmp_path, NATIVE)
    assert command_dtype("auto", "cpu") == torch.bfloat16
    assert command_dtype("auto", "cpu") == torch.bfloat16
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dtype auto runs the models in bfloat16" in err
    assert "--dtype fp32" in err
    assert command_dtype("fp32", "cpu") == torch.float32  # chosen, not defaulted: no note
    assert command_dtype(torch.float32, "cpu") == torch.float32
    assert capsys.readouterr().err == ""


def test_a_commands_auto_is_fp32_where_bf16_is_emulated(tmp_path, monkeypatch, said_nothing,
                                                        capsys):
    fake_cpu_flags(monkeypatch, tmp_path, EMULATED)
    assert command_dtype("auto", "cpu") == torch.float32
    assert command_dtype("bf16", "cpu") == torch.bfloat16
    assert capsys.readouterr().err == ""
