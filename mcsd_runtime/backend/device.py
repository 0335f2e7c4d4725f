"""Picking the torch device a command runs on (`--device`) and the dtype models run in there
(`--dtype`).

A command's `--dtype auto` is the fast dtype of its device (`fast_dtype`), bf16 on a CPU with
native bf16 matmuls included, and the command says so once on stderr there (`command_dtype`);
the library's `load_pair(dtype="auto")` instead keeps the checkpoint's own dtype, as
transformers' `dtype="auto"` does: bf16 on a CPU is a choice a library user makes."""

from __future__ import annotations

import sys

import torch

from mcsd_runtime.backend.cpu import cpu_has_native_bf16
from mcsd_runtime.errors import MCSDError

DEVICE_HELP = "use auto, cpu, cuda, cuda:N or mps"


def pick_device(device: str | torch.device = "auto") -> torch.device:
    """`auto` picks cuda, then mps, then cpu; any other name must be a device this torch has
    (MCSDError naming it otherwise)."""
    if str(device) != "auto":
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise MCSDError(f"unknown device {str(device)!r}: {DEVICE_HELP}") from None
        if dev.type == "cuda":
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if n == 0:
                build = "a CPU-only build" if torch.version.cuda is None else "no GPU visible"
                raise MCSDError(f"device {str(device)!r}: this torch has no CUDA device "
                                f"({build}); use --device cpu or auto")
            if dev.index is not None and dev.index >= n:
                raise MCSDError(f"device {str(device)!r}: only {n} CUDA device(s) "
                                f"(cuda:0..cuda:{n - 1})")
        elif dev.type == "mps" and not (getattr(torch.backends, "mps", None)
                                        and torch.backends.mps.is_available()):
            raise MCSDError(f"device {str(device)!r}: MPS is not available here; use --device "
                            f"cpu or auto")
        elif dev.type not in ("cpu", "cuda", "mps"):
            raise MCSDError(f"unsupported device {str(device)!r}: {DEVICE_HELP}")
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
               "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
               "float64": torch.float64}


def fast_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on a GPU that supports it, float16 on other accelerators, bfloat16 on a CPU with
    native bf16 matmuls (`cpu.cpu_has_native_bf16`: AMX or AVX512-BF16, where it is fast), else
    float32 (emulated bf16 is slower than fp32 on CPUs without them)."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def pick_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype a command runs in on `device` for its `--dtype`: `auto` is `fast_dtype`, a
    name one of DTYPE_NAMES' (MCSDError otherwise), a torch.dtype itself."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return fast_dtype(device)
    if dtype not in DTYPE_NAMES:
        raise MCSDError(f"unknown dtype {dtype!r}: use one of auto, {', '.join(DTYPE_NAMES)}")
    return DTYPE_NAMES[dtype]


_SAID_CPU_BF16 = False


def command_dtype(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype:
    """`pick_dtype` for a command's `--dtype` and `--device`, to hand to `load_pair`; where
    `auto` chose bfloat16 on a CPU, it says so on stderr (once a process)."""
    global _SAID_CPU_BF16
    dev = pick_device(device)
    out = pick_dtype(dtype, dev)
    if dtype == "auto" and dev.type == "cpu" and out == torch.bfloat16 and not _SAID_CPU_BF16:
        _SAID_CPU_BF16 = True
        print("mcsd: note: --dtype auto runs the models in bfloat16 on this CPU, which "
              "multiplies bf16 natively (AMX or AVX512-BF16); --dtype fp32 runs them in float32",
              file=sys.stderr, flush=True)
    return out
