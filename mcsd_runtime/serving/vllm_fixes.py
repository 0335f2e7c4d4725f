"""A fix for a known defect of the vLLM release this toolkit drives, applied in the vLLM
processes the toolkit starts, and only where the defect is present.

**vLLM 0.32's CPU build samples verified drafts at the wrong temperature** (vLLM issue #55005,
open; a fix is proposed in vLLM PR #55006). On a CPU, vLLM replaces the rejection sampler's
Triton `expand_kernel` with a C++ stand-in (`vllm.utils.cpu_triton_utils._expand_kernel_impl`)
that takes int64 tensors. It converts its output buffer to an int64 copy, fills the copy and
never writes it back, so each drafted position's temperature (and top-k and top-p, where set)
is uninitialised memory, and a float temperature such as 0.7 would be truncated to 0 besides.
The target's distribution at drafted positions is then not the target's: sampled speculative
decoding (any method, vLLM's own n-gram included) emits wrong tokens. Greedy decoding reads no
temperature and is unaffected.

`apply()` replaces the stand-in's code (in vLLM 0.32, where `expand_is_broken` shows the
defect) with an expansion at the caller's dtype (each request's value repeated over
its drafted positions, `replace_from` rewritten to `replace_to` first, as the Triton kernel
does). It is applied:
- in the calling process, before an in-process engine starts (`vllm_engine.start_engine`);
- in every process of a multi-process engine through vLLM's plugin entry point
  (`vllm.general_plugins`, `register`), when `MCSD_VLLM_FIXES=1` is in the environment, which
  the toolkit sets for the engines it starts. Anyone serving the toolkit's proposer on vLLM's
  CPU build sets it too (docs/serving.md); without it the plugin does nothing.
"""

from __future__ import annotations

import os
from typing import Any

FIX_ENV = "MCSD_VLLM_FIXES"  # "1": vLLM processes apply the fixes (`register`)
ORIGINAL_CODE: dict[str, Any] = {}  # a fix's name -> the code it replaced in this process
DEFECTIVE_RELEASE = "0.32"  # the release line with the defect (the one the toolkit drives)


def register() -> None:
    """vLLM's general-plugin entry point: apply the fixes where the environment asks for them."""
    if os.environ.get(FIX_ENV) == "1":
        apply()


def apply() -> list[str]:
    """Apply each fix this vLLM needs; the names of those applied now (none where applied
    before, or where this vLLM has no CPU stand-ins)."""
    shim = _cpu_shim()
    if shim is None or shim._expand_kernel_impl.__code__ is expand_at_dtype.__code__:
        return []
    ORIGINAL_CODE["cpu-expand"] = shim._expand_kernel_impl.__code__
    shim._expand_kernel_impl.__code__ = expand_at_dtype.__code__
    return ["cpu-expand"]


def _cpu_shim() -> Any:
    """vLLM 0.32's CPU stand-ins for its Triton kernels, or None where this vLLM is another
    release or has none. (The stand-in's C++ kernels are not loaded here: vLLM loads the variant
    for the CPU, and loading a second one aborts the process.)"""
    try:
        import vllm
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return None
    release = getattr(vllm, "__version__", "")
    return cpu_triton_utils if release.startswith(DEFECTIVE_RELEASE) else None


def expand_is_broken(expand: Any) -> bool:
    """Whether `expand` (the stand-in's signature) fails to write a float output, one request's
    value 0.5 over two positions, with vLLM's C++ kernels loaded (the test of the defect)."""
    import torch
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    out = torch.zeros(2, dtype=torch.float32)
    expand(out, torch.tensor([0.5]), torch.tensor([2], dtype=torch.int32), 0, 1)
    return not torch.equal(out, torch.tensor([0.5, 0.5]))


def expand_at_dtype(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any,
                    replace_to: Any, MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803
    """`expand_kernel` at the caller's dtype: request i's value (`replace_from` rewritten to
    `replace_to`) over its positions, `cu_num_tokens` the cumulative counts. Self-contained (no
    names from this module): `apply` installs its code in vLLM's stand-in."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    swap = torch.full_like(input_val, replace_to)
    values = torch.where(input_val == replace_from, swap, input_val)
    output[: int(ends[-1])] = values.repeat_interleave(counts).to(output.dtype)
