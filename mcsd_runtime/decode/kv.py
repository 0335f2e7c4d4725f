"""KV-cache bookkeeping: after a step, keep the committed prefix and the accepted path only."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


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


class BufferLayer(DynamicLayer):
    """A `DynamicLayer` that appends into a preallocated buffer (doubled when full) instead of
    concatenating the whole cache at every forward, which costs a copy of every row's cache per
    layer per forward. `keys`/`values` stay views of the buffer's first tokens, so code that cuts
    them to a prefix (`keep_path`, `RowCache`) works unchanged; a layer whose tensors were
    replaced by other tensors starts a new buffer from them."""

    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, have = key_states.shape[-2], self.get_seq_length()
        bufs = self._buffers
        if (bufs is None or bufs[0].shape[2] < have + n or bufs[0].shape[0] != key_states.shape[0]
                or (have and self.keys.data_ptr() != bufs[0].data_ptr())):
            size = max(64, 2 * (have + n))
            bufs = tuple(s.new_empty(*s.shape[:2], size, s.shape[3])
                         for s in (key_states, value_states))
            if have:
                bufs[0][:, :, :have] = self.keys
                bufs[1][:, :, :have] = self.values
            self._buffers = bufs
        bufs[0][:, :, have : have + n] = key_states
        bufs[1][:, :, have : have + n] = value_states
        self.keys, self.values = bufs[0][:, :, : have + n], bufs[1][:, :, : have + n]
        return self.keys, self.values


def new_cache() -> DynamicCache:
    """An empty cache whose layers are `BufferLayer`s."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = BufferLayer
    return cache
