"""What one stop decision costs inside the decoder: the frontier's features, then the stopper.

`decision_cost(stopper, vocab_size, pair=None)` decodes with the given pair, or a small random
Llama pair of that vocabulary (so the proposing distributions are as wide as a real model's),
and times every
`should_continue` call from the decoder's own frontier: features computed the way the decoder
computes them, on the distributions it drafted from. Forwards are not timed. The median is
reported, and the fastest tenth (robust to other load on a shared machine).

`bench_latency(stopper, n)` times the stopper alone, on the decoder's frontier over a random
draft (`bench_frontier`).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from mcsd_runtime.decisions.builtin import Frontier, Stopper, StopperBase, make_stopper
from mcsd_runtime.decisions.features import TOP_K_MASS, Trajectory
from mcsd_runtime.tree import Tree, TreeTensors


class _Timed(StopperBase):
    """A stopper wrapper that records the seconds of each `should_continue`."""

    def __init__(self, inner: Stopper) -> None:
        self.inner, self.seconds = inner, []
        self.needs_hidden = inner.needs_hidden

    def reset(self) -> None:
        self.inner.reset()

    def update(self, drafted: int, accepted: int) -> None:
        self.inner.update(drafted, accepted)

    def check_tree(self, k_config: tuple[int, ...]) -> None:
        self.inner.check_tree(k_config)

    def should_continue(self, frontier: Frontier) -> bool:
        t0 = time.perf_counter()
        go = self.inner.should_continue(frontier)
        self.seconds.append(time.perf_counter() - t0)
        return go


def random_pair(vocab_size: int, hidden: int = 64, seed: int = 0):
    """A one-layer random Llama target and draft sharing a vocabulary (no tokenizer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mcsd_runtime.models.pair import Pair

    def model(s: int) -> LlamaForCausalLM:
        torch.manual_seed(s)
        cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                          max_position_embeddings=512, attn_implementation="sdpa",
                          bos_token_id=None, eos_token_id=None, pad_token_id=None)
        return LlamaForCausalLM(cfg).eval()

    return Pair(model(seed), model(seed + 1))


