"""The KV cache of a batch whose rows hold different numbers of tokens.

One `DynamicCache` holds every row ([rows, heads, length, head_dim] per layer). Between steps,
row r's entries are the prefix `[0, lens[r])`; the slots after it (up to the longest row) are
stale and masked. A step appends the same number of slots to every row (padding included) and
`valid` says which of them a row may attend to; `compact` then moves each row's kept entries
(its accepted path) right after its prefix and cuts the cache to the longest row, so the cache
never grows past the longest sequence. Entries keep the positions (RoPE) they were written with,
so moving them changes nothing for attention.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from mcsd_runtime.decode.kv import new_cache


class RowCache:
    """A batched KV cache with per-row valid prefixes (see the module docstring)."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.cache = new_cache()
        self.lens = [0] * rows
        self.valid = torch.zeros(rows, 0, dtype=torch.bool, device=device)

    @property
    def rows(self) -> int:
        return self.valid.shape[0]

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def mask(self, block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[rows, 1, n, length + n] additive mask for n new tokens: cached entries are visible
        where valid, except the last `block.shape[-1] - n` ones, which with the new tokens follow
        `block` ([rows or 1, n, nb])."""
        n, nb = block.shape[-2], block.shape[-1]
        ctx = self.length - (nb - n)
        hidden = torch.zeros(self.rows, ctx, dtype=dtype, device=block.device)
        hidden.masked_fill_(~self.valid[:, :ctx], torch.finfo(dtype).min)
        return torch.cat([hidden[:, None, :].expand(-1, n, -1),
                          block.to(dtype).expand(self.rows, -1, -1)], -1)[:, None]

    def appended(self, valid: torch.Tensor) -> None:
        """The last forward appended these slots ([rows, n] bool: which a row may attend to)."""
        self.valid = torch.cat([self.valid, valid], 1)

    def compact(self, keep: list[list[int]]) -> None:
        """Row r keeps its prefix and then the slots `keep[r]` (ascending, all past its prefix),
        moved right after the prefix; every other slot is dropped."""
        moves = []  # (row, to, from)
        for r, slots in enumerate(keep):
            moves += [(r, self.lens[r] + i, s) for i, s in enumerate(slots)
                      if s != self.lens[r] + i]
            self.lens[r] += len(slots)
        layers = _layers(self.cache)
        if moves and layers:
            r_idx, d_idx, s_idx = torch.tensor(moves, device=self.valid.device).unbind(1)
            for layer in layers:
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    t[r_idx, :, d_idx] = t[r_idx, :, s_idx]
        self._cut()

    def settle(self, lens: list[int]) -> None:
        """Each row's valid entries are now its first `lens[r]` slots (after a prefill)."""
        self.lens = list(lens)
        self._cut()

    def select(self, rows: list[int]) -> None:
        """Keep only these rows (in this order)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.valid.device)
        for layer in _layers(self.cache):
            layer.keys, layer.values = layer.keys[idx], layer.values[idx]
        self.lens = [self.lens[r] for r in rows]
        self.valid = self.valid[idx]
        self._cut()

    def extend(self, other: RowCache) -> None:
        """Append `other`'s rows (both caches compact)."""
        length = max(self.length, other.length)
        mine, theirs = _layers(self.cache), _layers(other.cache)
        shapes = mine or theirs
        if shapes:
            merged = new_cache()
            for i, ref in enumerate(shapes):
                parts = []
                for rc, layers in ((self, mine), (other, theirs)):
                    for name in ("keys", "values"):
                        t = layers[i] if layers else None
                        parts.append(_padded(getattr(t, name) if t is not None else None,
                                             getattr(ref, name), rc.rows, length))
                merged.update(torch.cat([parts[0], parts[2]]), torch.cat([parts[1], parts[3]]),
                              i)
            self.cache = merged
        self.valid = torch.cat([torch.nn.functional.pad(v, (0, length - v.shape[1]))
                                for v in (self.valid, other.valid)])
        self.lens = self.lens + other.lens

    def _cut(self) -> None:
        """Cut every row to the longest prefix; the valid slots are the prefixes again."""
        longest = max(self.lens, default=0)
        for layer in _layers(self.cache):
            layer.keys, layer.values = layer.keys[:, :, :longest], layer.values[:, :, :longest]
        lens = torch.tensor(self.lens, device=self.valid.device)
        self.valid = torch.arange(longest, device=lens.device)[None] < lens[:, None]


def _layers(cache: DynamicCache) -> list:
    """The layers that hold tensors (none before the first forward)."""
    return [layer for layer in cache.layers
            if getattr(layer, "keys", None) is not None and layer.keys.dim() == 4]


def _padded(t: torch.Tensor | None, ref: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """`t` padded with zeros along the sequence to `length`; zeros shaped like `ref` if None."""
    if t is None:
        return ref.new_zeros(rows, ref.shape[1], length, ref.shape[3])
    return torch.nn.functional.pad(t, (0, 0, 0, length - t.shape[2]))
