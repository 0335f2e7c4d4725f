"""Training a learned prompt-lookup copy length (`mcsd_runtime.stop.copy_length`).

Prompt lookup is lossless, so the target's own output decides what every copy would have
accepted: one pass per prompt (greedy, or sampled at the decoding temperature; with the target's
top-1 probability at each token) is replayed under a profiled cost per step. The model's rows
come from walking each output under a few fixed copy rules (every length of each match visited,
labelled "accepted at least i tokens"); the exchange rate is then tuned on the same outputs until
it equals the throughput the policy reaches (Dinkelbach's iteration for a ratio objective).

Beside a draft (`--k-config`), a step that copies nothing drafts the tree's first depth
instead, as `lookup-learned:PATH+static:1` decodes. Under greedy decoding what such a step
accepts is known from the output too: whether the output's next token is among the draft's
candidates there, read from one teacher-forced pass of the target and the draft per output
(`draft_hits`), the same distributions the decoder's drafting step computes. When sampling, a
drafted step's acceptance is a draw of its own: each output is then drawn through that step's
verification at every position (`drafted_traces`), which records the draw.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from mcsd_runtime.costmodel.profile import CostProfile
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.lookup import Match, find_match
from mcsd_runtime.progress import progress
from mcsd_runtime.stop.copy_length import (
    FEATURES,
    CopyHistory,
    CopyLength,
    drafted_step,
    features,
)

BESIDE = "static:1"  # what a step that copies nothing drafts, beside a draft (`--k-config`)
Choose = Callable[[Match, list[float], "tuple[float, float] | None"], int]
RATE_ROUNDS = 4


@dataclass
class Trace:
    """A prompt, the target's output (greedy, or sampled at the decoder's temperature) and the
    target's top-1 probability (at temperature 1, as the decoder reports it) at each token."""

    prompt: list[int]
    tokens: list[int]
    conf: list[float]
    hits: list[int] | None = None  # per token: among the draft's first-depth candidates there


@torch.no_grad()
def target_traces(pair, prompts: Sequence[list[int]], max_new_tokens: int,
                  temperature: float = 0.0, seed: int = 0, stop_at_eos: bool = False,
                  desc: str = "target outputs") -> list[Trace]:
    """The target's output of each prompt, token by token with its cache: greedy at temperature
    0, else sampled (each prompt's generator seeded from `seed` and its tokens: an output does
    not depend on the prompts beside it).

    A sampled output replays lossless lookup exactly: a copied token is accepted with the
    target's probability of it, and on rejection the token comes from the target's other
    tokens, so "the copy was accepted" is "the copy equals the output's token"."""
    from transformers import DynamicCache

    from mcsd_runtime.models.compat import cache_kwargs

    model, out = pair.target, []
    for ids in progress(prompts, desc=desc, unit="prompt"):
        cache, tokens, conf = DynamicCache(), [], []
        gen = torch.Generator(device=pair.device).manual_seed(seed + zlib.crc32(str(ids).encode()))
        x = torch.tensor([ids], device=pair.device)
        for _ in range(max_new_tokens):
            logits = model(input_ids=x, **cache_kwargs(model, cache), use_cache=True).logits[0, -1]
            p = torch.softmax(logits.float(), -1)
            if temperature > 0:
                sampling = torch.softmax(logits.float() / temperature, -1)
                token = int(torch.multinomial(sampling, 1, generator=gen))
            else:
                token = int(p.argmax())
            tokens.append(token)
            conf.append(float(p.max()))
            if stop_at_eos and token in pair.eos_token_ids:
                break
            x = torch.tensor([[token]], device=pair.device)
        out.append(Trace(list(ids), tokens, conf))
    return out


@torch.no_grad()
def draft_hits(pair, traces: Sequence[Trace], width: int,
               desc: str = "draft candidates") -> list[Trace]:
    """`traces` with `hits`: whether each output token is among the `width` likeliest of the
    draft's distribution at its position (a drafted step's greedy first depth), from one forward
    of the draft over prompt and output (and of the target before it, for a feature draft, which
    reads the target's state one position back, as the decoder feeds it)."""
    out = []
    for t in progress(traces, desc=desc, unit="output"):
        top = teacher_forced_draft_logits(pair, t).float().topk(width, dim=-1).indices
        truth = torch.tensor(t.tokens, device=pair.device)[:, None]
        out.append(replace(t, hits=(top == truth).any(-1).int().tolist()))
    return out


