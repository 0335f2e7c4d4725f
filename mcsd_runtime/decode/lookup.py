"""Prompt lookup: a draft that costs no forward. The longest suffix of the context (prompt and
output so far), `max_ngram` tokens down to `min_ngram`, is looked up in the context before it; the
tokens that followed its latest earlier occurrence are proposed as a chain (as in prompt lookup
decoding and vLLM's n-gram proposer). Verification treats them as drawn from a one-hot
distribution, so greedy and sampled decoding stay lossless."""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from mcsd_runtime.decode.state import DraftLayer


def propose(context: list[int], k: int, min_ngram: int, max_ngram: int) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the context's longest
    matching suffix of `max_ngram`..`min_ngram` tokens; [] when none occurs."""
    if k < 1 or len(context) <= min_ngram:
        return []
    ctx = np.asarray(context, dtype=np.int64)
    for n in range(min(max_ngram, len(ctx) - 1), min_ngram - 1, -1):
        # windows ending before the last token: each has a token after it
        windows = sliding_window_view(ctx[:-1], n)
        hits = np.flatnonzero((windows == ctx[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return ctx[start : start + k].tolist()
    return []


def chain_layers(tokens: list[int], vocab_size: int, device: torch.device,
                 dtype: torch.dtype) -> list[DraftLayer]:
    """One depth per proposed token, each proposed by a one-hot distribution (q(x) = 1)."""
    toks = torch.tensor(tokens, dtype=torch.long, device=device)
    one_hot = torch.zeros(len(tokens), vocab_size, dtype=dtype, device=device)
    one_hot[torch.arange(len(tokens), device=device), toks] = 1.0
    ones = torch.ones(1, dtype=dtype, device=device)
    zeros = torch.zeros(1, dtype=dtype, device=device)
    return [DraftLayer(toks[i : i + 1], one_hot[i : i + 1], None, ones, zeros, None)
            for i in range(len(tokens))]
