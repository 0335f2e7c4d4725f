"""Replaying width rules over the target's greedy outputs (`collect.outputs.Ranked`).

Greedy, what a drafted step verifying the w likeliest of the draft's first-depth candidates
commits at each position of an output is known from the output itself: two tokens when the
output's next token is among those w, else one. One teacher-forced pass of the draft over each of
the target's greedy outputs (`collect.outputs.draft_ranks`: the draft's k largest probabilities
at every position and the rank of the output's token among them) therefore replays any width
rule exactly, priced by a cost profile (`WidthReplay`): a step verifying w candidates costs
`CostProfile.step_seconds` of the tree `(w,)` at depth 1 with the draft's pending tokens (one
more forward of the draft reads them), the budget's last token an undrafted step, as the decoder
takes them (`replay.output_walk.walk`, outcomes from the ranks: `RankOutcomes`). A width rule is
the planner of that walk (`static`, `learned`: the decoder's own, `oracle`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from collect.outputs import Ranked
from mcsd_runtime.decisions.contract import Planner, StepStart
from mcsd_runtime.decisions.width import WidthPolicy
from mcsd_runtime.decode.planning import StepPlanner
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.tree import KConfig, Tree
from replay.output_walk import OutputRow, first_depth, walk
from replay.result import Column, Comparison, ReplayResult, Report, ci, pct

Rule = Planner  # a width rule: the planner of a walk that drafts the first depth at every step


class WidthReplay:
    """Replays width rules over `Ranked` outputs under a profile's step costs."""

    def __init__(self, profile: CostProfile, k: int, max_pending: int = 2) -> None:
        self.k = k
        # [w - 1][p - 1]: a step verifying w candidates with p pending draft tokens
        pendings = range(1, max_pending + 1)
        self.drafted = [[profile.step_seconds(Tree(KConfig((w,))), 1, p) for p in pendings]
                        for w in range(1, k + 1)]
        self.last = [profile.step_seconds(Tree(KConfig((k,))), 0, p) for p in pendings]

    def walk(self, out: Ranked, rule: Rule) -> ReplayResult:
        """One output decoded under `rule` (the result's `choices`: every step's width), asked
        as the decoder asks a width (`replay.output_walk.walk`)."""
        return walk(rule, OutputRow(len(out.rank), output=out), RankOutcomes(self, out), 1,
                    "width")

    def speed(self, out: Ranked, rule: Rule) -> float:
        return self.walk(out, rule).throughput

    def rate(self, outs: Sequence[Ranked], rule: Rule) -> float:
        """Pooled tokens/s of `rule` over `outs`."""
        walks = [self.walk(o, rule) for o in outs]
        return sum(w.tokens for w in walks) / sum(w.cost_s for w in walks)


class RankOutcomes:
    """A width walk's outcomes (`replay.output_walk.Outcomes`): a step drafting w candidates
    accepts the output's token where its rank is below w and costs `WidthReplay.drafted`; the
    budget's last token, a step of the target alone, `WidthReplay.last`; no copies."""

    def __init__(self, replay: WidthReplay, out: Ranked) -> None:
        self.replay, self.out = replay, out

    def copy(self, row: OutputRow, tokens: list[int]) -> tuple[int, float]:
        raise MCSDError("a width walk copies nothing")

    def draft(self, row: OutputRow, width: int) -> tuple[int, float]:
        rank = self.out.rank[row.position]
        return int(0 <= rank < width), self.replay.drafted[width - 1][row.pending - 1]

    def alone(self, row: OutputRow) -> float:
        return self.replay.last[row.pending - 1]

    def tops(self, row: OutputRow) -> list[float]:
        return self.out.top[row.position]


class _NoCopy:
    """A width walk's copy rule: none."""

    def copy(self, st: object, cap: int) -> list[int]:
        return []


@dataclass(frozen=True)
class _Fixed:
    """A static width, as a width decision."""

    width: int

    def choose(self, top: list[float]) -> int:
        return self.width


def static(w: int) -> Rule:
    """Every step verifies w candidates."""
    return StepPlanner(first_depth(), _NoCopy(), _Fixed(w))


def learned(policy: WidthPolicy) -> Rule:
    """The policy's choice from the draft's probabilities there: the decoder's own planner of
    a learned width."""
    return StepPlanner(first_depth(), _NoCopy(), policy)


class _Hindsight(StepPlanner):
    """The hindsight-best width: just wide enough to hold the output's token, else 1. It reads
    the output's ranks (`OutputRow.output`), which no decoder knows."""

    def __init__(self) -> None:
        super().__init__(first_depth(), _NoCopy(), None)
        self.row: OutputRow | None = None

    def plan(self, starts: Sequence[StepStart]) -> list[bool]:
        self.row = cast(OutputRow, starts[0].row)
        return super().plan(starts)

    def width(self, tops: Sequence[list[float]]) -> list[int]:
        assert self.row is not None, "asked after the step's plan"
        rank = int(cast(Ranked, self.row.output).rank[self.row.position])
        return [rank + 1 if rank >= 0 else 1]


def oracle() -> Rule:
    """The hindsight-best width (`_Hindsight`)."""
    return _Hindsight()


# ------------------------------------------------------------------ the replay's report
def compare(policy, replay: WidthReplay, outs: Sequence[Ranked], category: str,
            trained: bool) -> Comparison:
    """One category replayed output by output: each static width, the policy (with the mean
    width it drafts) and the hindsight-best width, against the widest static width."""
    rules = {f"width {w}": static(w) for w in range(1, policy.k + 1)} | {
        "learned": learned(policy), "oracle": oracle()}
    outputs, widths = {}, []
    for label, rule in rules.items():
        walks = [replay.walk(o, rule) for o in outs]
        outputs[label] = [w.throughput for w in walks]
        if label == "learned":
            widths = [c for w in walks for c in w.choices if c]
    return Comparison.of_outputs(category, outputs, f"width {policy.k}", trained=trained,
                                 facts={"mean_width": sum(widths) / max(len(widths), 1)})


def _paired(method: str) -> Column:
    return Column(method, lambda c: c.paired(method), method, ci)


def report(k: int) -> Report:
    """Per category: every static width narrower than `k`, the policy and the hindsight-best
    width, paired per output against width `k` (`Comparison.paired`)."""
    narrower = tuple(_paired(f"width {w}") for w in range(1, k))
    return Report(
        (Column("domain", lambda c: c.group), Column("trained", lambda c: c.trained),
         Column("outputs", lambda c: c.n, "n", str), *narrower, _paired("learned"),
         Column("mean_width", lambda c: c.facts["mean_width"], "mean width", "{:.2f}".format),
         _paired("oracle"),
         Column("share", lambda c: c.share(), "share", pct, recorded=False)),
        label=Column("label", lambda c: c.group + (" (trained)" if c.trained else ""),
                     "category"),
        printed=("outputs", *(f"width {w}" for w in range(1, k)), "learned", "oracle",
                 "share", "mean_width"),
        order=lambda r: r["learned"]["geomean"])


def write_report(policy, comparisons: list[Comparison]) -> tuple[list[dict], str]:
    """The artifact's records of the categories' comparisons (`report`), and the printed
    report."""
    records, table = report(policy.k).write(comparisons)
    return records, "\n".join([
        f"replayed speed against width {policy.k} (tuned rate {policy.rate:.1f} tokens/s), "
        f"paired per output, 95% CI:", table,
        f"(share: of the hindsight-best width's gain over width {policy.k}, the policy's)"])