@torch.no_grad()
def drafted_traces(pair, prompts: Sequence[list[int]], max_new_tokens: int, temperature: float,
                   width: int, verify: str = "mcss", seed: int = 0, stop_at_eos: bool = False,
                   desc: str = "target outputs with drafted steps") -> list[Trace]:
    """Sampled outputs with `hits` for a policy beside a draft at `temperature` > 0: every token
    comes from a drafted step's verification at its position — `width` candidates drawn from
    the draft's distribution there and verified against the target's with `verify`, as the
    decoder's first depth does (`decode.verify`) — and `hits` says whether a candidate was
    accepted. Verification is lossless, so each output is a sample of the target's, and the
    replay's copies read it as `target_traces`' (accepted when equal to the output's token);
    each position's token and acceptance are jointly one draw of the decoder's drafted step
    there. Seeded per prompt from `seed` and its tokens, as `target_traces`."""
    from transformers import DynamicCache

    from mcsd_runtime.decode import verify as V
    from mcsd_runtime.distill.feature import is_feature_draft
    from mcsd_runtime.models.compat import cache_kwargs

    if temperature <= 0:
        raise ValueError("drafted_traces samples: greedy hits come from `draft_hits`")
    draw = V.sample_with_replacement if verify == "mcss-replacement" else (
        V.sample_without_replacement)
    features, out = is_feature_draft(pair.draft), []
    for ids in progress(prompts, desc=desc, unit="prompt"):
        cache, tokens, conf, hits = DynamicCache(), [], [], []
        gen = torch.Generator(device=pair.device).manual_seed(seed + zlib.crc32(str(ids).encode()))
        x, states = torch.tensor([ids], device=pair.device), []
        for _ in range(max_new_tokens):
            t_out = pair.target(input_ids=x, **cache_kwargs(pair.target, cache), use_cache=True,
                                output_hidden_states=features)
            if features:
                states.append(t_out.hidden_states[-1])
            context = torch.tensor([ids + tokens], device=pair.device)
            d_logits = _draft_logits(pair, context, torch.cat(states, 1) if features else None,
                                     keep=1)[-1]
            p = torch.softmax(t_out.logits[0, -1].float() / temperature, -1)[None]
            q = torch.softmax(d_logits.float() / temperature, -1)[None]
            cands = draw(q, width, gen)
            rank, nxt = V.verify_children(p, q, cands, verify, gen)
            r = int(rank)
            token = int(cands[0, r]) if r >= 0 else int(nxt)
            tokens.append(token)
            hits.append(int(r >= 0))
            conf.append(float(torch.softmax(t_out.logits[0, -1].float(), -1).max()))
            if stop_at_eos and token in pair.eos_token_ids:
                break
            x = torch.tensor([[token]], device=pair.device)
        out.append(Trace(list(ids), tokens, conf, hits))
    return out


@torch.no_grad()
def teacher_forced_draft_logits(pair, t: Trace) -> torch.Tensor:
    """The draft's logits [n, V] before each of the output's n tokens, from one forward over
    prompt and output (and one of the target before it, for a feature draft, which reads the
    target's state one position back, as the decoder feeds it)."""
    from mcsd_runtime.distill.feature import is_feature_draft

    ids = torch.tensor([t.prompt + t.tokens], device=pair.device)
    states = None
    if is_feature_draft(pair.draft):
        states = pair.target(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    return _draft_logits(pair, ids, states)[len(t.prompt) - 1 : -1]


def _draft_logits(pair, ids: torch.Tensor, states: torch.Tensor | None,
                  keep: int = 0) -> torch.Tensor:
    """The draft's logits [n, V] at every position of `ids` [1, n] (`keep` > 0: the last `keep`
    positions only); a feature draft reads at each position the target's state one position
    back (`states` [1, n, H]: the target's final states there), as the decoder feeds it."""
    extra = {}
    if states is not None:
        extra["prev_hidden"] = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], 1)
    return pair.draft(input_ids=ids, logits_to_keep=keep, **extra).logits[0]


def draft_step_costs(profile: CostProfile, tree, max_pending: int) -> list[float]:
    """Seconds of a step drafting `tree`'s first depth with p tokens the draft has not seen,
    p = 1..max_pending (`CostProfile.step_seconds`)."""
    return [profile.step_seconds(tree, 1, p) for p in range(1, max_pending + 1)]