def decision_cost(stopper: Stopper | str, vocab_size: int, k_config=(1, 1, 1, 1, 1, 1, 1, 1),
                  prompts: int = 4, max_new_tokens: int = 48, seed: int = 0,
                  pair=None) -> dict:
    """Seconds per `should_continue` inside `MCSDDecoder` (greedy) at `vocab_size`, with `pair`
    when given (the pair the stopper will run with: its forwards between two decisions evict
    what the decision needs from the CPU's caches as a real decode does), else a one-layer
    random pair of that vocabulary."""
    from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder

    pair = pair or random_pair(vocab_size, seed=seed)
    timed = _Timed(make_stopper(stopper))
    dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, max_new_tokens=max_new_tokens),
                      stopper=timed)
    gen = torch.Generator().manual_seed(seed)
    dec.generate(torch.randint(0, vocab_size, (8,), generator=gen).tolist())  # warm-up
    timed.seconds.clear()
    for _ in range(prompts):
        dec.generate(torch.randint(0, vocab_size, (8,), generator=gen).tolist())
    us = sorted(s * 1e6 for s in timed.seconds)
    if not us:
        return {"vocab_size": vocab_size, "decisions": 0}
    return {"vocab_size": vocab_size, "decisions": len(us), "median_us": statistics.median(us),
            "fast_us": statistics.median(us[: max(1, len(us) // 10)]),
            "threads": torch.get_num_threads()}


def bench_frontier(n: int = 16, hidden_size: int | None = None, depth: int = 4,
                   vocab_size: int = 256, seed: int = 0) -> Frontier:
    """The decoder's own frontier over a random draft: `n` nodes at `depth` of the tree
    (1, ..., 1, n), proposed greedily by one random distribution over `vocab_size` tokens (with
    a random hidden state of `hidden_size`, if given), after a few steps of trajectory."""
    from mcsd_runtime.decode.decoder import DraftFrontier, DraftLayer

    gen = torch.Generator().manual_seed(seed)
    tree = Tree((1,) * (depth - 1) + (n,))
    tt = TreeTensors.build(tree, torch.device("cpu"), torch.float32)
    q = torch.softmax(3 * torch.randn(1, vocab_size, generator=gen), -1)
    top, toks = q.topk(max(n, TOP_K_MASS), dim=-1)
    prob = q.gather(1, toks[:, :n]).view(-1)
    hidden = torch.randn(1, hidden_size, generator=gen) if hidden_size else None
    layer = DraftLayer(toks[:, :n].reshape(-1), q, hidden, prob, prob.log() - 0.5 * (depth - 1),
                       top[:, :TOP_K_MASS])
    trajectory = Trajectory(tokens_generated=24, prev_accepted=2, accepted=16, tried=20,
                            recent_accepted=5, recent_tried=7)
    return DraftFrontier(layer, depth, depth, tt, trajectory)


def bench_latency(stopper: Stopper, n: int = 16, repeats: int = 3000,
                  hidden_size: int | None = None, seed: int = 0) -> dict:
    """Median cost (µs) of one `should_continue` on a `bench_frontier` of `n` nodes, on CPU, with
    the frontier's device work cached after the first call: the stopper alone (`decision_cost`
    measures a decision inside the decoder)."""
    fr = bench_frontier(n, hidden_size, seed=seed)
    for _ in range(50):
        stopper.should_continue(fr)
    chunks = []
    per = max(repeats // 10, 1)
    for _ in range(10):
        t0 = time.perf_counter()
        for _ in range(per):
            stopper.should_continue(fr)
        chunks.append((time.perf_counter() - t0) / per * 1e6)
    return {"frontier_size": n, "median_us": statistics.median(chunks), "min_us": min(chunks),
            "threads": torch.get_num_threads()}


def vocab_size(fp: dict | None) -> int | None:
    """The target's vocabulary size from its config.json, when the pair is a local folder."""
    try:
        cfg = json.loads((Path(fp["target"]) / "config.json").read_text())
        return int(cfg["vocab_size"])
    except (TypeError, KeyError, OSError, ValueError):
        return None


def stopper_latency(stopper: Stopper, hidden_size: int | None, fp: dict | None,
                    k_config: tuple[int, ...] | None) -> dict:
    """The model's latency at a 16-node frontier and, for a local pair on scalar features, the
    cost of a whole decision inside the decoder (`in_decoder_us`). Measured with the
    collection's own pair where it is a small local one (`in_decoder_pair`: "collection"): its
    forwards evict the caches a decision reads, as in a real decode, and the median is charged
    (on the default toy pair the decoder pays about 3x what a one-layer random pair shows).
    Otherwise a random pair of the vocabulary stands in, and its fastest tenth is charged."""
    latency = bench_latency(stopper, 16, repeats=1000, hidden_size=hidden_size)
    latency["batch_row_us"] = batch_row_latency(stopper, hidden_size)
    vocab = vocab_size(fp)
    if vocab and hidden_size is None:
        pair = small_local_pair(fp)
        cost = decision_cost(stopper, vocab, k_config or (1, 1, 1, 1), pair=pair)
        latency["in_decoder_us"] = cost.get("median_us" if pair else "fast_us")
        latency["in_decoder_pair"] = "collection" if pair else "random"
        latency["in_decoder"] = cost
    return latency


def batch_row_latency(stopper: Stopper, hidden_size: int | None, rows: int = 8,
                      repeats: int = 300) -> float:
    """µs that each row beyond the first adds to one `batch_continue` call (16-node frontiers,
    medians of chunks): what a batched decision costs on top of a single one."""
    import statistics

    fronts = [bench_frontier(16, hidden_size, seed=i) for i in range(rows)]

    def median_us(frontiers: list) -> float:
        chunks = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(repeats // 7 + 1):
                stopper.batch_continue(frontiers)
            chunks.append((time.perf_counter() - t0) / (repeats // 7 + 1) * 1e6)
        return statistics.median(chunks)

    median_us(fronts)  # warm-up
    return max(0.0, (median_us(fronts) - median_us(fronts[:1])) / (rows - 1))


SMALL_PAIR_BYTES = 1 << 30  # the decision benchmark loads the collection's pair up to this size


def small_local_pair(fp: dict | None):
    """The collection's pair on the CPU when both models are local folders holding at most
    SMALL_PAIR_BYTES of weights, else None."""
    from mcsd_runtime.models.pair import load_pair

    try:
        folders = [Path(fp["target"]), Path(fp["draft"])]
    except (TypeError, KeyError):
        return None
    if not all(f.is_dir() for f in folders):
        return None
    size = sum(w.stat().st_size for f in folders for w in f.glob("*.safetensors"))
    if not size or size > SMALL_PAIR_BYTES:
        return None
    try:
        return load_pair(str(folders[0]), str(folders[1]), device="cpu", dtype="float32")
    except Exception:  # noqa: BLE001 - a pair that does not load falls back to a random one
        return None
