"""Replaying prompt-lookup copy lengths over the target's outputs (`collect.outputs.Trace`).

A `Replay` holds one output's prompt-lookup matches at every position and walks the output
under a copy rule (`Choose`: a match and its features -> tokens to copy), priced by a cost
profile: a step verifying k copied tokens costs `step_costs()[k]`. Beside a draft, a step that
copies nothing drafts the tree's first depth instead, as `lookup-learned:PATH+static:1` decodes
(`draft_step_costs`, and the trace's `hits`). What a step commits and leaves pending follows
`mcsd_runtime.costmodel.step_model` (`copy_outcome`, `step_outcome`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from collect.outputs import Trace
from mcsd_runtime.costmodel.profile import CostProfile
from mcsd_runtime.costmodel.step_model import copy_outcome, step_outcome
from mcsd_runtime.lookup import Match, find_match
from mcsd_runtime.stop.copy_length import CopyHistory, drafted_step, features

BESIDE = "static:1"  # what a step that copies nothing drafts, beside a draft (`--k-config`)


Choose = Callable[[Match, list[float], "tuple[float, float] | None"], int]


def step_costs(profile: CostProfile, max_copy: int) -> list[float]:
    """Seconds of a step verifying k copied tokens, k = 0..max_copy: the target's forward over
    k + 1 tokens and the per-step overhead (`CostProfile.copy_step_seconds`)."""
    return [profile.copy_step_seconds(k) for k in range(max_copy + 1)]


def draft_step_costs(profile: CostProfile, tree, max_pending: int) -> list[float]:
    """Seconds of a step drafting `tree`'s first depth with p tokens the draft has not seen,
    p = 1..max_pending (`CostProfile.step_seconds`)."""
    return [profile.step_seconds(tree, 1, p) for p in range(1, max_pending + 1)]


class Replay:
    """One output's matches at every position, and walks over them under a copy rule."""

    def __init__(self, trace: Trace, max_copy: int, min_ngram: int, max_ngram: int) -> None:
        self.trace = trace
        context = trace.prompt + trace.tokens
        n = len(trace.prompt)
        self.matches = [find_match(context[: n + s], max_copy, min_ngram, max_ngram)
                        for s in range(len(trace.tokens))]
        self.accepted = [0 if m is None else _common(m.tokens, trace.tokens[s:])
                         for s, m in enumerate(self.matches)]
        self.steps = 0  # of the last walk

    def walk(self, choose: Choose, costs: list[float], rows: list | None = None,
             draft_costs: list[float] | None = None, prior: float = 1.0) -> float:
        """Seconds to decode the output copying `choose(match, features, alt)` tokens at each
        match (`self.steps`: the walk's steps); with `rows`, appends (features + [i], accepted
        >= i) for every length i of each match. A step that copies nothing decodes one token
        with the target alone, or, given `draft_costs` (seconds of a drafted step by the
        draft's pending tokens, `CopyLength.draft_costs`; the trace needs `hits`), drafts the
        first depth, `alt` being its (running value from `prior`, seconds)."""
        t, s, history = self.trace, 0, CopyHistory(draft_value=prior)
        beside = draft_costs is not None
        if beside and t.hits is None:
            raise ValueError("a walk beside a draft needs the trace's hits (`draft_hits`)")
        n, seconds, self.steps, pending = len(t.tokens), 0.0, 0, 1
        while s < n:
            match, k, a = self.matches[s], 0, self.accepted[s]
            alt = drafted_step(history, draft_costs, pending) if beside else None
            if match is not None and n - s > 1:  # as the decoder: never copy past the budget
                match = replace(match, tokens=match.tokens[: n - s - 1])
                feats = features(match, len(t.prompt) + s, len(t.prompt), history)
                k = min(choose(match, feats, alt), len(match.tokens), len(costs) - 1)
                if rows is not None:
                    rows += [(feats + [i], a >= i) for i in range(1, len(match.tokens) + 1)]
            if k or alt is None or n - s == 1:  # a copy, or the target alone
                out = copy_outcome(a, k, pending, n - s)
                seconds += costs[k]
                history.update(k, out.accepted, t.conf[s : s + out.committed])
            else:  # the draft's first depth
                out = step_outcome(t.hits[s], 1, pending, n - s)
                seconds += alt[1]
                history.update(0, 0, t.conf[s : s + out.committed])
                history.drafted(out.committed)
            pending = out.pending
            self.steps += 1
            s += out.committed
        return seconds

    def speedup(self, choose: Choose, costs: list[float],
                draft_costs: list[float] | None = None, prior: float = 1.0) -> float:
        """Replayed speed of the rule over decoding the output one token a step."""
        return len(self.trace.tokens) * costs[0] / self.walk(choose, costs, None, draft_costs,
                                                               prior)

    def oracle_speedup(self, costs: list[float], draft_costs: list[float] | None = None,
                       alone: bool = True) -> float:
        """The speed over AR of copying, at every step, the length (or, beside a draft,
        drafting instead) that decodes the output fastest in hindsight: a dynamic program over
        (position, the draft's pending tokens). Beside a draft, `alone=False` leaves out the
        steps where the target decodes alone (but the last token): the choices the policy has."""
        t, n = self.trace, len(self.trace.tokens)
        top = len(draft_costs) if draft_costs is not None else 1
        alone = alone or draft_costs is None
        best = np.zeros((n + 1, top + 1))
        for s in range(n - 1, -1, -1):
            match, a = self.matches[s], self.accepted[s]
            for p in range(1, top + 1):
                after = min(p + 1, top)
                options = [costs[0] + best[s + 1, after]] if alone or n - s == 1 else []
                if n - s > 1:
                    if draft_costs is not None:
                        c = min(1 + t.hits[s], n - s)
                        options.append(draft_costs[p - 1] + best[s + c, c])
                    for k in range(1, min(len(match.tokens) if match else 0, n - s - 1,
                                          len(costs) - 1) + 1):
                        c = min(a, k) + 1
                        options.append(costs[k] + best[s + c, min(p + c, top)])
                best[s, p] = min(options)
        return n * costs[0] / best[0, 1]


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def copy_all(k: int) -> Choose:
    """The static rule: copy up to k tokens of every match."""
    return lambda match, feats, alt=None: k


def long_matches_only(k: int, ngram: int) -> Choose:
    """Copy up to k tokens of matches of at least `ngram` tokens (a static `lookup:k:ngram`)."""
    return lambda match, feats, alt=None: k if match.ngram >= ngram else 0


def never(match: Match, feats: list[float], alt: tuple[float, float] | None = None) -> int:
    """Copy nothing: beside a draft, the draft alone (`static:1`)."""
    return 0


