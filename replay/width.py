"""Replaying width rules over the target's greedy outputs (`collect.outputs.Ranked`).

Greedy, what a drafted step verifying the w likeliest of the draft's first-depth candidates
commits at each position of an output is known from the output itself: two tokens when the
output's next token is among those w, else one. One teacher-forced pass of the draft over each of
the target's greedy outputs (`collect.outputs.draft_ranks`: the draft's k largest probabilities
at every position and the rank of the output's token among them) therefore replays any width
rule exactly, priced by a cost profile (`WidthReplay`): a step verifying w candidates costs
`CostProfile.step_seconds` of the tree `(w,)` at depth 1 with the draft's pending tokens (one
more forward of the draft reads them), the budget's last token an undrafted step, as the decoder
takes them (`mcsd_runtime.pricing.step_model`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from collect.outputs import Ranked
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.pricing.step_model import step_outcome
from mcsd_runtime.stop.width import WidthPolicy
from mcsd_runtime.tree import Tree

Rule = Callable[["Ranked", int], int]  # an output and a position -> a width in 1..k


class WidthReplay:
    """Replays width rules over `Ranked` outputs under a profile's step costs."""

    def __init__(self, profile: CostProfile, k: int, max_pending: int = 2) -> None:
        self.k = k
        # [w - 1][p - 1]: a step verifying w candidates with p pending draft tokens
        self.drafted = [[profile.step_seconds(Tree((w,)), 1, p) for p in range(1, max_pending + 1)]
                        for w in range(1, k + 1)]
        self.last = [profile.step_seconds(Tree((k,)), 0, p) for p in range(1, max_pending + 1)]

    def walk(self, out: Ranked, rule: Rule) -> tuple[int, float, list[int]]:
        """(tokens, seconds, the width of every step) of one output decoded with `rule`."""
        n, t, pending, seconds, widths = len(out.rank), 0, 1, 0.0, []
        while t < n:
            if t == n - 1:  # the budget's last token: the decoder drafts nothing (width 0)
                seconds += self.last[pending - 1]
                widths.append(0)
                break
            w = rule(out, t)
            widths.append(w)
            seconds += self.drafted[w - 1][pending - 1]
            step = step_outcome(int(0 <= out.rank[t] < w), 1, pending, n - t)
            pending = step.pending
            t += step.committed
        return n, seconds, widths

    def speed(self, out: Ranked, rule: Rule) -> float:
        tokens, seconds, _ = self.walk(out, rule)
        return tokens / seconds

    def rate(self, outs: Sequence[Ranked], rule: Rule) -> float:
        """Pooled tokens/s of `rule` over `outs`."""
        walks = [self.walk(o, rule) for o in outs]
        return sum(w[0] for w in walks) / sum(w[1] for w in walks)


def static(w: int) -> Rule:
    """Every step verifies w candidates."""
    return lambda out, t: w


def learned(policy: WidthPolicy) -> Rule:
    """The policy's choice from the draft's probabilities there."""
    return lambda out, t: policy.choose(out.top[t])


def oracle(out: Ranked, t: int) -> int:
    """The hindsight-best width: just wide enough to hold the output's token, else 1."""
    return int(out.rank[t]) + 1 if out.rank[t] >= 0 else 1


# ------------------------------------------------------------------ the replay's report
def replay_report(policy, replay, ranked: dict[str, list], trained: set[str]) -> list[dict]:
    """Per category: the policy, each static width and the hindsight-best width, replayed and
    paired per output against the widest static width (`metrics.paired_speedup`)."""
    from mcsd_runtime.metrics import paired_speedup

    report = []
    for name, outs in ranked.items():
        base = [replay.speed(o, static(policy.k)) for o in outs]
        rules = {f"width {w}": static(w) for w in range(1, policy.k)} | {
            "learned": learned(policy), "oracle": oracle}
        row = {"domain": name, "trained": name in trained, "outputs": len(outs)}
        for label, rule in rules.items():
            walks = [replay.walk(o, rule) for o in outs]
            row[label] = paired_speedup([tokens / sec for tokens, sec, _ in walks], base)
            if label == "learned":
                widths = [w for _, _, taken in walks for w in taken if w]
                row["mean_width"] = sum(widths) / max(len(widths), 1)
        report.append(row)
    return report


def print_report(report: list[dict], policy) -> None:
    k = policy.k
    print(f"replayed speed against width {k} (tuned rate {policy.rate:.1f} tokens/s), paired "
          f"per output, 95% CI:")
    cols = [f"width {w}" for w in range(1, k)] + ["learned", "oracle"]
    print(f"{'category':30} {'n':>3} " + " ".join(f"{c:>22}" for c in cols) + "  mean width")
    for r in sorted(report, key=lambda r: r["learned"]["geomean"]):
        label = r["domain"] + (" (trained)" if r["trained"] else "")
        cells = [f"{r[c]['geomean']:.3f} [{r[c]['ci_low']:.3f}, {r[c]['ci_high']:.3f}]"
                 for c in cols]
        print(f"{label:30} {r['outputs']:>3} " + " ".join(f"{c:>22}" for c in cells)
              + f"  {r['mean_width']:.2f}")
