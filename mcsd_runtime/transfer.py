"""Host-to-device copies that never wait on the device.

`torch.tensor(values, device="cuda")` copies from pageable memory and synchronizes the stream:
a decode step that uploads its indices that way waits for the GPU several times. `upload` goes
through pinned memory with a non-blocking copy on CUDA (the caching host allocator keeps the
pinned buffer alive until the copy is done), and is a plain tensor elsewhere. The decode loop's
per-step uploads all go through it; its reads back to the host are counted in the tests.
"""

from __future__ import annotations

import torch


def upload(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`values` (nested lists of numbers) as a tensor on `device`, copied without a sync."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
