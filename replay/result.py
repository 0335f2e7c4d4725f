"""What a decision did over a replay (`ReplayResult`, every replay's one result), one replayed
comparison, and the one writer of its report, for every decision.

A `Comparison` is what one group (a domain, a category, a split, a batch size) replayed: each
method's speed (tokens/s, or speed over AR) beside the learned decision's, which of them is the
static a user deploys, the best static, the best training-free peer and the hindsight oracle,
facts of the group (its chosen setting, a mean width), and, where methods were replayed output
by output, every output's speed. A method's speed over outputs is their geometric mean
(`metrics.geomean`); paired ratios with confidence intervals are `metrics.paired_speedup`; the
learned decision's share of the oracle's gain over the deployed static is `metrics.oracle_share`.
Nothing else in `replay` or `train` computes these.

A `Report` writes comparisons through `Column`s: each column a value of a comparison, its key in
the artifact's dict and its heading in the printed table (either may be left out). Every
decision (`train.stop.report.HEADLINE`, `replay.copy.DOMAINS` and `MIX`, `replay.width.REPORT`,
`train.budget.trainer.REPORT`) lays its comparisons out so, keeping its artifact's own keys,
and records and prints them through `Report.write`:

    records, table = report.write(comparisons)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from mcsd_runtime import metrics
from mcsd_runtime.pricing.step_model import StepOutcome


@dataclass
class ReplayResult:
    """What one decision did over a replay, whichever replay (`replay.depth`, `replay.ragged`,
    `replay.copy`, `replay.width`): counts summed over its steps, `count`ed one step at a time,
    and the seconds they cost under the profile. `choices`: the copy length or width chosen at
    each step, where the replay records them (left out of `as_dict`)."""

    stopper: str  # the decision replayed
    mode: str  # "exact" or "estimate"
    tokens: int = 0  # committed tokens (exact) / expected tokens (estimate)
    steps: int = 0  # target calls (at B > 1: steps of rows, one per row per batch step)
    accepted: int = 0
    drafted_depth: int = 0  # sum over steps of s
    drafted_tokens: int = 0  # tree nodes drafted (copied tokens, for a copy)
    target_tokens: int = 0  # tokens through the target
    draft_forwards: int = 0
    decisions: int = 0  # stopper consultations
    cost_s: float = 0.0
    acceptance_sum: float = 0.0
    drafting_steps: int = 0  # steps that drafted (or copied) at least one depth
    batch_size: int = 1
    batch_steps: int = 0  # steps of the batch (forwards of the target); `steps` counts rows'
    decision_rows: int = 0  # frontiers the decisions read (a batched call reads several)
    choices: list[int] = field(default_factory=list)

    def count(self, out: StepOutcome, depth: int, drafted: int, through_target: int,
              seconds: float = 0.0) -> None:
        """One step with outcome `out` that drafted (or copied) `depth` depths, `drafted`
        tokens, and sent `through_target` tokens through the target, costing `seconds`."""
        self.tokens += out.committed
        self.steps += 1
        self.accepted += out.accepted
        self.drafted_depth += depth
        self.drafted_tokens += drafted
        self.target_tokens += through_target
        self.cost_s += seconds
        if depth:
            self.acceptance_sum += out.accepted / depth
            self.drafting_steps += 1

    @property
    def tau(self) -> float:
        return metrics.tau(self.tokens, self.steps)

    @property
    def throughput(self) -> float:
        return metrics.throughput(self.tokens, self.cost_s)

    @property
    def acceptance_rate(self) -> float:
        return metrics.acceptance_rate(self.acceptance_sum, self.drafting_steps)

    def as_dict(self) -> dict:
        values = {k: v for k, v in asdict(self).items() if k != "choices"}
        return values | {"tau": self.tau, "throughput": self.throughput,
                         "acceptance_rate": self.acceptance_rate}


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()  # a column's value where the group has none: left out of the record


@dataclass(frozen=True)
class Comparison:
    """One group's replayed speeds: the learned decision (`learned`), the `deployed` static, the
    `best_static`, the best `peer` and the `oracle` among `speeds`; `outputs`: each method's
    speed on every output, where it was replayed output by output."""

    group: str
    speeds: dict[str, float]
    deployed: str
    best_static: str | None = None
    peer: str | None = None
    outputs: dict[str, list[float]] = field(default_factory=dict)
    trained: bool = False  # the group holds training prompts
    facts: dict[str, Any] = field(default_factory=dict)
    learned: str = "learned"
    oracle: str = "oracle"

    @classmethod
    def of_outputs(cls, group: str, outputs: dict[str, list[float]], deployed: str,
                   statics: Iterable[str] = (), **kw) -> Comparison:
        """From every method's speed on each output: its speed the geometric mean; the best
        static the fastest of `statics` (the first of equals), else the deployed one."""
        speeds = {m: metrics.geomean(v) for m, v in outputs.items()}
        statics = list(statics)
        best = max(statics, key=speeds.__getitem__) if statics else deployed
        return cls(group, speeds, deployed, best, outputs=outputs, **kw)

    @classmethod
    def pooled(cls, group: str, parts: Sequence[Comparison], **kw) -> Comparison:
        """`parts`' outputs pooled into one group, the same methods deployed and compared."""
        first = parts[0]
        outputs = {m: [v for p in parts for v in p.outputs[m]] for m in first.outputs}
        return cls.of_outputs(group, outputs, first.deployed, learned=first.learned,
                              oracle=first.oracle, **kw)

    def with_outputs(self, outputs: dict[str, list[float]]) -> Comparison:
        """This comparison with more methods, replayed output by output."""
        return replace(self, speeds=self.speeds | {m: metrics.geomean(v)
                                                   for m, v in outputs.items()},
                       outputs=self.outputs | outputs)

    @property
    def n(self) -> int:
        """Outputs replayed (of the learned decision)."""
        return len(self.outputs[self.learned])

    def speed(self, method: str | None = None) -> float | None:
        return self.speeds.get(method or self.learned)

    def ratio(self, method: str | None = None, over: str | None = None) -> float | None:
        """`method`'s speed (default: the learned decision's) over `over`'s (default: the
        deployed static's); None where `over` has none."""
        den = self.speeds.get(over or self.deployed)
        return self.speeds[method or self.learned] / den if den else None

    def share(self, method: str | None = None, oracle: str | None = None,
              base: str | None = None) -> float | None:
        """`metrics.oracle_share` of `method` (default: learned) against `oracle` (default:
        the oracle) over `base` (default: the deployed static)."""
        return metrics.oracle_share(self.speeds[method or self.learned],
                                    self.speeds[base or self.deployed],
                                    self.speeds[oracle or self.oracle])

    def paired(self, method: str | None = None, over: str | None = None) -> dict:
        """`metrics.paired_speedup` of `method` over `over` output by output (defaults as
        `ratio`)."""
        return metrics.paired_speedup(self.outputs[method or self.learned],
                                      self.outputs[over or self.deployed])


