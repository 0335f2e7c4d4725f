"""Replay of ragged batch steps: every row of a batch drafts and verifies its own depth, and a
step costs what its forwards' total tokens cost (`CostProfile.ragged_step_seconds`), not rows x
widest as the padded batches of `replay.depth` do.

The walk is exact replay of a dense greedy collection (one full-depth step at every position of
each output, so each position's accepted length L_t is known): B rows, prompts admitted in order
into free slots (as `replay.depth`), and at each batch step a *rule* plans every active row as
(drafted, verified) depths, verified <= drafted. A row accepts min(L_t, verified) and commits
those plus the target's token; a row that drafts nothing is left out of the draft's forwards
(its pending tokens wait for its next draft). Decisions are charged nothing.

Rules (`make_rule`):

- `static:S` — every row drafts and verifies min(S, its cap) (per-row static depth, ragged);
- `cumprod:T` — each row runs its own `CumprodStopper` (draft one more depth while the path's
  draft probability is at least 1 - T) and verifies what it drafted;
- `survival:Q` — the verification budget of `mcsd_runtime.decisions.budget` with a node's survival
  the cumulative draft probability to the power Q; before depth 1 a row's predicted acceptance
  is its recent acceptance rate (`Trajectory`), before depth d > 1 the draft probability of its
  depth d - 1 token to the power Q;
- `oracle` — the per-batch-step hindsight oracle: each row drafts and verifies min(L_t, cap)
  and drafts nothing when L_t = 0 (the bound of per-row depths);
- `oracle-budget` — the budget rule fed the truth (survival 1 up to L_t, 0 after): the oracle
  less the depths that do not pay for their forwards.

Today's padded static depth is `replay.depth.replay(data, "static:S", batch_size=B)`;
`compare` lays padded and ragged rules side by side per batch size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mcsd_runtime.decisions.builtin import make_stopper
from mcsd_runtime.decisions.contract import Planner, StopperBase
from mcsd_runtime.decisions.sts import StsCalibration
from mcsd_runtime.decisions.verify_budget import (
    DraftProbability,
    OnlineAcceptance,
    StsAcceptance,
    VerifyBudget,
)
from mcsd_runtime.decode.planning import Drive, RowPlanner, drive
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.tree import Tree
from replay.data import ReplayData
from replay.depth import NeverDraft, WalkRow, replay
from replay.result import ReplayResult

RULE_HELP = ("static:S (each row depth S), cumprod:T (each row its own cumprod stopper), "
             "survival:Q (the budget rule on cumulative draft probability ^ Q), "
             "survival-online[:LR] (the budget on an online logistic of logit(q)), "
             "survival-sts:PATH (the budget on DSpark's per-position calibration of logit(q), "
             "an STS table of `mcsd train --decision sts`), oracle (each "
             "row verifies min(L, cap)), oracle-budget (the budget rule fed the truth)")


class _Plain(StopperBase):
    def should_continue(self, frontier) -> bool:
        return False


class PerRow:
    """Each row's own copy of a stopper decides its depth (`RowPlanner` in row mode, driven by
    `planning.drive`); it verifies what it drafted."""

    def __init__(self, spec: str) -> None:
        self.name, self.stopper = spec, make_stopper(spec)

    def plan(self, rows: list[WalkRow], tree: Tree, profile: CostProfile) -> list[tuple[int, int]]:
        planner = RowPlanner(self.stopper, batch_decides=False, by_row=True)
        for row, draft in zip(rows, planner.plan([r.start(tree.depth) for r in rows]),
                              strict=True):
            row.skip = not draft
        run = _drive(planner, rows, [r.cap for r in rows], tree.depth)
        return [(s, s) for s in run.reach]


def _drive(planner: Planner, rows: list[WalkRow], caps: list[int], max_depth: int) -> Drive:
    """`planning.drive` over the rows' recorded depths (nothing to forward in replay)."""
    return drive(planner, caps, lambda depth, drew: [
        r.frontier(depth, max_depth) if d else None
        for r, d in zip(rows, drew, strict=True)], lambda *_: None)


class Oracle:
    """The per-batch-step hindsight oracle: min(L_t, cap) drafted and verified."""

    name, stopper = "oracle", _Plain()

    def plan(self, rows: list[WalkRow], tree: Tree, profile: CostProfile) -> list[tuple[int, int]]:
        return [(min(r.step.accepted, r.cap),) * 2 if r.step else (0, 0) for r in rows]


class Truth:
    """The budget's estimate fed the truth: survival 1 up to the step's accepted length, 0
    after (replay only: frontiers served from collected rows know it)."""

    name = "oracle-budget"

    def first(self, start) -> float:
        return float(start.oracle_accepted >= 1)

    def node(self, frontier, prior: float, parent: float) -> tuple[float, float]:
        accepted, depth = frontier.oracle_accepted, frontier.depth
        return float(depth <= accepted), float(depth + 1 <= accepted)


