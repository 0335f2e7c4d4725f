"""What differs between the transformers 5.x releases the toolkit runs on."""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch


@functools.cache
def _cache_keyword(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model: torch.nn.Module, cache) -> dict:
    """`{keyword: cache}` for the model's forward: `cache` from transformers 5.24 (which
    deprecates `past_key_values`), else `past_key_values`."""
    return {_cache_keyword(type(model)): cache}


@contextlib.contextmanager
def hf_progress_bars_off():
    """transformers' per-shard save/load progress bars off for a while (noise in a build)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
