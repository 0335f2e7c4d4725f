"""A verification budget across the batch, as a stopper: each row's tree chosen by expected
committed tokens per second of the whole batch step (`mcsd_runtime.decisions.budget`'s rule).

It is a `Planner` (`mcsd_runtime.decisions.contract`): the decoder asks it `plan`, `extend` and
`verify` at every batch size: before the step, which rows draft at all (their first
draft forward must pay for itself: in a batch, no draft forward at all saves its whole floor);
after each depth, which rows draft one more; after drafting, how many depths each row verifies.
Every choice compares a token's expected return, its *survival* (the probability that it lies
on the accepted path), against what one more token costs the step, from a cost profile's ragged
prices (`CostProfile.ragged_target`, `ragged_draft`: a row that drafts or verifies less costs
less, which a ragged batch makes true). A row's survival is the product of per-token acceptance
estimates along its path; the *estimate* is what differs between budgets:

- `survival:Q@PROFILE` (`DraftProbability`): the draft's own cumulative probability to the power
  Q (a token's estimate is its draft probability^Q); before the first depth, the row's recent
  acceptance rate;
- `budget:PATH` (`LearnedSurvival`, `mcsd train --decision budget`): a node model trained on
  collected runs (the stopper's, hard label: P(a node and its child are accepted)), calibrated
  on validation prompts, with the profile it was trained under;
- `survival-sts:PATH@PROFILE` (`StsAcceptance`, `mcsd train --decision sts`): DSpark's
  per-position calibration, a token's acceptance at depth j sigmoid(logit(q) / T_j + b_j).

`replay.ragged` asks the same object the same questions with collected rows' frontiers, so a
replay takes the decoder's decisions. Trees of several candidates are read by their best node
(its path). Lossless like every stopper: it only chooses what is drafted and verified.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Protocol, TypeGuard

from mcsd_runtime.decisions.budget import draft_rows, verify_counts
from mcsd_runtime.decisions.contract import Frontier, Planner, StepStart
from mcsd_runtime.decisions.features import TRAJECTORY_FEATURES
from mcsd_runtime.decisions.sts import StsCalibration, confidence_logit
from mcsd_runtime.errors import MCSDError

ACCEPT_RECENT = TRAJECTORY_FEATURES.index("accept_rate_recent")
PREV_ACCEPTED = TRAJECTORY_FEATURES.index("prev_accepted")


class Estimate(Protocol):
    """Per-token acceptance estimates of a budget. A row's *gain* is the survival of the token
    it would draft next: what drafting it is expected to return."""

    name: str

    def first(self, start: Frontier) -> float:
        """The gain of a row's first drafted token, before drafting."""
        ...

    def node(self, frontier: Frontier, prior: float, parent: float) -> tuple[float, float]:
        """(the survival of the frontier's best node, the gain of drafting its child); `prior`
        is the gain this node was predicted before it was drafted, `parent` its parent's
        survival (1 at depth 1)."""
        ...


class DraftProbability:
    """Survival from the draft's own path probability, to the power `power`; before the first
    depth, the row's recent acceptance rate."""

    def __init__(self, power: float = 1.0) -> None:
        if not power > 0:
            raise MCSDError(f"survival:Q needs Q > 0, got {power!r}")
        self.power = power
        self.name = f"survival:{power:g}"

    def first(self, start: Frontier) -> float:
        return float(start.trajectory()[ACCEPT_RECENT])

    def node(self, frontier: Frontier, prior: float, parent: float) -> tuple[float, float]:
        log_path = frontier.column("log_path_prob")
        best = int(log_path.argmax())
        survival = math.exp(self.power * float(log_path[best]))
        return survival, survival * float(frontier.column("draft_prob")[best]) ** self.power


class LearnedSurvival:
    """Survival from a trained stopper's calibrated node model (hard label: a node's score is
    P(it and its child are accepted), the gain of drafting the child); a node's own survival is
    what was predicted for it. Before the first depth, the row's recent acceptance rate."""

    def __init__(self, stopper, name: str) -> None:
        if stopper.calibration is None:
            raise MCSDError(f"{name}: the budget needs calibrated node scores (probabilities); "
                            f"train the stopper with a cost profile (mcsd train --cost-profile)")
        self.stopper, self.name = stopper, name

    def first(self, start: Frontier) -> float:
        return float(start.trajectory()[ACCEPT_RECENT])

    def node(self, frontier: Frontier, prior: float, parent: float) -> tuple[float, float]:
        return self.nodes([frontier], [prior], [parent])[0]

    def nodes(self, frontiers: Sequence[Frontier], priors: list[float],
              parents: list[float]) -> list[tuple[float, float]]:
        """`node` of several rows' frontiers, their nodes through the model in one call."""
        scores = self.stopper.calibrated_scores(frontiers)
        return [(prior, min(prior, float(max(s)))) for (s, _), prior in
                zip(scores, priors, strict=True)]