class Budget:
    """The verification budget (`mcsd_runtime.decisions.verify_budget.VerifyBudget`) asked as the
    decoder asks it, as the planner of a step, with the replayed rows' frontiers: the same
    decisions on the same steps, for any of its estimates (the truth included)."""

    stopper = _Plain()

    def __init__(self, estimate, name: str | None = None) -> None:
        self.estimate, self.name = estimate, name or estimate.name
        self.budget: VerifyBudget | None = None  # one for the walk, as the decoder's batch has

    def __str__(self) -> str:
        return self.name

    def plan(self, rows: list[WalkRow], tree: Tree, profile: CostProfile) -> list[tuple[int, int]]:
        if any(k != 1 for k in tree.sizes):
            raise MCSDError(f"the budget rules replay chains (1,1,...), not the tree {tree}")
        if self.budget is None or self.budget.profile is not profile:
            self.budget = VerifyBudget(self.estimate, profile, len(rows))
        budget = self.budget
        go = budget.plan([r.start(tree.depth) for r in rows])
        run = _drive(budget, rows, [r.cap if g else 0 for r, g in zip(rows, go, strict=True)],
                     tree.depth)
        return list(zip(run.reach, run.verify, strict=True))


def scaled_draft(profile: CostProfile, factor: float) -> CostProfile:
    """`profile` with every draft forward (all batch sizes, first forwards too) costing
    `factor` times as much: what a cheaper or costlier draft of the same acceptance would win."""
    if not factor > 0:
        raise MCSDError(f"a draft's cost factor must be positive, got {factor}")

    def scale(values: list[float]) -> list[float]:
        return [factor * v for v in values]

    batches = {b: replace(c, draft_s=scale(c.draft_s), draft_first_s=_maybe(scale, c.draft_first_s))
               for b, c in profile.batches.items()}
    ragged = {b: replace(r, draft=[[t, factor * v] for t, v in r.draft])
              for b, r in profile.ragged.items()}
    return replace(profile, draft_s=scale(profile.draft_s),
                   draft_first_s=_maybe(scale, profile.draft_first_s), batches=batches,
                   ragged=ragged,
                   note=f"{profile.note} (draft forwards x{factor:g})".strip())


def _maybe(curve: Callable[[list[float]], list[float]],
           values: list[float] | None) -> list[float] | None:
    """`curve(values)`; None for an absent (optional) curve."""
    return None if values is None else curve(values)


def affine_profile(profile: CostProfile, upto: int) -> CostProfile:
    """`profile` with each curve (target, draft, first draft; every batch size) replaced by its
    least-squares line over the token counts up to `upto` (slope at least 0): one noisy count
    then cannot decide a comparison. The lines keep each curve's level and slope where replay
    prices it (up to the tree's depth + 1 tokens a row). Measured ragged forwards are dropped:
    ragged forwards are priced by the fitted padded lines."""
    xs = [n for n in profile.tokens if n <= upto]
    if len(xs) < 2:
        raise MCSDError(f"an affine fit needs two token counts up to {upto}, the profile has "
                        f"{len(xs)}")

    def line(values: list[float]) -> list[float]:
        ys = values[:len(xs)]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
                    / sum((x - mx) ** 2 for x in xs), 0.0)
        return [max(my + slope * (n - mx), 0.0) for n in profile.tokens]

    batches = {b: replace(c, target_s=line(c.target_s), draft_s=line(c.draft_s),
                          draft_first_s=_maybe(line, c.draft_first_s))
               for b, c in profile.batches.items()}
    return replace(profile, target_s=line(profile.target_s), draft_s=line(profile.draft_s),
                   draft_first_s=_maybe(line, profile.draft_first_s), batches=batches, ragged={},
                   note=f"{profile.note} (curves fitted by lines up to {upto} tokens)".strip())


def make_rule(spec: str):
    """The ragged rule a spec names (`RULE_HELP`)."""
    name, _, arg = spec.partition(":")
    if spec == "oracle":
        return Oracle()
    if spec == "oracle-budget":
        return Budget(Truth())
    if name == "survival":
        try:
            return Budget(DraftProbability(float(arg or 1.0)))
        except ValueError:
            raise MCSDError(f"survival:Q needs a number Q, got {spec!r}") from None
    if name == "survival-online":
        return Budget(OnlineAcceptance(*([float(arg)] if arg else [])))
    if name == "survival-sts":
        if not arg:
            raise MCSDError(f"{spec!r}: survival-sts:PATH names an STS table (`mcsd train "
                            f"--decision sts` writes one)")
        return Budget(StsAcceptance(StsCalibration.load(arg), f"survival-sts:{Path(arg).name}"))
    if name in ("static", "cumprod"):
        return PerRow(spec)
    raise MCSDError(f"unknown ragged rule {spec!r}: {RULE_HELP}")


