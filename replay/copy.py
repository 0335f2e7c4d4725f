"""Replaying prompt-lookup copy lengths over the target's outputs (`collect.outputs.Trace`).

A `Replay` holds one output's prompt-lookup matches at every position and walks the output
under a copy rule (`Choose`: a match and its features -> tokens to copy), priced by a cost
profile: a step verifying k copied tokens costs `step_costs()[k]`. Beside a draft, a step that
copies nothing drafts the tree's first depth instead, as `lookup-learned:PATH+static:1` decodes
(`draft_step_costs`, and the trace's `hits`). The walk is the decoder's step
(`replay.output_walk.walk`), the rule asked as `ChooseRule` in its planner, outcomes read from the
output (`TraceOutcomes`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from collect.outputs import Trace
from mcsd_runtime.decisions.copy_length import CopyHistory, drafted_step, features
from mcsd_runtime.decode.planning import StepPlanner
from mcsd_runtime.lookup import Match, find_match
from mcsd_runtime.pricing.profile import CostProfile
from replay.output_walk import OutputRow, first_depth, walk
from replay.result import ABSENT, Column, Comparison, ReplayResult, Report, ci, pct

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

    def walk(self, choose: Choose, costs: list[float], rows: list | None = None,
             draft_costs: list[float] | None = None, prior: float = 1.0) -> ReplayResult:
        """The output decoded copying `choose(match, features, alt)` tokens at each match (the
        result's `choices`: each step's copy length, 0 where it copied nothing); with `rows`,
        appends (features + [i], accepted >= i) for every length i of each match. A step that
        copies nothing decodes one token with the target alone, or, given `draft_costs`
        (seconds of a drafted step by the draft's pending tokens, `CopyLength.draft_costs`; the
        trace needs `hits`), drafts the first depth with `static:1`, `alt` being its (running
        value from `prior`, seconds). The decisions are asked as the decoder asks them
        (`replay.output_walk.walk`: a `StepPlanner` copying by `ChooseRule`)."""
        t = self.trace
        if draft_costs is not None and t.hits is None:
            raise ValueError("a walk beside a draft needs the trace's hits (`draft_hits`)")
        rule = ChooseRule(self, choose, len(costs) - 1, draft_costs, rows)
        row = OutputRow(len(t.tokens), len(t.prompt), history=CopyHistory(draft_value=prior),
                        conf=t.conf)
        planner = StepPlanner(first_depth(), rule, None)
        return walk(planner, row, TraceOutcomes(t, costs, draft_costs),
                    int(draft_costs is not None), "copy")

    def speedup(self, choose: Choose, costs: list[float],
                draft_costs: list[float] | None = None, prior: float = 1.0) -> float:
        """Replayed speed of the rule over decoding the output one token a step."""
        walked = self.walk(choose, costs, None, draft_costs, prior)
        return len(self.trace.tokens) * costs[0] / walked.cost_s

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
                        assert t.hits is not None, "beside a draft: the trace's hits"
                        c = min(1 + t.hits[s], n - s)
                        options.append(draft_costs[p - 1] + best[s + c, c])
                    for k in range(1, min(len(match.tokens) if match else 0, n - s - 1,
                                          len(costs) - 1) + 1):
                        c = min(a, k) + 1
                        options.append(costs[k] + best[s + c, min(p + c, top)])
                best[s, p] = min(options)
        return n * costs[0] / best[0, 1]


class ChooseRule:
    """A replay's copy rule, in the place of the decoder's `CopyRule` in its `StepPlanner`:
    `choose` asked about the match at the row's position, read from the replay's matches (the
    decoder searches its context; the same match), never more than `max_copy` tokens; `alt`
    where the row would draft instead (`draft_costs`). With `rows`, every length of each match
    it sees is labelled (the copy length's training rows)."""

    def __init__(self, replay: Replay, choose: Choose, max_copy: int,
                 draft_costs: list[float] | None, rows: list | None) -> None:
        self.replay, self.choose, self.max_copy = replay, choose, max_copy
        self.draft_costs, self.rows = draft_costs, rows

    def copy(self, st: OutputRow, cap: int) -> list[int]:
        match, history = self.replay.matches[st.position], st.copy_history
        if match is None or cap <= 0:
            return []
        assert history is not None, "a copy walk's row keeps a copy history"
        match = replace(match, tokens=match.tokens[:cap])  # as the decoder: never past the budget
        feats = features(match, st.n_prompt + st.position, st.n_prompt, history)
        alt = (None if self.draft_costs is None
               else drafted_step(history, self.draft_costs, len(st.d_pending)))
        if self.rows is not None:
            a = self.replay.accepted[st.position]
            self.rows += [(feats + [i], a >= i) for i in range(1, len(match.tokens) + 1)]
        return match.tokens[: min(self.choose(match, feats, alt), self.max_copy)]


class TraceOutcomes:
    """A copy walk's outcomes (`replay.output_walk.Outcomes`): a copy accepts what the output
    holds of it and costs `costs[k]`; a drafted step accepts the trace's `hits` and costs
    `draft_costs` at the draft's pending tokens; the target alone costs `costs[0]`."""

    def __init__(self, trace: Trace, costs: list[float], draft_costs: list[float] | None) -> None:
        self.trace, self.costs, self.draft_costs = trace, costs, draft_costs

    def copy(self, row: OutputRow, tokens: list[int]) -> tuple[int, float]:
        ahead = self.trace.tokens[row.position : row.position + len(tokens)]
        return _common(tokens, ahead), self.costs[len(tokens)]

    def draft(self, row: OutputRow, width: int) -> tuple[int, float]:
        hits, draft_costs, history = self.trace.hits, self.draft_costs, row.copy_history
        assert hits is not None and draft_costs is not None, "a walk beside a draft"
        assert history is not None, "a copy walk's row keeps a copy history"
        return hits[row.position], drafted_step(history, draft_costs, row.pending)[1]

    def alone(self, row: OutputRow) -> float:
        return self.costs[0]

    def tops(self, row: OutputRow) -> None:
        return None


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def copy_all(k: int) -> Choose:
    """The static rule: copy up to k tokens of every match."""
    def choose(match: Match, feats: list[float], alt: tuple[float, float] | None = None) -> int:
        return k
    return choose


def long_matches_only(k: int, ngram: int) -> Choose:
    """Copy up to k tokens of matches of at least `ngram` tokens (a static `lookup:k:ngram`)."""
    def choose(match: Match, feats: list[float], alt: tuple[float, float] | None = None) -> int:
        return k if match.ngram >= ngram else 0
    return choose


def never(match: Match, feats: list[float], alt: tuple[float, float] | None = None) -> int:
    """Copy nothing: beside a draft, the draft alone (`static:1`)."""
    return 0


# ------------------------------------------------------------------ the replay's report
STATIC_GRID = [(k, n) for k in (8, 12, 15) for n in (2, 3, 4)]  # lookup:K:N replayed beside it


DEPLOY = (8, 3)  # the default `lookup` method


def replay_speeds(policy, costs: list[float], outs: list) -> dict[str, list[float]]:
    """Per output, the replayed speed over AR of the policy (`learned`), of each static
    `lookup:K:N` (composed with `static:1` when the policy was trained beside a draft) and of
    the hindsight oracle; beside a draft also of the draft alone (`draft`) and of the oracle
    over the policy's own choices (`oracle_choices`: copy or draft, never the target alone)."""
    top, beside = policy.max_copy, policy.draft_costs
    walk = {"draft_costs": beside, "prior": policy.draft_prior}
    learned = [Replay(t, policy.max_copy, policy.min_ngram, policy.max_ngram) for t in outs]
    speeds = {"learned": [r.speedup(policy.choose, costs, **walk) for r in learned],
              "oracle": [r.oracle_speedup(costs, beside) for r in learned]}
    for k, n in sorted({(min(k, top), n) for k, n in STATIC_GRID}):  # none copies more than it
        speeds[static_name(k, n, beside)] = [Replay(t, k, n, 4).speedup(
            copy_all(k), costs[: k + 1], **walk) for t in outs]
    if beside is not None:
        speeds["draft"] = [r.speedup(never, costs, **walk) for r in learned]
        speeds["oracle_choices"] = [r.oracle_speedup(costs, beside, alone=False)
                                    for r in learned]
    return speeds


def static_name(k: int, n: int, beside) -> str:
    """`lookup:K:N`, composed with the draft (`+static:1`) for a policy trained beside one."""
    return f"lookup:{k}:{n}" + (f"+{BESIDE}" if beside is not None else "")


def deploy_name(policy) -> str:
    """The static a user deploys instead: `lookup:8:3` (capped at the policy's longest copy),
    beside the draft where the policy was trained beside one."""
    return static_name(min(DEPLOY[0], policy.max_copy), DEPLOY[1], policy.draft_costs)


def compare(policy, costs: list[float], outs: list, domain: str, trained: bool) -> Comparison:
    """One domain's `replay_speeds`, compared: speeds over AR, the deploy static, the domain's
    best static copy length and the oracle."""
    speeds = replay_speeds(policy, costs, outs)
    return Comparison.of_outputs(domain, speeds, deploy_name(policy),
                                 [m for m in speeds if m.startswith("lookup:")], trained=trained)


def _choices(c: Comparison, share: bool = False):
    """The oracle over the policy's own choices (copy or draft), or its share: beside a draft."""
    if "oracle_choices" not in c.speeds:
        return ABSENT
    return c.share(oracle="oracle_choices") if share else c.speeds["oracle_choices"]


# per domain: geometric means over AR; the policy's paired speedup over the deploy static and
# the domain's best static; the share of the oracle's gain over the deploy static it takes
DOMAINS = Report(
    (Column("domain", lambda c: c.group), Column("trained", lambda c: c.trained),
     Column("prompts", lambda c: c.n, "n", str),
     Column("learned_vs_ar", Comparison.speed, "vs AR"),
     Column("best_static", lambda c: c.best_static, "best static", str),
     Column("best_static_vs_ar", lambda c: c.speeds[c.best_static or c.deployed]),
     Column("deploy", lambda c: c.deployed),
     Column("deploy_vs_ar", lambda c: c.speeds[c.deployed]),
     Column("oracle_vs_ar", lambda c: c.speeds[c.oracle], "oracle"),
     Column("oracle_share", lambda c: c.share(), "share", pct),
     Column("vs_deploy", lambda c: c.paired(), "vs deploy", ci),
     Column("vs_best_static", lambda c: c.paired(over=c.best_static), "vs best static", ci),
     Column("draft_vs_ar", lambda c: c.speeds.get("draft", ABSENT), "draft"),
     Column("oracle_choices_vs_ar", _choices, "oracle*"),
     Column("oracle_choices_share", lambda c: _choices(c, share=True), "share*", pct)),
    label=Column("label", lambda c: c.group + (" (trained)" if c.trained else ""), "domain"),
    printed=("prompts", "learned_vs_ar", "vs_deploy", "vs_best_static", "best_static",
             "draft_vs_ar", "oracle_vs_ar", "oracle_share", "oracle_choices_vs_ar",
             "oracle_choices_share"),
    order=lambda r: r["vs_best_static"]["geomean"])


def _out_of_fold(c: Comparison, share: bool = False):
    if "out of fold" not in c.speeds:
        return None
    return c.share("out of fold") if share else c.speeds["out of fold"]


def _folded(c: Comparison, share: bool = False):
    """The out-of-fold columns where folds were asked for."""
    return _out_of_fold(c, share) if c.facts["folds"] else ABSENT


# the training mix pooled: the policy, the deploy static and the oracle over AR, the policy's
# share of the oracle's gain, and with folds the same for the policy out of fold
MIX = Report(
    (Column("outputs", lambda c: c.facts["outputs"]),
     Column("learned_vs_ar", Comparison.speed, "vs AR"),
     Column("deploy_vs_ar", lambda c: c.speeds[c.deployed], "deploy"),
     Column("oracle_vs_ar", lambda c: c.speeds[c.oracle], "oracle"),
     Column("oracle_share", lambda c: c.share(), "share", pct),
     Column("folds", lambda c: c.facts["folds"]),
     Column("out_of_fold_vs_ar", _out_of_fold),
     Column("out_of_fold_share", lambda c: _out_of_fold(c, True)),
     Column("oracle_choices_vs_ar", _choices, "oracle*"),
     Column("oracle_choices_share", lambda c: _choices(c, share=True), "share*", pct),
     Column("oof", _folded, "out of fold", recorded=False),
     Column("oof_share", lambda c: _folded(c, True), "share (oof)", pct, recorded=False)),
    label=Column("label", lambda c: f"{c.group}, {c.facts['outputs']} outputs pooled", ""))


def write_report(policy, domains: list[Comparison], mix: Comparison
                 ) -> tuple[list[dict], dict, str]:
    """The artifact's records of the domains (`DOMAINS`) and of the training mix (`MIX`), and
    the printed report."""
    records, table = DOMAINS.write(domains)
    (mixed,), mix_table = MIX.write([mix])
    choices = "oracle_choices" in domains[0].speeds
    lines = [f"replayed speed (tuned rate {policy.rate:.1f} tokens/s); learned vs "
             f"{deploy_name(policy)} and vs the domain's best static copy length, 95% CI:",
             table,
             "(vs AR: replayed speed over the target alone; oracle: the hindsight-best choice "
             "at every step, over AR; share: of the oracle's gain over the deploy static, the "
             "policy's" + ("; draft: the draft alone; oracle*, share*: the same for an oracle "
                           "that, as the policy, copies or drafts and never lets the target "
                           "decode alone)" if choices else ")"),
             mix_table]
    if mixed["folds"] and mixed["out_of_fold_vs_ar"] is None:
        lines.append("(out of fold: a fold holds too few repeats to fit)")
    elif mixed["folds"]:
        lines.append(f"(out of fold: each output replayed under the policy fitted on the other "
                     f"{mixed['folds'] - 1} of {mixed['folds']} folds)")
    return records, mixed, "\n".join(lines)
