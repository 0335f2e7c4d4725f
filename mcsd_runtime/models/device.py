"""Picking the torch device a command runs on (`--device`)."""

from __future__ import annotations

import torch

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
