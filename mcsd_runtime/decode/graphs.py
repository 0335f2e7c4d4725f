"""How the engine runs a model's forward (`DecodeConfig.graphs`).

- `EagerForwards` ("off", and "auto" off CUDA): the reference path. Each forward runs as
  transformers runs it, over `RowCache`s that grow and shrink with the rows.
- `FixedForwards` ("on", and "auto" on CUDA): every decode forward has a fixed shape. Both models'
  caches are `SlotRowCache`s, preallocated once per decoder and kept across calls. A forward
  writes its keys and values at columns that a device tensor gives, and it attends over a
  bucketed span of columns. On CUDA each shape is then captured once as a CUDA graph and
  replayed. The shape is (model, rows, new tokens, span, logits kept, states returned), rows
  padded to a power of two with idle rows, so a batch whose rows retire reuses few graphs. Replay
  launches the whole forward at once, so the GPU is not kept waiting on Python. On a CPU the
  same fixed-shape forwards run without capture: that is what the tests check against eager.
  Prefills stay eager (one per admission, of any length) and are copied into the slots.
  Ragged forwards (`ragged.Ragged`) take this path too: their packed total is bucketed and the
  layout's index is one more input of the graph, so a graph is kept per total bucket.

A capture that fails, or memory that runs out, falls back to eager forwards over the same
caches, with one warning: decoding stays correct. On CUDA both paths pin scaled-dot-product
attention to the memory-efficient kernel (the math one as a fallback): it takes any additive mask
and captures, where the cuDNN kernel builds a plan for every new key length (tens of ms) and
costs host time on every call.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from mcsd_runtime.backend.compat import cache_kwargs
from mcsd_runtime.decode.cache import RowCache, SlotRowCache
from mcsd_runtime.decode.ragged import RAGGED_BUCKET, Ragged, packed_into

# told about every graph replay, which a model's forward hooks never see (a replay runs no
# Python): objects with `replay_started(model, ids, cache)` and `replay_done(model, ids)`, e.g.
# the cost profile's `ForwardTimer`
REPLAY_OBSERVERS: list = []
SPAN_BUCKET = 64  # a fixed-shape forward attends over a multiple of this many cached columns
MAX_GRAPHS = 512  # past this many shapes, new shapes run eagerly (over the same caches)


@dataclass
class ForwardOut:
    logits: torch.Tensor  # [rows, kept, V]
    hidden: torch.Tensor | None  # the last layer's states [rows, n, H], when asked


Forward = Callable[..., ForwardOut]  # `Engine.forward`: one timed forward over a cache


def call_model(model, cache: RowCache | SlotRowCache, ids: torch.Tensor, pos: torch.Tensor,
               mask: torch.Tensor, keep: int, hidden: bool,
               prev: torch.Tensor | None = None, ragged: Ragged | None = None) -> ForwardOut:
    """One forward of ids [rows, n] at positions pos with the additive mask over `cache`;
    `prev` [rows, n, H]: a feature draft's input states. With a `ragged` layout only each row's
    real tokens go through the model, packed into one sequence (`mcsd_runtime.decode.ragged`);
    the outputs come back in the [rows, n] grid, zeros in the padding."""
    extra: dict[str, Any] = {} if prev is None else {"prev_hidden": prev}  # model kwargs
    if ragged is not None:
        ids, pos = ragged.pack(ids), ragged.pack(pos)
        extra = {k: ragged.pack(v) for k, v in extra.items()} | {"ragged": ragged}
    with packed_into(cache.cache, ragged):
        out = model(input_ids=ids, position_ids=pos, attention_mask=mask,
                    **cache_kwargs(model, cache.cache), use_cache=True,
                    logits_to_keep=0 if ragged is not None else keep,
                    output_hidden_states=hidden, **extra)
    logits, states = out.logits, out.hidden_states[-1] if hidden else None
    if ragged is not None:
        logits = ragged.unpack(logits)[:, -keep:] if keep else ragged.unpack(logits)
        states = None if states is None else ragged.unpack(states)
    return ForwardOut(logits, states)


def make_forwards(graphs: str, device: torch.device) -> EagerForwards | FixedForwards:
    """The forwards `DecodeConfig.graphs` asks for on `device`."""
    cuda = device.type == "cuda"
    if graphs == "off" or (graphs == "auto" and not cuda):
        return EagerForwards(device)
    return FixedForwards(device, capture=cuda)


def attention(device: torch.device) -> contextlib.AbstractContextManager:
    """The attention kernels of decode forwards on `device` (see the module docstring)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def row_bucket(rows: int, slots: int) -> int:
    """The rows a fixed-shape forward runs: the next power of two, at most the cache's rows."""
    return min(slots, 1 << (rows - 1).bit_length())


def pad_rows(n: int, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
             prev: torch.Tensor | None) -> tuple:
    """The inputs with idle rows up to n: token 0 at position 0, seeing every column (finite
    scores, no empty softmax). They write to the cache's free row slots, never read."""
    extra = n - ids.shape[0]
    if not extra:
        return ids, pos, mask, prev
    grow = lambda t: torch.cat([t, t.new_zeros(extra, *t.shape[1:])])  # noqa: E731
    return grow(ids), grow(pos), grow(mask), None if prev is None else grow(prev)


