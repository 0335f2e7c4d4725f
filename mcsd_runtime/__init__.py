"""mcsd_runtime: a lossless multi-candidate speculative decoder with pluggable early-stop policies."""

from mcsd_runtime.errors import MCSDError

__all__ = ["MCSDError"]
