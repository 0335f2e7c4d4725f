"""The KV caches of a batch whose rows hold different numbers of tokens (one row included):
`RowCache` on the eager path, described here, and `SlotRowCache`, the same contract over
preallocated buffers for fixed-shape forwards (CUDA graphs).

In a `RowCache` one `DynamicCache` holds every row ([rows, heads, length, head_dim] per layer).
Between steps, row r's entries are the prefix `[0, lens[r])`; the slots after it (up to the
longest row) are stale and masked. A forward appends the same number of slots to every row
(padding included) and says which of them a row may attend to; `compact` then moves each row's
kept entries (its accepted path) right after its prefix and cuts the cache to the longest row,
so the cache never grows past the longest sequence. Entries keep the positions (RoPE) they were
written with, so moving them changes nothing for attention. While every slot is valid (always at
batch size 1), no validity mask is kept and the context part of the attention mask is a view of
zeros.
"""

from __future__ import annotations

import torch
from transformers import Cache, DynamicCache

from mcsd_runtime.decode.ragged import Ragged
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.transfer import upload


class RowKV(DynamicCache):
    """A `DynamicCache` that also takes a ragged forward's keys and values
    (`mcsd_runtime.decode.ragged`): packed [1, heads, total, dim], back into the rows' grid
    before they are appended, while `ragged` holds the forward's layout (`ragged.packed_into`)."""

    ragged: Ragged | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        ragged = self.ragged
        if ragged is not None:
            key_states, value_states = ragged.unpack_heads(key_states), ragged.unpack_heads(
                value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def new_cache() -> DynamicCache:
    """An empty cache of plain `DynamicLayer`s (a `RowKV`). A buffered layer (appending into a
    preallocated buffer instead of concatenating) measured slower at batch size 1 on this
    project's CPU (0.87x tokens/s for AR, 0.97x for MCSD with the heuristic, toy:tiny,
    interleaved in one process), so `RowCache` (the eager path's cache, batch size 1
    included) uses plain layers; `SlotRowCache` keeps its own buffers for fixed shapes."""
    return RowKV()


class RowLengths:
    """What both caches keep of their rows: each row's valid prefix (`lens`), the longest
    (`length`: where a forward appends), which slots a row may attend to (`valid`), and the
    moves that compact the kept entries after each prefix over `_tensors()` (each [rows,
    heads, slots, dim])."""

    lens: list[int]
    length: int
    device: torch.device
    valid: torch.Tensor | None  # [rows, length] bool; None: every slot valid

    @property
    def rows(self) -> int:
        return len(self.lens)

    def _tensors(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def _cut(self) -> None:
        raise NotImplementedError

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
        tensors = self._tensors()
        if moves and tensors:
            r_idx, d_idx, s_idx = upload(moves, self.device).unbind(1)
            for t in tensors:
                t[r_idx, :, d_idx] = t[r_idx, :, s_idx]
        self._cut()

    def settle(self, lens: list[int]) -> None:
        """Each row's valid entries are now its first `lens[r]` slots (after a prefill)."""
        self.lens = list(lens)
        self._cut()

    def _valid(self) -> torch.Tensor:
        if self.valid is not None:
            return self.valid
        return torch.ones(self.rows, self.length, dtype=torch.bool, device=self.device)

    def _prefixes(self) -> None:
        """The length is the longest row's; the valid slots are the prefixes again."""
        longest = max(self.lens, default=0)
        self.length = longest
        if all(n == longest for n in self.lens):
            self.valid = None
        else:
            lens = upload(self.lens, self.device)
            self.valid = torch.arange(longest, device=self.device)[None] < lens[:, None]


class RowCache(RowLengths):
    """A batched KV cache with per-row valid prefixes (see the module docstring)."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.cache = new_cache()
        self.lens = [0] * rows
        self.length = 0
        self.device = device
        self.valid: torch.Tensor | None = None  # [rows, length] bool; None: every slot valid
        self._zeros = torch.zeros(0, 0, device=device)

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

    def select(self, rows: list[int]) -> None:
        """Keep only these rows (in this order)."""
        idx = upload(rows, self.device, torch.long)
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

    def _tensors(self) -> list[torch.Tensor]:
        return [getattr(layer, name) for layer in _layers(self.cache)
                for name in ("keys", "values")]

    def _cut(self) -> None:
        """Cut every row to the longest prefix; the valid slots are the prefixes again."""
        longest = max(self.lens, default=0)
        for layer in _layers(self.cache):
            if layer.keys.shape[2] != longest:
                layer.keys, layer.values = layer.keys[:, :, :longest], layer.values[:, :, :longest]
        self._prefixes()


def _layers(cache: DynamicCache) -> list:
    """The layers that hold tensors (none before the first forward)."""
    return [layer for layer in cache.layers
            if (keys := getattr(layer, "keys", None)) is not None and keys.dim() == 4]


def _padded(t: torch.Tensor | None, ref: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """`t` padded with zeros along the sequence to `length`; zeros shaped like `ref` if None."""
    if t is None:
        return ref.new_zeros(rows, ref.shape[1], length, ref.shape[3])
    return torch.nn.functional.pad(t, (0, 0, 0, length - t.shape[2]))


class SlotRowCache(RowLengths):
    """`RowCache`'s contract over preallocated buffers: per layer, keys and values of shape
    [row_slots, heads, capacity, head_dim], allocated once and then only written in place, so
    that a forward over it has fixed shapes and can be replayed as a CUDA graph
    (`mcsd_runtime.decode.graphs`).

    A forward of n new tokens writes them at the columns `[length, length + n)` of every row
    (through `write_index`, a tensor that keeps its storage per n) and attends over the first
    `span` columns: `length + n` rounded up to a multiple of `bucket` (0: exactly `length + n`),
    so a graph serves every length up to its span. The columns past `length + n` are masked.
    Compaction, row selection and admission are index copies into the same buffers."""

    def __init__(self, row_slots: int, capacity: int, device: torch.device,
                 bucket: int = 0) -> None:
        self.row_slots, self.capacity, self.device = row_slots, capacity, device
        self.bucket = bucket
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.cache = SlotKV(self)
        self.lens: list[int] = []
        self.length = 0
        self.valid: torch.Tensor | None = None
        self.span = 0
        self._arange = torch.arange(capacity, device=device)
        self._write: dict[int, torch.Tensor] = {}

    def reset(self) -> None:
        """Empty (the buffers stay allocated; what they hold is masked until overwritten)."""
        self.lens, self.length, self.valid = [], 0, None

    def span_for(self, n: int) -> int:
        """The columns a forward of n new tokens attends over."""
        need = self.length + n
        if need > self.capacity:
            raise MCSDError(f"a forward of {n} tokens past {self.length} cached ones overflows "
                            f"the preallocated cache ({self.capacity} slots)")
        if not self.bucket:
            return need
        return min(self.capacity, -(-need // self.bucket) * self.bucket)

    def begin(self, n: int) -> torch.Tensor:
        """Prepare the next forward of n tokens: its span and the columns it writes (returned:
        the same tensor for every forward of n tokens, filled in place)."""
        self.span = self.span_for(n)
        idx = self._write.get(n)
        if idx is None:
            idx = self._write[n] = torch.empty(n, dtype=torch.long, device=self.device)
        torch.add(self._arange[:n], self.length, out=idx)
        return idx

    def mask(self, block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[rows, 1, n, span] additive mask: `RowCache.mask`'s, then the unused columns."""
        n, nb = block.shape[-2], block.shape[-1]
        ctx = self.length - (nb - n)
        span = self.span_for(n)
        m = torch.full((self.rows, 1, n, span), torch.finfo(dtype).min, dtype=dtype,
                       device=self.device)
        m[:, 0, :, ctx : ctx + nb] = block.to(dtype)
        if self.valid is None:
            m[:, :, :, :ctx] = 0
        else:
            m[:, :, :, :ctx] = 0
            m[:, 0, :, :ctx].masked_fill_(~self.valid[:, None, :ctx], torch.finfo(dtype).min)
        return m

    def select(self, rows: list[int]) -> None:
        if rows != list(range(len(rows))) and self.keys:
            idx = upload(rows, self.device, torch.long)
            for t in (*self.keys, *self.values):
                t[: len(rows)] = t[idx]
        self.lens = [self.lens[r] for r in rows]
        self._cut()

    def extend(self, other: RowCache) -> None:
        """Append the rows of `other` (a `RowCache` after a prefill) in the next row slots."""
        if self.rows + other.rows > self.row_slots:
            raise MCSDError(f"{self.rows + other.rows} rows exceed the cache's {self.row_slots}")
        layers = _layers(other.cache)
        if layers and not self.keys:
            self.allocate([(layer.keys, layer.values) for layer in layers])
        lo, n = self.rows, other.length
        for i, layer in enumerate(layers):
            self.keys[i][lo : lo + other.rows, :, :n] = layer.keys
            self.values[i][lo : lo + other.rows, :, :n] = layer.values
        self.lens = self.lens + other.lens
        self._cut()

    def allocate(self, like: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Allocate one layer's buffers per (keys, values) pair, shaped like them."""
        for k, v in like:
            shape = (self.row_slots, k.shape[1], self.capacity)
            self.keys.append(torch.zeros(*shape, k.shape[3], dtype=k.dtype, device=self.device))
            self.values.append(torch.zeros(*shape, v.shape[3], dtype=v.dtype,
                                           device=self.device))

    def _tensors(self) -> list[torch.Tensor]:
        return [*self.keys, *self.values]

    def _cut(self) -> None:
        self._prefixes()


class SlotKV(Cache):
    """The transformers `Cache` a model writes a `SlotRowCache` through: each layer's new keys
    and values go to the columns of `write_index`, and attention reads the first `span`; a
    ragged forward's arrive packed and go back into the grid (`RowKV`)."""

    ragged: Ragged | None = None

    def __init__(self, slots: SlotRowCache) -> None:
        super().__init__(layers=[])
        self.slots = slots

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.slots
        ragged = self.ragged
        if ragged is not None:
            key_states, value_states = ragged.unpack_heads(key_states), ragged.unpack_heads(
                value_states)
        if layer_idx >= len(s.keys):  # the first forward allocates, layer by layer
            s.allocate([(key_states, value_states)])
        rows, idx = key_states.shape[0], s._write[key_states.shape[2]]
        keys, values = s.keys[layer_idx][:rows], s.values[layer_idx][:rows]
        keys.index_copy_(2, idx, key_states)
        values.index_copy_(2, idx, value_states)
        return keys[:, :, : s.span], values[:, :, : s.span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.slots.length


# the caches a step runs over: the eager path's `RowCache`s or the fixed-shape `SlotRowCache`s
StepCache = RowCache | SlotRowCache
