"""Ragged forwards: every row's new tokens packed into one sequence, so a forward costs what
the batch's rows really process, not rows x the widest row.

The engine lays a forward out as a padded grid, [rows, width] new tokens (a row's tree, its
pending draft tokens, the nodes of one draft depth). A `Ragged` layout says how many of each
row's slots are real: the first `counts[r]` (a row's tokens are a prefix of its grid row: a
tree's nodes come depth by depth, so every real token's ancestors are real). A ragged forward
runs the model over ids [1, total] at their own positions: embeddings, projections, MLPs and the
head cost `total` tokens. Only where rows must stay apart is the grid rebuilt:

- the KV caches (`cache.RowKV`, `cache.SlotKV`) take each layer's new keys and values back into
  the grid ([rows, heads, width, dim], zeros in the padding slots) before appending them, so
  the caches and their bookkeeping are those of a padded forward;
- attention (`mcsd_runtime.models.attention`, `mcsd_sdpa`) puts the queries back into the grid,
  attends each row over its own cache and tree under the usual [rows, 1, width, keys] mask,
  and packs the outputs again.

No modeling code is forked: the layout reaches the attention function as the keyword `ragged`,
which transformers passes down from the model's forward, and the cache as its `ragged`
attribute for the forward's duration (`packed_into`): transformers 5.24 hands a layer's keywords
to `Cache.update`, 5.17-5.19 hand it none, so the attribute serves every release. A padding slot's
keys and values are zeros that no real token sees: a tree's mask lets a node see its ancestors
only, and compaction keeps only accepted paths. Attention itself stays padded (cheap next to
the projections at decode sizes); the padding's queries are computed and dropped.

Fixed-shape forwards (`graphs.FixedForwards`) run ragged too: rows padded to a power of two
with idle rows (no tokens), the packed total to a multiple of `RAGGED_BUCKET`, so that on CUDA
a graph is captured per (rows, width, total bucket) and replayed with the layout's index as one
of its inputs.

Models must run the `mcsd_sdpa` attention (`load_pair`'s default) to run ragged; the engine
falls back to padded forwards otherwise (`supports_ragged`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

from mcsd_runtime.pricing.step_model import RAGGED_FILL, packs
from mcsd_runtime.transfer import upload

RAGGED_BUCKET = 8  # a fixed-shape ragged forward's packed tokens: a multiple of this


class Ragged:
    """The layout of one ragged forward: row r's real tokens are the first `counts[r]` of its
    `width` grid slots. With a `bucket`, the packed sequence is padded to a multiple of it with
    tokens that read and write a scratch slot past the grid (a fixed-shape forward's total, so
    that a captured graph serves every total up to its bucket). `index` (the packed tokens'
    grid slots) is uploaded when first used."""

    def __init__(self, counts: list[int], width: int, device: torch.device,
                 bucket: int = 0) -> None:
        if any(not 0 <= n <= width for n in counts):
            raise ValueError(f"ragged counts {counts} must lie in [0, {width}]")
        self.counts, self.rows, self.width = list(counts), len(counts), width
        self.device, self.bucket = device, bucket
        self.total = sum(counts)
        self.size = max(bucket, -(-self.total // bucket) * bucket) if bucket else self.total
        self._index: torch.Tensor | None = None

    @classmethod
    def over(cls, index: torch.Tensor, rows: int, width: int) -> Ragged:
        """The layout a captured graph replays: its own `index` buffer over a rows x width
        grid (the counts are the buffer's business)."""
        out = cls([], width, index.device)
        out.rows, out.size, out.total, out._index = rows, index.numel(), index.numel(), index
        return out

    @property
    def index(self) -> torch.Tensor:
        if self._index is None:
            scratch = self.rows * self.width
            flat = [r * self.width + j for r, n in enumerate(self.counts) for j in range(n)]
            self._index = upload(flat + [scratch] * (self.size - len(flat)), self.device,
                                 torch.long)
        return self._index

    def padded(self, rows: int, bucket: int) -> Ragged:
        """The same layout over `rows` rows (the extra ones idle: no tokens), its total padded
        to a multiple of `bucket`."""
        return Ragged(self.counts + [0] * (rows - self.rows), self.width, self.device, bucket)

    @staticmethod
    def needed(counts: list[int], width: int) -> bool:
        """Whether a forward of these counts is worth packing: its real tokens fill at most
        `RAGGED_FILL` of the padded grid."""
        return packs(counts, width, RAGGED_FILL)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """[rows, width, ...] -> [1, size, ...]: the real slots, row after row (then the
        scratch slot's zeros, where padded)."""
        flat = t.reshape(self.rows * self.width, *t.shape[2:])
        flat = torch.cat([flat, flat.new_zeros(1, *t.shape[2:])])
        return flat[self.index][None]

    def unpack(self, t: torch.Tensor) -> torch.Tensor:
        """[1, size, ...] -> [rows, width, ...]: back into the grid, zeros in the padding."""
        grid = t.new_zeros(self.rows * self.width + 1, *t.shape[2:])
        grid[self.index] = t[0]
        return grid[:-1].view(self.rows, self.width, *t.shape[2:])

    def unpack_heads(self, t: torch.Tensor) -> torch.Tensor:
        """[1, heads, size, dim] -> [rows, heads, width, dim] (keys, values, queries)."""
        return self.unpack(t.transpose(1, 2)).transpose(1, 2)


@contextlib.contextmanager
def packed_into(cache, ragged: Ragged | None) -> Iterator[None]:
    """The transformers cache `cache` (a `cache.RowKV` or `cache.SlotKV`) takes its layers' keys
    and values in the `ragged` layout while the block runs (its `ragged` attribute; None:
    padded)."""
    cache.ragged = ragged
    try:
        yield
    finally:
        cache.ragged = None


def supports_ragged(model) -> bool:
    """Whether `model` attends with `mcsd_sdpa`, which knows ragged layouts."""
    from mcsd_runtime.models.attention import NAME

    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == NAME


class Packing:
    """How an engine's forwards lay out their rows: padded (`ragged` False: every row at the
    forward's width) or ragged (only each row's real tokens, packed into one sequence, where
    the rows' counts differ)."""

    def __init__(self, ragged: bool, device: torch.device) -> None:
        self.ragged, self.device = ragged, device

    def layout(self, counts: list[int] | None, width: int) -> Ragged | None:
        """The packed layout of a forward whose rows hold `counts` real tokens of `width`
        (None: padded)."""
        if not self.ragged or counts is None or not Ragged.needed(counts, width):
            return None
        return Ragged(counts, width, self.device)

    def takes(self, real: bool) -> bool:
        """Whether a row goes through a forward, `real` whether it has tokens of its own there:
        padded forwards take every row."""
        return real or not self.ragged


def packing_for(dec, batch_size: int) -> Packing:
    """The packing of an engine of `dec` at `batch_size`: ragged where asked for
    (`DecodeConfig.batch_layout`), with more than one row, lossless init (target-initialized
    candidates decode batches of one), and both models on `mcsd_sdpa` (else one warning, and
    padded forwards)."""
    return Packing(_ragged_ok(dec, batch_size), dec.pair.device)


def _ragged_ok(dec, batch_size: int) -> bool:
    cfg = dec.config
    if cfg.batch_layout != "ragged" or batch_size <= 1 or cfg.init != "draft":
        return False
    models = [dec.pair.target] + ([dec.pair.draft] if dec.tree.depth else [])
    odd = [m for m in models if not supports_ragged(m)]
    if odd:
        names = ", ".join(sorted({str(getattr(m.config, "_attn_implementation", "?"))
                                  for m in odd}))
        warnings.warn(f"batch_layout='ragged' needs models loaded with attn_implementation="
                      f"'mcsd_sdpa' (load_pair's default), not {names}: the batch runs padded",
                      RuntimeWarning, stacklevel=3)
        return False
    return True