def step_costs(profile: CostProfile, max_copy: int) -> list[float]:
    """Seconds of a step verifying k copied tokens, k = 0..max_copy: the target's forward over
    k + 1 tokens and the per-step overhead (`CostProfile.copy_step_seconds`)."""
    return [profile.copy_step_seconds(k) for k in range(max_copy + 1)]


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
                acc = min(a, k)
                committed = min(acc + 1, n - s)
                seconds += costs[k]
                pending += committed
                history.update(k, acc, t.conf[s : s + committed])
            else:  # the draft's first depth
                committed = min(1 + t.hits[s], n - s)
                seconds += alt[1]
                pending = committed
                history.update(0, 0, t.conf[s : s + committed])
                history.drafted(committed)
            self.steps += 1
            s += committed
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


def out_of_fold(traces: Sequence[Trace], costs: list[float], folds: int = 5, seed: int = 0,
                **fit_kwargs) -> list[float]:
    """Each output's replayed speed over AR under a policy fitted on the other folds (outputs
    dealt to `folds` folds at random): how the policy does on outputs it was not trained on."""
    fold = np.random.default_rng(seed).permutation(len(traces)) % folds
    speed = [0.0] * len(traces)
    for f in range(folds):
        policy, _, _ = fit([traces[i] for i in np.flatnonzero(fold != f)], costs, seed=seed,
                           **fit_kwargs)
        walk = {"draft_costs": policy.draft_costs, "prior": policy.draft_prior}
        for i in np.flatnonzero(fold == f):
            replay = Replay(traces[i], policy.max_copy, policy.min_ngram, policy.max_ngram)
            speed[i] = replay.speedup(policy.choose, costs, **walk)
    return speed


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


BEHAVIOUR = (copy_all(10**6), copy_all(2), long_matches_only(8, 3))


def fit(traces: Sequence[Trace], costs: list[float], min_ngram: int = 1, max_ngram: int = 4,
        seed: int = 0, n_estimators: int = 200, draft_costs: list[float] | None = None,
        ) -> tuple[CopyLength, str, dict]:
    """The policy trained on `traces` under `costs` (index k: a step copying k tokens), the
    model file's text and training facts; with `draft_costs` (the traces carrying `hits`),
    beside a draft: copying nothing drafts, and the rate is tuned on walks that draft."""
    import lightgbm as lgb

    max_copy = len(costs) - 1
    replays = [Replay(t, max_copy, min_ngram, max_ngram) for t in traces]
    rows: list = []
    for r in replays:
        for rule in BEHAVIOUR:
            r.walk(rule, costs, rows)
    if not rows or len({y for _, y in rows}) < 2:
        raise MCSDError("the outputs hold too few repeats to learn from (no prompt-lookup match, "
                        "or every copy accepted or none): use more prompts or longer outputs")
    x = np.array([f for f, _ in rows], dtype=np.float64)
    y = np.array([int(v) for _, v in rows])
    mono = [0] * (len(FEATURES) - 1) + [-1]  # longer copies never survive more often
    clf = lgb.LGBMClassifier(n_estimators=n_estimators, learning_rate=0.05, num_leaves=15,
                             min_child_samples=20, monotone_constraints=mono, random_state=seed,
                             n_jobs=1, verbose=-1)
    clf.fit(x, y, feature_name=list(FEATURES))
    booster = clf.booster_
    policy = CopyLength(booster, costs, 1 / costs[0], min_ngram, max_ngram)
    if draft_costs is not None:  # a drafted step's tokens before a row has drafted
        policy.draft_costs = list(draft_costs)
        policy.draft_prior = 1 + float(np.mean([h for t in traces for h in t.hits[:-1]]))
    for _ in range(RATE_ROUNDS):  # the rate the policy itself reaches on the training outputs
        seconds = sum(r.walk(policy.choose, costs, None, policy.draft_costs, policy.draft_prior)
                      for r in replays)
        policy.rate = sum(len(t.tokens) for t in traces) / seconds
    text = booster.model_to_string()
    facts = {"rows": len(rows), "accept_share": float(y.mean()), "outputs": len(traces),
             "tokens": sum(len(t.tokens) for t in traces)}
    if draft_costs is not None:
        facts["draft_prior"] = policy.draft_prior
    return policy, text, facts