class OnlineAcceptance:
    """vLLM's estimate: a token's acceptance is a logistic of logit(q), q its draft probability,
    refitted online (one gradient step of rate `lr` per verified token) from what the target
    accepted; it starts as q itself (weight 1, bias 0). A node's survival is its parent's times
    its acceptance; its child's gain is that times the same acceptance again."""

    learns = True

    def __init__(self, lr: float = 0.05) -> None:
        if not lr > 0:
            raise MCSDError(f"survival-online:LR needs LR > 0, got {lr!r}")
        self.lr, self.w, self.b = lr, 1.0, 0.0
        self.name = "survival-online" + (f":{lr:g}" if lr != 0.05 else "")

    def first(self, start: Frontier) -> float:
        return float(start.trajectory()[ACCEPT_RECENT])

    def feature(self, frontier: Frontier) -> float:
        """logit(q) of the frontier's best node, clipped to [-10, 10] (`confidence_logit`)."""
        return best_logit(frontier)

    def accept(self, x: float) -> float:
        return 1.0 / (1.0 + math.exp(-(self.w * x + self.b)))

    def node(self, frontier: Frontier, prior: float, parent: float) -> tuple[float, float]:
        a = self.accept(self.feature(frontier))
        return parent * a, parent * a * a

    def learn(self, xs: list[float], labels: list[float]) -> None:
        for x, y in zip(xs, labels, strict=True):
            g = self.accept(x) - y
            self.w, self.b = self.w - self.lr * g * x, self.b - self.lr * g


class LearningEstimate(Estimate, Protocol):
    """An estimate that refits itself from what the target accepted (`learns = True`)."""

    learns: bool

    def feature(self, frontier: Frontier) -> float:
        """What it reads of the frontier's best node."""
        ...

    def learn(self, xs: list[float], labels: list[float]) -> None:
        """One refit on `feature` values and their outcomes (1: accepted)."""
        ...


def learning(estimate: Estimate) -> TypeGuard[LearningEstimate]:
    """Whether `estimate` learns online (`learns`)."""
    return bool(getattr(estimate, "learns", False))


def best_logit(frontier: Frontier) -> float:
    """`confidence_logit` of the draft probability of the frontier's best node (the highest
    path probability)."""
    log_path = frontier.column("log_path_prob")
    return confidence_logit(float(frontier.column("draft_prob")[int(log_path.argmax())]))


class StsAcceptance:
    """DSpark's per-position calibration (`mcsd_runtime.decisions.sts`): a token at depth j has
    acceptance sigmoid(logit(q) / T_j + b_j), q its draft probability, T_j (and b_j, 0 without
    offsets) from an STS table (`mcsd train --decision sts`; depths beyond the table take its
    last). A node's survival is its
    parent's times its acceptance; its child's gain is that times the same logit at the next
    position's T. Before the first depth, the row's recent acceptance rate."""

    def __init__(self, calibration: StsCalibration, name: str = "survival-sts") -> None:
        self.calibration, self.name = calibration, name

    def first(self, start: Frontier) -> float:
        return float(start.trajectory()[ACCEPT_RECENT])

    def node(self, frontier: Frontier, prior: float, parent: float) -> tuple[float, float]:
        x, conf = best_logit(frontier), self.calibration.confidence
        survival = parent * conf(x, frontier.depth)
        return survival, survival * conf(x, frontier.depth + 1)


