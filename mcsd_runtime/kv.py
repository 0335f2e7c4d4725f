"""KV-cache bookkeeping: after a step, keep the committed prefix and the accepted path only."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def cache_len(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def keep_path(cache: DynamicCache, start: int, offsets: list[int]) -> None:
    """Keep entries `[0, start)` followed by the entries at `offsets` (ascending, all >= start);
    drop everything else. The path entries are moved next to the prefix, then the tail is cut."""
    n = len(offsets)
    contiguous = offsets == list(range(start, start + n))
    idx = None if contiguous else torch.tensor(offsets, device=cache.layers[0].keys.device)
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)
            if idx is not None:
                t[:, :, start : start + n] = t.index_select(2, idx)
            setattr(layer, name, t[:, :, : start + n])
