"""Replaying prompt-lookup copy lengths over the target's outputs (`collect.outputs.Trace`).

A `Replay` holds one output's prompt-lookup matches at every position and walks the output
under a copy rule (`Choose`: a match and its features -> tokens to copy), priced by a cost
profile: a step verifying k copied tokens costs `step_costs()[k]`. Beside a draft, a step that
copies nothing drafts the tree's first depth instead, as `lookup-learned:PATH+static:1` decodes
(`draft_step_costs`, and the trace's `hits`). What a step commits and leaves pending follows
`mcsd_runtime.pricing.step_model` (`copy_outcome`, `step_outcome`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from collect.outputs import Trace
from mcsd_runtime.lookup import Match, find_match
from mcsd_runtime.metrics import geomean, oracle_share
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.pricing.step_model import copy_outcome, step_outcome
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


def replay_report(policy, speeds: dict[str, dict[str, list[float]]],
                  trained: set[str]) -> list[dict]:
    """Per domain, from its `replay_speeds`: geometric means over AR; the policy's paired
    speedup over the deploy static and the domain's best static; the share of the oracle's
    gain over the deploy static it takes."""
    from mcsd_runtime.metrics import paired_speedup

    deploy = static_name(min(DEPLOY[0], policy.max_copy), DEPLOY[1], policy.draft_costs)
    rows = []
    for name, sp in speeds.items():
        gms = {m: geomean(v) for m, v in sp.items() if m.startswith("lookup:")}
        best = max(gms, key=gms.get)
        ours, oracle = geomean(sp["learned"]), geomean(sp["oracle"])
        row = {"domain": name, "trained": name in trained, "prompts": len(sp["learned"]),
               "learned_vs_ar": ours, "best_static": best, "best_static_vs_ar": gms[best],
               "deploy": deploy, "deploy_vs_ar": gms[deploy], "oracle_vs_ar": oracle,
               "oracle_share": oracle_share(ours, gms[deploy], oracle),
               "vs_deploy": paired_speedup(sp["learned"], sp[deploy]),
               "vs_best_static": paired_speedup(sp["learned"], sp[best])}
        if "draft" in sp:
            row["draft_vs_ar"] = geomean(sp["draft"])
            row["oracle_choices_vs_ar"] = geomean(sp["oracle_choices"])
            row["oracle_choices_share"] = oracle_share(ours, gms[deploy],
                                                       row["oracle_choices_vs_ar"])
        rows.append(row)
    return rows


def print_report(report: list[dict], rate: float, mix: dict | None = None) -> None:
    choices = "oracle_choices_vs_ar" in report[0]
    print(f"replayed speed (tuned rate {rate:.1f} tokens/s); learned vs {report[0]['deploy']} "
          f"and vs the domain's best static copy length, 95% CI:")
    wide = max(len(r["best_static"]) for r in report)
    print(f"{'domain':32} {'n':>3} {'vs AR':>6}  {'vs deploy':>21}  "
          f"{'vs best static':>{24 + wide}}  {'oracle':>6} {'share':>6}"
          + (f" {'oracle*':>7} {'share*':>6}" if choices else ""))
    for r in sorted(report, key=lambda r: r["vs_best_static"]["geomean"]):
        d, b = r["vs_deploy"], r["vs_best_static"]
        label = r["domain"] + (" (trained)" if r["trained"] else "")
        line = (f"{label:32} {r['prompts']:>3} {r['learned_vs_ar']:6.3f}  {d['geomean']:6.3f} "
                f"[{d['ci_low']:.3f}, {d['ci_high']:.3f}]  {b['geomean']:6.3f} "
                f"[{b['ci_low']:.3f}, {b['ci_high']:.3f}] {r['best_static']:>{wide}}  "
                f"{r['oracle_vs_ar']:6.3f} {pct(r['oracle_share']):>6}")
        if choices:
            line += f" {r['oracle_choices_vs_ar']:7.3f} {pct(r['oracle_choices_share']):>6}"
        print(line)
    print("(vs AR: replayed speed over the target alone; oracle: the hindsight-best choice at "
          "every step, over AR; share: of the oracle's gain over the deploy static, the "
          "policy's" + ("; oracle*, share*: the same for an oracle that, as the policy, copies "
                        "or drafts and never lets the target decode alone)" if choices else ")"))
    if mix:
        line = (f"training mix, {mix['outputs']} outputs pooled: learned {mix['learned_vs_ar']:.3f}"
                f" AR, deploy {mix['deploy_vs_ar']:.3f}, oracle {mix['oracle_vs_ar']:.3f}; "
                f"share {pct(mix['oracle_share'])}")
        if "oracle_choices_vs_ar" in mix:
            line += (f"; oracle* {mix['oracle_choices_vs_ar']:.3f}, share* "
                     f"{pct(mix['oracle_choices_share'])}")
        if mix["folds"]:
            line += (f"; out of fold ({mix['folds']} folds) learned "
                     f"{mix['out_of_fold_vs_ar']:.3f}, share {pct(mix['out_of_fold_share'])}"
                     if mix["out_of_fold_vs_ar"] is not None else
                     "; out of fold: a fold holds too few repeats to fit")
        print(line)


def pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"