class VerifyBudget(Planner):
    """The budget of the module docstring for `estimate` under `profile` (a `CostProfile`) at
    `batch_size` rows (`for_batch` gives each batch size its own): a decoder's planner
    (`MCSDDecoder(planner=...)`, or a spec such as `survival:1@PROFILE`). A learned one is a
    trained decision (`mcsd_runtime.decisions.manifest`): `load` reads its folder."""

    decision: ClassVar[str] = "budget"
    temperature: float = 0.0  # of the outputs a learned one was trained on

    @classmethod
    def load(cls, folder: str | Path) -> VerifyBudget:
        return load_budget(folder)

    def __init__(self, estimate: Estimate, profile, batch_size: int = 1,
                 rate: float | None = None) -> None:
        self.estimate, self.profile, self.batch_size, self.rate = (
            estimate, profile, batch_size, rate)
        self.n, self.paid, self.verified, self.expected = 0, 0.0, 0, 0.0
        self.caps: list[int] = []
        self.surv: list[list[float]] = []
        self.gain: list[float] = []  # per row: its next token's predicted survival
        self.depth_s = 0.0
        # an estimate that learns (`learns`): this step's rows, their tokens' features, and the
        # last step's (row -> (row, features, verified)) until their outcome is known
        self.rows: list[object] = []
        self.seen: list[list[float]] = []
        self.waiting: dict[int, tuple[object, list[float], int]] = {}

    def __repr__(self) -> str:
        return f"VerifyBudget({self.estimate.name}, B={self.batch_size})"

    def for_batch(self, batch_size: int) -> VerifyBudget:
        out = VerifyBudget(self.estimate, self.profile, batch_size, self.rate)
        out.temperature = self.temperature
        return out

    def check_tree(self, k_config: tuple[int, ...]) -> None:
        """A learned budget's node model was trained on one tree: refuse another."""
        stopper = getattr(self.estimate, "stopper", None)
        if stopper is not None:
            stopper.check_tree(k_config)

    # ------------------------------------------------------------------ the planner
    def plan(self, starts: Sequence[StepStart]) -> list[bool]:
        """Which rows draft at all this step (see the contract)."""
        n = self.n = len(starts)
        step_s, self.depth_s = self.profile.overheads(n)
        self.paid, self.verified, self.expected = step_s, n, float(n)
        self.caps = [s.cap for s in starts]
        live = [s if s.cap else None for s in starts]
        self.surv = [[] for _ in starts]
        self.gain = [self.estimate.first(s) if s is not None else 0.0 for s in live]
        if learning(self.estimate):
            self._learn(self.estimate, live)
        cand = [i for i in range(n) if self.caps[i] > 0]
        chosen = self._choose(cand, [starts[i].pending for i in cand], first=True)
        return [i in chosen for i in range(n)]

    def extend(self, frontiers: Sequence[Frontier | None]) -> list[bool]:
        """The survivals of the depth just drafted, then which rows draft one more."""
        drew = [i for i, f in enumerate(frontiers) if f is not None]
        shown = [f for f in frontiers if f is not None]  # the frontiers of the rows in `drew`
        if not shown:
            return [False] * len(frontiers)
        depth = shown[0].depth
        learner = self.estimate if learning(self.estimate) else None
        parents = [self.surv[i][-1] if self.surv[i] else 1.0 for i in drew]
        many = getattr(self.estimate, "nodes", None)  # every row's in one call, where it can
        values = (many(shown, [self.gain[i] for i in drew], parents)
                  if many is not None else
                  [self.estimate.node(f, self.gain[i], p)
                   for i, f, p in zip(drew, shown, parents, strict=True)])
        for i, f, (s, gain) in zip(drew, shown, values, strict=True):
            self.gain[i] = gain
            self.surv[i].append(s)
            if learner is not None:
                self.seen[i].append(learner.feature(f))
            self.verified, self.expected = self.verified + 1, self.expected + s
        cand = [i for i in drew if self.caps[i] > depth]
        chosen = self._choose(cand, [1] * len(cand), first=False)
        return [i in chosen for i in range(len(frontiers))]

    def verify(self, drafted: list[int]) -> list[int]:
        """How many of its drafted depths each row verifies."""
        counts = verify_counts(self.surv, self._step_s, self.rate)
        if learning(self.estimate):
            self.waiting = {id(row): (row, seen[:n], n) for row, seen, n in
                            zip(self.rows, self.seen, counts, strict=True)
                            if n and row is not None}
        return [min(n, c) for n, c in zip(drafted, counts, strict=True)]

    def _learn(self, estimate: LearningEstimate, starts: Sequence[StepStart | None]) -> None:
        """The last step's verified tokens, labelled by what the target accepted (the rows'
        `prev_accepted` now), go to `estimate` (the budget's); this step's rows are noted."""
        for s in starts:
            row = s.row if s is not None else None
            if s is not None and row is not None and id(row) in self.waiting:
                _, xs, n = self.waiting[id(row)]
                accepted = s.trajectory()[PREV_ACCEPTED]
                estimate.learn(xs, [float(d <= accepted) for d in range(1, n + 1)])
        self.waiting = {}
        self.rows = [s.row if s is not None else None for s in starts]
        self.seen = [[] for _ in starts]

    def _step_s(self, tokens: int) -> float:
        return self.paid + self.profile.ragged_target(tokens, self.n)

    def _choose(self, cand: list[int], feed: list[int], first: bool) -> set[int]:
        """The candidate rows that draft the next depth, by their gains; pays their forward."""
        def draft_s(tokens: int, k: int) -> float:
            # a ragged draft forward carries the drafting rows' tokens over the batch's caches
            return self.profile.ragged_draft(tokens, self.n, first) + self.depth_s if k else 0.0

        picked = draft_rows([1.0] * len(cand), [self.gain[i] for i in cand], draft_s,
                            self._step_s, self.verified, self.expected, feed, self.rate)
        self.paid += draft_s(sum(feed[c] for c in picked), len(picked))
        return {cand[c] for c in picked}


