"""What this CPU can do fast: the one place that decides whether bfloat16 pays on a CPU."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


def cpu_flags() -> set[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_has_native_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AMX `amx_bf16` or `avx512_bf16`).

    Elsewhere bf16 matmuls are emulated and slower than fp32, worse the more tokens a forward
    has. SmolLM2-135M, one thread, 200 tokens of context, on an AVX2-only AMD EPYC: bf16
    61/155/290/524/1067 ms for 1/4/8/16/32 new tokens, fp32 70/129/138/181/261 ms. (oneDNN's
    `torch.ops.mkldnn._is_mkldnn_bf16_supported()` is true on plain AVX-512 too, so it is not
    this test.)"""
    return bool(cpu_flags() & NATIVE_BF16_FLAGS)
