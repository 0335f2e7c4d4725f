"""Prompt lookup: a draft that costs no forward. The longest suffix of the context (prompt and
output so far), `max_ngram` tokens down to `min_ngram`, is looked up in the context before it; the
tokens that followed its latest earlier occurrence are proposed as a chain (as in prompt lookup
decoding and vLLM's n-gram proposer). Verification treats them as drawn from a one-hot
distribution, so greedy and sampled decoding stay lossless (`decode.proposers.chain_layers`
makes the chain the draft layers the engine verifies)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


@dataclass(frozen=True)
class Match:
    """Where the context's suffix occurred before, and what followed it."""

    tokens: list[int]  # the proposed chain: what followed the latest earlier occurrence
    ngram: int  # the matched suffix's length
    start: int  # the chain's position in the context
    hits: int  # earlier occurrences of the suffix
    agree: float  # share of those occurrences followed by the chain's first token

    def distance(self, context_len: int) -> int:
        """How far back the chain starts."""
        return context_len - self.start


def find_match(context: list[int], k: int, min_ngram: int, max_ngram: int) -> Match | None:
    """Up to `k` tokens that followed the latest earlier occurrence of the context's longest
    matching suffix of `max_ngram`..`min_ngram` tokens, with the match's statistics; None when
    none occurs."""
    if k < 1 or len(context) <= min_ngram:
        return None
    ctx = np.asarray(context, dtype=np.int64)
    for n in range(min(max_ngram, len(ctx) - 1), min_ngram - 1, -1):
        # windows ending before the last token: each has a token after it
        windows = sliding_window_view(ctx[:-1], n)
        hits = np.flatnonzero((windows == ctx[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            chain = ctx[start : start + k]
            agree = float((ctx[hits + n] == chain[0]).mean())
            return Match(chain.tolist(), n, start, int(hits.size), agree)
    return None


def propose(context: list[int], k: int, min_ngram: int, max_ngram: int) -> list[int]:
    """The chain `find_match` proposes, or []."""
    match = find_match(context, k, min_ngram, max_ngram)
    return match.tokens if match is not None else []