class EagerForwards:
    """Forwards as transformers runs them, over growing caches."""

    kind = "eager"  # what `DecodeStats.forwards` reports

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def caches(self, rows: int, capacity: int) -> tuple[RowCache, RowCache]:
        """Empty caches for the target and the draft of a call decoding up to `rows` rows of
        at most `capacity` tokens."""
        return RowCache(0, self.device), RowCache(0, self.device)

    def __call__(self, model, cache, ids, pos, mask, keep, hidden, prev=None,
                 ragged: Ragged | None = None) -> ForwardOut:
        with attention(self.device):
            return call_model(model, cache, ids, pos, mask, keep, hidden, prev, ragged)


class FixedForwards:
    """Fixed-shape forwards over preallocated caches, captured as CUDA graphs when `capture`
    (see the module docstring)."""

    def __init__(self, device: torch.device, capture: bool, bucket: int = SPAN_BUCKET) -> None:
        self.device, self.capture, self.bucket = device, capture, bucket
        self._caches: tuple[SlotRowCache, SlotRowCache] | None = None
        self.graphs: dict[tuple, Graph | None] = {}  # None: this shape runs eagerly
        self.pool: object | None = None  # the graphs' memory pool, made at the first capture

    @property
    def kind(self) -> str:
        """What `DecodeStats.forwards` reports: captured, or fixed (no capture)."""
        return "captured" if self.capture else "fixed"

    def caches(self, rows: int, capacity: int) -> tuple[SlotRowCache, SlotRowCache]:
        """The decoder's two slot caches, emptied; reallocated (and every graph dropped) when
        a call needs more rows or columns than they hold."""
        have = self._caches
        if have is None or have[0].row_slots < rows or have[0].capacity < capacity:
            if have is not None:  # grow, never shrink: a later call may be as large again
                rows, capacity = max(rows, have[0].row_slots), max(capacity, have[0].capacity)
            self.graphs.clear()
            self._caches = None  # free the old buffers before allocating the new ones
            capacity = -(-capacity // self.bucket) * self.bucket
            target, draft = (SlotRowCache(rows, capacity, self.device, self.bucket)
                             for _ in range(2))
            self._caches = have = (target, draft)
        for c in have:
            c.reset()
        return have

    def __call__(self, model, cache, ids, pos, mask, keep, hidden, prev=None,
                 ragged: Ragged | None = None) -> ForwardOut:
        if not isinstance(cache, SlotRowCache):  # a prefill: eager, then copied into slots
            with attention(self.device):
                return call_model(model, cache, ids, pos, mask, keep, hidden, prev, ragged)
        cache.begin(ids.shape[1])
        rows = ids.shape[0]
        n = row_bucket(rows, cache.row_slots)
        ids, pos, mask, prev = pad_rows(n, ids, pos, mask, prev)
        if ragged is not None:  # idle rows hold no tokens; the total is bucketed
            ragged = ragged.padded(n, RAGGED_BUCKET)
        with attention(self.device):
            out = self._run(model, cache, ids, pos, mask, keep, hidden, prev, ragged)
        if ids.shape[0] == rows:
            return out
        return ForwardOut(out.logits[:rows], None if out.hidden is None else out.hidden[:rows])

    def _run(self, model, cache, ids, pos, mask, keep, hidden, prev, ragged) -> ForwardOut:
        if not self.capture:
            return call_model(model, cache, ids, pos, mask, keep, hidden, prev, ragged)
        key = (id(model), id(cache), *ids.shape, mask.shape[-1], keep, hidden, prev is not None,
               None if ragged is None else ragged.size)
        inputs = {"ids": ids, "pos": pos, "mask": mask}
        if prev is not None:
            inputs["prev"] = prev
        if ragged is not None:
            inputs["index"] = ragged.index
        if key not in self.graphs:
            self.graphs[key] = self._capture(model, cache, keep, hidden, inputs)
        graph = self.graphs[key]
        if graph is None:
            return call_model(model, cache, ids, pos, mask, keep, hidden, prev, ragged)
        for obs in REPLAY_OBSERVERS:
            obs.replay_started(model, ids, cache)
        out = graph.replay(inputs)
        for obs in REPLAY_OBSERVERS:
            obs.replay_done(model, ids)
        return out

    def _capture(self, model, cache: SlotRowCache, keep: int, hidden: bool,
                 inputs: dict[str, torch.Tensor]) -> Graph | None:
        if len(self.graphs) >= MAX_GRAPHS:
            return None

        def run(ids, pos, mask, prev=None, index=None) -> ForwardOut:
            ragged = None if index is None else Ragged.over(index, ids.shape[0], ids.shape[1])
            return call_model(model, cache, ids, pos, mask, keep, hidden, prev, ragged)

        try:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            return Graph(run, inputs, self.pool)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as err:
            self.capture = False  # every later forward runs eagerly over the same caches
            warnings.warn(f"CUDA graph capture failed ({type(err).__name__}: {err}); decoding "
                          f"continues with eager forwards (DecodeConfig.graphs='off' skips "
                          f"capture)", RuntimeWarning, stacklevel=3)
            return None


class Graph:
    """One forward captured as a CUDA graph, with its own input buffers."""

    def __init__(self, run, inputs: dict[str, torch.Tensor], pool) -> None:
        self.inputs = {k: v.clone() for k, v in inputs.items()}
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: writes the cache columns the replay rewrites
            run(**self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = run(**self.inputs)

    def replay(self, inputs: dict[str, torch.Tensor]) -> ForwardOut:
        """Copy `inputs` in, replay, and return copies of the outputs (the next replay of any
        graph may reuse their memory)."""
        for name, value in inputs.items():
            self.inputs[name].copy_(value)
        self.graph.replay()
        out = self.out
        return ForwardOut(out.logits.clone(), None if out.hidden is None else out.hidden.clone())