def ragged_replay(data: ReplayData, rule, profile: CostProfile,
                  batch_size: int = 1) -> ReplayResult:
    """Replay `rule` (a spec or a rule object) over every prompt in ragged batches of
    `batch_size` rows (exact replay only); the result's `stopper` is the rule's name."""
    if data.mode != "exact":
        raise MCSDError("ragged replay walks dense greedy collections (exact replay)")
    if batch_size < 1:
        raise MCSDError(f"batch size must be at least 1, got {batch_size}")
    profile.check_rows(batch_size)
    rule = make_rule(rule) if isinstance(rule, str) else rule
    res = ReplayResult(stopper=rule.name, mode="exact", batch_size=batch_size)
    tree, queue = data.tree, iter(data.prompts.values())
    rows: list[WalkRow] = []
    while True:
        while len(rows) < batch_size and (p := next(queue, None)) is not None:
            row = WalkRow(p, rule.stopper)
            if row.advance(True):
                rows.append(row)
        if not rows:
            return res
        plans = rule.plan(rows, tree, profile)
        res.cost_s += profile.ragged_step_seconds(
            tree, [(r.pending, d, v) for r, (d, v) in zip(rows, plans, strict=True)])
        res.draft_forwards += max(d for d, _ in plans)
        res.batch_steps += 1
        for row, (d, v) in zip(list(rows), plans, strict=True):
            row.commit_planned(d, v, tree, res)
            if not row.advance(True):
                rows.remove(row)


CUMPROD_GRID = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995)
SURVIVAL_GRID = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5)


@dataclass
class Family:
    """A rule family and the settings `compare` tries (the best one is reported)."""

    name: str
    specs: list  # spec strings, or rule objects (`Budget`) named by str()
    padded: bool = False  # replayed by `replay.depth` (padded batches), not ragged


def families(depth: int) -> list[Family]:
    """What `compare` replays: padded static depths, the ragged rules and the two oracles."""
    statics = [f"static:{s}" for s in range(1, depth + 1)]
    return [Family("padded static", statics, padded=True),
            Family("ragged static", statics),
            Family("cumprod", [f"cumprod:{t:g}" for t in CUMPROD_GRID]),
            Family("survival", [f"survival:{q:g}" for q in SURVIVAL_GRID]),
            Family("survival-online", [f"survival-online:{r:g}" for r in (0.01, 0.05, 0.2)]),
            Family("oracle-budget", ["oracle-budget"]),
            Family("oracle", ["oracle"])]


def _tps(data: ReplayData, fam: Family, spec: str, profile: CostProfile, b: int) -> float:
    return (replay(data, spec, profile, batch_size=b) if fam.padded
            else ragged_replay(data, spec, profile, b)).throughput


def compare(data: ReplayData, profile: CostProfile, batch_sizes: list[int],
            fams: list[Family] | None = None, tune: ReplayData | None = None) -> dict:
    """Per batch size: AR's replayed tokens/s, and per family its best setting, that setting's
    tokens/s and ratio to AR and to the best padded static; every setting's tokens/s too.
    `tune`: choose each family's setting on these prompts instead (`all` then holds their
    tokens/s), and report it on `data`."""
    out = {}
    for b in batch_sizes:
        ar = replay(data, NeverDraft(), profile, "ar", batch_size=b).throughput
        rows: dict[str, dict[str, Any]] = {}
        for fam in fams or families(data.depth):
            tps = {str(s): _tps(tune or data, fam, s, profile, b) for s in fam.specs}
            best = max(tps, key=tps.__getitem__)
            spec = next(s for s in fam.specs if str(s) == best)  # a spec or a rule object
            judged = _tps(data, fam, spec, profile, b) if tune else tps[best]
            rows[fam.name] = {"best": best, "tokens_per_s": judged, "all": tps}
        padded = rows.get("padded static", {}).get("tokens_per_s")
        for r in rows.values():
            r["vs_ar"] = r["tokens_per_s"] / ar if ar else None
            r["vs_padded"] = r["tokens_per_s"] / padded if padded else None
        out[b] = {"ar": ar, "families": rows}
    return out


def table(result: dict) -> str:
    """`compare`'s result as a Markdown table: one row per family, one column per batch size."""
    sizes = list(result)
    names = list(next(iter(result.values()))["families"]) if result else []
    head = "| rule | " + " | ".join(f"B={b}" for b in sizes) + " |"
    lines = [head, "|---|" + "---|" * len(sizes),
             "| ar (tokens/s) | " + " | ".join(f"{result[b]['ar']:.0f}" for b in sizes) + " |"]
    for n in names:
        cells = []
        for b in sizes:
            r = result[b]["families"][n]
            vs = f", {r['vs_padded']:.3f}x padded" if r["vs_padded"] is not None else ""
            cells.append(f"{r['tokens_per_s']:.0f} ({r['vs_ar']:.2f}x AR{vs}; {r['best']})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
