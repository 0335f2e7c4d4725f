"""The KV cache of a batch whose rows hold different numbers of tokens (one row included).

One `DynamicCache` holds every row ([rows, heads, length, head_dim] per layer). Between steps,
row r's entries are the prefix `[0, lens[r])`; the slots after it (up to the longest row) are
stale and masked. A forward appends the same number of slots to every row (padding included) and
says which of them a row may attend to; `compact` then moves each row's kept entries (its
accepted path) right after its prefix and cuts the cache to the longest row, so the cache never
grows past the longest sequence. Entries keep the positions (RoPE) they were written with, so
moving them changes nothing for attention. While every slot is valid (always at batch size 1),
no validity mask is kept and the context part of the attention mask is a view of zeros.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    """An empty cache of plain `DynamicLayer`s. A buffered layer (appending into a preallocated
    buffer instead of concatenating) measured slower at batch size 1 on this project's CPU
    (0.87x tokens/s for AR, 0.97x for MCSD with the heuristic, toy:tiny, interleaved in one
    process), so the one cache type uses plain layers."""
    return DynamicCache()


class RowCache:
    """A batched KV cache with per-row valid prefixes (see the module docstring)."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.cache = new_cache()
        self.lens = [0] * rows
        self.length = 0
        self.device = device
        self.valid: torch.Tensor | None = None  # [rows, length] bool; None: every slot valid
        self._zeros = torch.zeros(0, 0, device=device)

    @property
    def rows(self) -> int:
        return len(self.lens)

    def mask(self, block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[rows, 1, n, length + n] additive mask for n new tokens: cached entries are visible
        where valid, except the last `block.shape[-1] - n` ones, which with the new tokens follow
        `block` ([rows or 1, n, nb])."""
        n, nb = block.shape[-2], block.shape[-1]
        ctx = self.length - (nb - n)
        block = block.to(dtype).expand(self.rows, -1, -1)
        if self.valid is None:
            if not ctx:
                return block[:, None]
            if (self._zeros.shape[0] < n or self._zeros.shape[1] < ctx
                    or self._zeros.dtype != dtype):
                self._zeros = torch.zeros(max(n, 16), max(2 * ctx, 256), dtype=dtype,
                                          device=self.device)
            hidden = self._zeros[:n, :ctx].expand(self.rows, -1, -1)
            return torch.cat([hidden, block], -1)[:, None]
        hidden = torch.zeros(self.rows, ctx, dtype=dtype, device=block.device)
        hidden.masked_fill_(~self.valid[:, :ctx], torch.finfo(dtype).min)
        return torch.cat([hidden[:, None, :].expand(-1, n, -1), block], -1)[:, None]

    def appended(self, n: int, valid: torch.Tensor | None = None) -> None:
        """The last forward appended n slots per row; `valid` [rows, n] says which a row may
        attend to (None: all)."""
        if valid is not None or self.valid is not None:
            if valid is None:
                valid = torch.ones(self.rows, n, dtype=torch.bool, device=self.device)
            self.valid = torch.cat([self._valid(), valid], 1)
        self.length += n

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
            r_idx, d_idx, s_idx = torch.tensor(moves, device=self.device).unbind(1)
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
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        for layer in _layers(self.cache):
            layer.keys, layer.values = layer.keys[idx], layer.values[idx]
        self.lens = [self.lens[r] for r in rows]
        self._cut()

    def extend(self, other: RowCache) -> None:
        """Append `other`'s rows (both caches compact)."""
        length = max(self.length, other.length)
        mine, theirs = _layers(self.cache), _layers(other.cache)
        shapes = mine or theirs
        if shapes and self.rows:
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
        elif shapes:  # an empty batch takes the new rows' cache as it is
            self.cache = other.cache
        self.lens = self.lens + other.lens
        self._cut()

    def _valid(self) -> torch.Tensor:
        if self.valid is not None:
            return self.valid
        return torch.ones(self.rows, self.length, dtype=torch.bool, device=self.device)

    def _cut(self) -> None:
        """Cut every row to the longest prefix; the valid slots are the prefixes again."""
        longest = max(self.lens, default=0)
        for layer in _layers(self.cache):
            if layer.keys.shape[2] != longest:
                layer.keys, layer.values = layer.keys[:, :, :longest], layer.values[:, :, :longest]
        self.length = longest
        if all(n == longest for n in self.lens):
            self.valid = None
        else:
            lens = torch.tensor(self.lens, device=self.device)
            self.valid = torch.arange(longest, device=self.device)[None] < lens[:, None]


def _layers(cache: DynamicCache) -> list:
    """The layers that hold tensors (none before the first forward)."""
    return [layer for layer in cache.layers
            if getattr(layer, "keys", None) is not None and layer.keys.dim() == 4]


def _padded(t: torch.Tensor | None, ref: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """`t` padded with zeros along the sequence to `length`; zeros shaped like `ref` if None."""
    if t is None:
        return ref.new_zeros(rows, ref.shape[1], length, ref.shape[3])
    return torch.nn.functional.pad(t, (0, 0, 0, length - t.shape[2]))
