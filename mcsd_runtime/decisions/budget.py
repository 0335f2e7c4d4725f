"""The verification budget of a ragged batch step: which drafted tokens each row verifies, and
which rows draft one more depth, chosen by expected committed tokens per second of the step.

Pure functions over plain Python floats (no torch, no numpy): the engine calls them once per
draft depth and once before the target's forward, replay calls the same ones. Costs come in as
callables, typically bound to a cost profile's ragged prices
(`CostProfile.ragged_target` / `ragged_draft`).

Terms, per row `r` of the batch (one chain of drafted tokens per row):

- **survival** `survival[r][j]`: the probability that the row's first `j + 1` drafted tokens
  are all accepted (the product along the path of per-token acceptance estimates). Non-increasing
  in `j`; the functions enforce it with a running minimum, so a child never outranks its parent.
- **expected committed tokens** of a step: one per row (the target's bonus or residual token,
  counted 1) plus the survival of every verified drafted token.
- **step seconds** `step_s(T)`: seconds of the whole step when `T` tokens are verified in total
  over all rows (`T >= rows`: each row's bonus token is verified anyway). It should include what
  the step has already paid (its draft forwards, the per-step overheads), so that its ratio is
  the step's real rate; it must not decrease with `T`.
- **rate** (tokens per second): what one second of the step is worth. `None` (the default)
  maximises the step's own ratio, expected tokens / step seconds; a number `lam` (e.g. the
  run's throughput so far) maximises expected tokens - `lam` x seconds instead, the per-step
  form of maximising the run's tokens per second (Dinkelbach).

`verify_counts(survival, step_s, rate=None) -> list[int]`
    How many drafted tokens each row verifies (0..len(survival[r])). Every drafted token of the
    batch is ranked by survival (highest first; among equals a parent before its child, then the
    lower row); the function admits the first `m` of that order, for the `m` (0..all) that
    maximises expected tokens / `step_s(rows + m)` (or tokens - rate x seconds). Ties keep the
    smaller `m`, so a token of survival 0 is never verified when it costs anything. With
    survival exactly 1 up to a row's accepted length L and 0 after, and a step cost whose
    seconds per verified token fall as T grows (any affine cost with a positive floor), it
    verifies exactly min(L, drafted) per row: the hindsight oracle's choice.
    Cost: one sort of the drafted tokens and one `step_s` call per candidate count.

`draft_rows(survival, accept, draft_s, step_s, verified, expected, feed=None, rate=None)
-> list[int]`
    Before draft depth d (d = 1 included: whether to draft at all), which of the candidate rows
    draft it. Inputs, one entry per candidate row (the rows still drafting; before depth 1,
    every row that may draft):
    - `survival[r]`: the survival of the row's deepest drafted token so far (1.0 before depth
      1: the empty path always survives);
    - `accept[r]`: the predicted probability that the row's next token (at depth d) is accepted
      given that its path so far is; the new token's survival is `survival[r] * accept[r]`,
      which is also what drafting it is expected to return;
    - `draft_s(tokens, rows)`: seconds of depth d's draft forward over `rows` rows feeding
      `tokens` tokens in all (0 rows: no forward, 0 seconds; its floor is what a step with no
      draft saves);
    - `feed[r]`: tokens row r feeds that forward (default 1 each; before depth 1, its
      draft-pending tokens);
    - `step_s(T)`, `verified`, `expected`: the step's seconds at T verified tokens (as above,
      including the draft forwards paid so far), the tokens planned for verification so far
      (rows + drafted tokens) and the expected committed tokens so far.
    Rows are ranked by `survival * accept` (highest first, ties by row); the first `k` of them
    draft, for the `k` (0..n) that maximises (expected + their gain) / (step_s(verified + k) +
    draft_s(their feed, k)), or gain - rate x seconds. Ties keep the smaller `k`: no row drafts
    when the forward's floor is not paid back. With a fixed `rate`, a draft forward that costs
    more, by an amount that does not fall as rows are added, never makes more rows draft; with
    `rate=None` a costlier floor can stop every row from drafting, but once the forward pays
    at all the step's ratio may spread its floor over more rows. With survival 1 before depth
    d and `accept` 1 for rows whose accepted length reaches d (0 otherwise), a cheap enough
    draft drafts exactly those rows: depth by depth, the hindsight oracle's depths.
    Returns the chosen rows' indices, ascending. Cost: one sort and one `draft_s` and one
    `step_s` call per candidate count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_EPS = 1e-12  # a choice must beat the smaller one by more than this (relative) to be taken


def _better(value: float, best: float) -> bool:
    return value > best + _EPS * max(1.0, abs(best))


def _score(tokens: float, seconds: float, rate: float | None) -> float:
    if rate is None:
        return tokens / seconds if seconds > 0 else float("inf") if tokens > 0 else 0.0
    return tokens - rate * seconds


def _non_increasing(values: Sequence[float]) -> list[float]:
    out, low = [], 1.0
    for v in values:
        low = min(low, max(float(v), 0.0))
        out.append(low)
    return out


def verify_counts(survival: Sequence[Sequence[float]], step_s: Callable[[int], float],
                  rate: float | None = None) -> list[int]:
    """How many drafted tokens each row verifies; the contract is in the module docstring."""
    rows = len(survival)
    ranked = sorted(((-s, j, r) for r, row in enumerate(survival)
                     for j, s in enumerate(_non_increasing(row))))
    tokens = float(rows)
    best, best_m = _score(tokens, step_s(rows), rate), 0
    for m, (neg, _, _) in enumerate(ranked, 1):
        tokens -= neg
        value = _score(tokens, step_s(rows + m), rate)
        if _better(value, best):
            best, best_m = value, m
    counts = [0] * rows
    for _, j, r in ranked[:best_m]:
        counts[r] = max(counts[r], j + 1)
    return counts


def draft_rows(survival: Sequence[float], accept: Sequence[float],
               draft_s: Callable[[int, int], float], step_s: Callable[[int], float],
               verified: int, expected: float, feed: Sequence[int] | None = None,
               rate: float | None = None) -> list[int]:
    """Which candidate rows draft the next depth; the contract is in the module docstring."""
    n = len(survival)
    feed = [1] * n if feed is None else feed
    gains = [max(float(s), 0.0) * min(max(float(a), 0.0), 1.0)
             for s, a in zip(survival, accept, strict=True)]
    order = sorted(range(n), key=lambda r: (-gains[r], r))
    best, best_k = _score(expected, step_s(verified), rate), 0
    tokens, fed = expected, 0
    for k, r in enumerate(order, 1):
        tokens += gains[r]
        fed += feed[r]
        value = _score(tokens, step_s(verified + k) + draft_s(fed, k), rate)
        if _better(value, best):
            best, best_k = value, k
    return sorted(order[:best_k])