# ------------------------------------------------------------------ cells of the table
def number(v: float) -> str:
    return f"{v:.3f}"


def pct(share: float | None) -> str:
    """A share as a percentage; "-" where there is none (NaN too)."""
    return "-" if share is None or share != share else f"{share:.0%}"


def ci(p: dict) -> str:
    """A `metrics.paired_speedup` as `geomean [low, high]`."""
    return f"{p['geomean']:.3f} [{p['ci_low']:.3f}, {p['ci_high']:.3f}]"


def nan_if_none(x: float | None) -> float:
    return float("nan") if x is None else x


@dataclass(frozen=True)
class Column:
    """A value of a comparison: `key` in the artifact's dict (unless not `recorded`), under
    `header` in the printed table (unless None), printed by `cell`."""

    key: str
    value: Callable[[Comparison], Any]
    header: str | None = None
    cell: Callable[[Any], str] = number
    recorded: bool = True


@dataclass(frozen=True)
class Report:
    """A decision's layout of its comparisons (module docstring). `label`: the first printed
    column (None: none); `printed`: the printed columns' keys in order (default: every column
    with a header, in order), a column left out where no group has it; `order`: sorts the
    printed rows by their values (the records keep the groups' order)."""

    columns: tuple[Column, ...]
    label: Column | None = None
    printed: tuple[str, ...] = ()
    order: Callable[[dict], Any] | None = None

    def values(self, comparison: Comparison) -> dict[str, Any]:
        return {c.key: c.value(comparison) for c in self.columns}

    def record(self, comparison: Comparison) -> dict[str, Any]:
        """The artifact's dict of one comparison."""
        return self._record(self.values(comparison))

    def write(self, comparisons: Sequence[Comparison]) -> tuple[list[dict], str]:
        """The artifact's dicts of `comparisons`, and their printed table."""
        rows = [self.values(c) for c in comparisons]
        labels = [self.label.value(c) for c in comparisons] if self.label else None
        return [self._record(r) for r in rows], self._table(rows, labels)

    def _record(self, values: dict) -> dict:
        return {c.key: values[c.key] for c in self.columns
                if c.recorded and values[c.key] is not ABSENT}

    def _table(self, rows: list[dict], labels: list[str] | None) -> str:
        by_key = {c.key: c for c in self.columns}
        keys = self.printed or tuple(c.key for c in self.columns if c.header is not None)
        cols = [by_key[k] for k in keys if any(r[k] is not ABSENT for r in rows)]
        by = self.order
        order = sorted(range(len(rows)), key=lambda i: by(rows[i])) if by else range(len(rows))
        lines = [[c.header or "" for c in cols],
                 *([_cell(c, rows[i][c.key]) for c in cols] for i in order)]
        widths = [max(len(line[j]) for line in lines) for j in range(len(cols))]
        names = ([self.label.header or "", *(labels[i] for i in order)]
                 if self.label is not None and labels is not None else [""] * len(lines))
        wide = max(map(len, names))
        return "\n".join((f"{name:{wide}}  " if wide else "")
                         + "  ".join(f"{v:>{w}}" for v, w in zip(line, widths, strict=True))
                         for name, line in zip(names, lines, strict=True))


def _cell(column: Column, value: Any) -> str:
    return "-" if value is ABSENT or value is None else column.cell(value)