def online_budget(args: list[str], spec: str) -> VerifyBudget:
    """`survival-online[:LR]@PROFILE`: the budget on `OnlineAcceptance` (vLLM's rule)."""
    return survival_budget(args, spec, online=True)


def survival_budget(args: list[str], spec: str, online: bool = False) -> VerifyBudget:
    """`survival:Q@PROFILE` (Q defaults to 1): the draft-probability budget under the cost
    profile at PROFILE (`mcsd profile --batch-size ...` writes one)."""
    from mcsd_runtime.pricing.profile import CostProfile

    power, _, path = ":".join(args).partition("@")
    name = "survival-online:LR" if online else "survival:Q"
    if not path:
        raise MCSDError(f"budget {spec!r}: the budget prices tokens with a cost profile: "
                        f"{name}@PROFILE.json (`mcsd profile --batch-size 1,4,8,16` writes one)")
    try:
        q = float(power) if power else (0.05 if online else 1.0)
    except ValueError:
        raise MCSDError(f"budget {spec!r}: {name[-1]} must be a number, e.g. "
                        f"{name.partition(':')[0]}:1@cost.json") from None
    if not Path(path).is_file():
        raise MCSDError(f"budget {spec!r}: no cost profile at {path}")
    estimate = OnlineAcceptance(q) if online else DraftProbability(q)
    return VerifyBudget(estimate, CostProfile.load(path))


def sts_budget(args: list[str], spec: str) -> VerifyBudget:
    """`survival-sts:PATH@PROFILE`: the budget on `StsAcceptance`, PATH an STS table (or the
    folder of `mcsd train --decision sts` holding it), PROFILE a cost profile."""
    from mcsd_runtime.pricing.profile import CostProfile

    table, _, path = ":".join(args).partition("@")
    if not table or not path:
        raise MCSDError(f"budget {spec!r}: survival-sts:PATH@PROFILE.json names an STS table "
                        f"(`mcsd train --decision sts` writes one) and a cost profile (`mcsd "
                        f"profile --batch-size 1,4,8,16` writes one)")
    if not Path(path).is_file():
        raise MCSDError(f"budget {spec!r}: no cost profile at {path}")
    name = Path(table).name
    estimate = StsAcceptance(StsCalibration.load(table), f"survival-sts:{name}")
    return VerifyBudget(estimate, CostProfile.load(path))


BUDGET_FILE, BUDGET_FORMAT, BUDGET_VERSION = "budget.json", "mcsd-budget", 1


def write_budget(folder: Path, calibration, profile_file: str, report: dict) -> None:
    """`folder/budget.json`: the node model's calibration, the profile's file (beside it) and
    the training's replayed report. The stopper's own files hold the node model."""
    import json

    from mcsd_runtime.paths import atomic_write_text

    atomic_write_text(folder / BUDGET_FILE, json.dumps({
        "format": BUDGET_FORMAT, "version": BUDGET_VERSION, "stopper": "stopper.json",
        "profile": profile_file, "calibration": calibration.to_json(), "report": report},
        indent=1, default=float))


def load_budget(folder: str | Path) -> VerifyBudget:
    """The learned budget trained into `folder` (`mcsd train --decision budget`)."""
    from mcsd_runtime.decisions.artifact import ArtifactSpec
    from mcsd_runtime.decisions.expected_rate import Calibration
    from mcsd_runtime.decisions.learned import stopper_from
    from mcsd_runtime.paths import read_card_file
    from mcsd_runtime.pricing.profile import CostProfile

    folder = Path(folder)
    data = read_card_file(folder, BUDGET_FILE, BUDGET_FORMAT, "budget", lambda root, what: (
        f"{root} holds no usable budget: {what}; train one with `mcsd train --decision budget "
        f"--out {root}`"))
    if data.get("version") != BUDGET_VERSION:
        raise MCSDError(f"{folder / BUDGET_FILE}: version {data.get('version')}; this release "
                        f"reads version {BUDGET_VERSION}: retrain with `mcsd train --decision "
                        f"budget`")
    stopper = stopper_from(ArtifactSpec.read(folder), folder)
    stopper.calibration = Calibration.from_json(data.get("calibration"))
    budget = VerifyBudget(LearnedSurvival(stopper, f"budget:{folder.name}"),
                          CostProfile.load(folder / data["profile"]))
    budget.temperature = stopper.temperature
    return budget
