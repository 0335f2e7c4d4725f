"""The built-in early-stop policies, and decision specs: the strings that name a stopper or a
verification budget, parsed in one place with one set of rules (`make_decision`, `make_stopper`,
`parse_stopper_spec`).

Every stopper keeps the contract of `mcsd_runtime.decisions.contract` (`Stopper`, `Frontier`,
`StopperBase`; importable from here too). A spec is one of

- `NAME[:P[:P]]`: a built-in of `BUILTIN` with its numeric parameters (`static:4`,
  `confidence:0.4`, `heuristic`, `switch:0.6:2`);
- `stopper:PATH`, or a bare PATH that is a folder: a trained stopper's artifact folder, which must
  hold `stopper.json` (`mcsd_runtime.decisions.learned`);
- `survival...@PROFILE` or `budget:PATH`: a verification budget, which is a whole-step `Planner`
  (a decoder's `planner`, not its stopper).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mcsd_runtime.decisions.artifact import ArtifactSpec
from mcsd_runtime.decisions.contract import (
    MEMBERS,
    Frontier,
    Planner,
    Stopper,
    StopperBase,
    StopperOrPlanner,
)
from mcsd_runtime.decisions.learned import stopper_from
from mcsd_runtime.decisions.skip import DEFAULT_PROBE, SkipGate, SkipsDrafts
from mcsd_runtime.decisions.verify_budget import (
    load_budget,
    online_budget,
    sts_budget,
    survival_budget,
)
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.tree import k_text, parse_k_config

__all__ = ["BUILTIN", "Frontier", "Stopper", "StopperBase", "StopperOrPlanner", "StopperSpec",
           "UnknownStopperError", "make_decision", "make_stopper", "parse_stopper_spec",
           "stopper_help"]


class StaticStopper(StopperBase):
    """Draft every depth of the k-config (or the first `depth` of them)."""

    def __init__(self, depth: int | None = None) -> None:
        self.depth = depth

    def should_continue(self, frontier: Frontier) -> bool:
        return self.depth is None or frontier.depth < self.depth

    def check_tree(self, k_config: tuple[int, ...]) -> None:
        """Refuse a depth the tree does not have (it would silently draft the whole tree)."""
        if self.depth is not None and not 1 <= self.depth <= len(k_config):
            raise MCSDError(
                f"static:{self.depth} needs a tree of at least {self.depth} depths, but the "
                f"k-config {k_text(k_config)} has {len(k_config)}; use "
                f"static:1..{len(k_config)} or a deeper --k-config")


class NoDraftStopper(StopperBase):
    """Draft nothing: every step is the target's alone (with prompt lookup, where nothing is
    copied)."""

    def should_draft(self, start: Frontier) -> bool:
        return False

    def should_continue(self, frontier: Frontier) -> bool:
        return False


class ConfidenceStopper(StopperBase):
    """HF/DISCO style: continue while some frontier token's draft probability is >= T."""

    def __init__(self, threshold: float = 0.4) -> None:
        self.threshold = threshold

    def should_continue(self, frontier: Frontier) -> bool:
        return bool((frontier.column("draft_prob") >= self.threshold).any())


class EntropyStopper(StopperBase):
    """AdaEDL style: the acceptance lower bound 1 - sqrt(gamma * H) must stay >= lam to
    continue, H being the lowest entropy among the distributions that proposed the frontier."""

    def __init__(self, lam: float = 0.5, gamma: float = 0.5) -> None:
        self.lam, self.gamma = lam, gamma

    def should_continue(self, frontier: Frontier) -> bool:
        entropy = frontier.column("q_entropy")
        return bool(1.0 - torch.sqrt(self.gamma * entropy.min()) >= self.lam)


class CumprodStopper(StopperBase):
    """SpecDec++ style: stop once the estimated probability that the best path has a rejection,
    1 - prod(q) along it, exceeds T (the draft's own probabilities estimate acceptance)."""

    def __init__(self, threshold: float = 0.7) -> None:
        self.threshold = threshold

    def should_continue(self, frontier: Frontier) -> bool:
        return bool(1.0 - frontier.column("log_path_prob").max().exp() <= self.threshold)


class HeuristicStopper(StopperBase):
    """HF's assisted-generation schedule: a draft depth (HF's `num_assistant_tokens`), +2 after
    a fully accepted step and -1 (not below 1) otherwise. Starts at the tree's depth."""

    def __init__(self, initial: int | None = None) -> None:
        self.initial = initial
        self.draft_depth: float = initial or math.inf

    def reset(self) -> None:
        self.draft_depth = self.initial or math.inf

    def should_continue(self, frontier: Frontier) -> bool:
        self.draft_depth = min(self.draft_depth, frontier.max_depth)
        return frontier.depth < self.draft_depth

    def update(self, drafted: int, accepted: int) -> None:
        depth = self.draft_depth
        self.draft_depth = depth + 2 if accepted == drafted else max(1, depth - 1)


class SwitchStopper(SkipsDrafts, StaticStopper):
    """A static depth with speculation switched off while it cannot pay (as TensorRT-LLM and
    vLLM do): `depth` depths (None: the whole tree) while the recent acceptance rate is at least
    `rate`, else no draft at all, drafting again after `probe` steps without one
    (`mcsd_runtime.decisions.skip.SkipGate`)."""

    def __init__(self, rate: float = 0.5, depth: int | None = None,
                 probe: int = DEFAULT_PROBE) -> None:
        super().__init__(depth)
        self.skip = SkipGate(rate, probe)

    @property
    def rate(self) -> float:
        return self.skip.rate

    @property
    def probe(self) -> int:
        return self.skip.probe


def _switch(args: list[str], spec: str) -> Stopper:
    values = _floats(args, spec, 3)
    if len(values) > 1 and values[1] != int(values[1]):
        raise MCSDError(f"stopper {spec!r}: DEPTH is a whole number of depths")
    if len(values) > 2 and values[2] != int(values[2]):
        raise MCSDError(f"stopper {spec!r}: PROBE is a whole number of steps")
    rate = values[0] if values else 0.5
    depth = int(values[1]) if len(values) > 1 else None
    probe = int(values[2]) if len(values) > 2 else DEFAULT_PROBE
    return SwitchStopper(rate, depth, probe)


def _floats(args: list[str], spec: str, n_max: int) -> list[float]:
    if len(args) > n_max:
        raise MCSDError(f"stopper {spec!r} takes at most {n_max} parameter(s)")
    try:
        return [float(a) for a in args]
    except ValueError:
        raise MCSDError(
            f"stopper {spec!r}: parameters must be numbers, e.g. confidence:0.4") from None


Builder = Callable[[list[str], str], StopperOrPlanner]

BUILTIN: dict[str, tuple[str, Builder]] = {
    "none": ("none draft nothing: the target alone (with lookup, where nothing is copied)",
             lambda a, s: NoDraftStopper(*_floats(a, s, 0))),
    "static": ("static[:DEPTH] draft the whole k-config (or DEPTH depths)",
               lambda a, s: StaticStopper(*(int(x) for x in _floats(a, s, 1)))),
    "confidence": ("confidence[:T] continue while a frontier token's draft prob >= T (0.4)",
                   lambda a, s: ConfidenceStopper(*_floats(a, s, 1))),
    "entropy": ("entropy[:LAMBDA[:GAMMA]] continue while 1-sqrt(GAMMA*H) >= LAMBDA (0.5, 0.5)",
                lambda a, s: EntropyStopper(*_floats(a, s, 2))),
    "cumprod": ("cumprod[:T] stop once 1 - prod(q) along the best path > T (0.7)",
                lambda a, s: CumprodStopper(*_floats(a, s, 1))),
    "heuristic": ("heuristic HF's +2/-1 depth schedule",
                  lambda a, s: HeuristicStopper(*(int(x) for x in _floats(a, s, 1)))),
    "switch": ("switch[:RATE[:DEPTH[:PROBE]]] static DEPTH (the whole tree) while the recent "
               "acceptance rate >= RATE (0.5), else no draft (the target alone), drafting again "
               f"after PROBE steps without ({DEFAULT_PROBE})", _switch),
    "survival": ("survival[:Q]@PROFILE a verification budget across the batch: each row's "
                 "tree by expected tokens per second of the step, its tokens' survival the "
                 "cumulative draft probability^Q (1), priced by the cost profile PROFILE",
                 lambda a, s: survival_budget(a, s)),
    "survival-online": ("survival-online[:LR]@PROFILE the same budget, each token's acceptance "
                        "an online logistic of logit(draft prob) refitted from the verdicts at "
                        "rate LR (0.05), as vLLM's adaptive verification",
                        lambda a, s: online_budget(a, s)),
    "survival-sts": ("survival-sts:PATH@PROFILE the same budget, each token's acceptance at "
                     "depth j sigmoid(logit(draft prob) / T_j), T from the per-position table "
                     "PATH (DSpark STS: `mcsd train --decision sts`)", sts_budget),
}


def stopper_help() -> str:
    return "; ".join(text for text, _ in BUILTIN.values())


LEARNED = "stopper"  # `stopper:PATH`
BUDGET = "budget"  # `budget:PATH`: a learned verification budget (`decisions.verify_budget`)


class UnknownStopperError(MCSDError):
    """A spec that names no built-in stopper and no folder."""


@dataclass(frozen=True)
class StopperSpec:
    """A parsed stopper spec: a built-in's `name` and `args`, or a learned stopper's `folder`."""

    text: str
    name: str = LEARNED
    args: tuple[str, ...] = ()
    folder: Path | None = None

    @property
    def learned(self) -> bool:
        return self.folder is not None

    def build(self) -> StopperOrPlanner:
        """The stopper or budget it names (a learned one is loaded from its folder)."""
        if self.name == BUDGET and self.folder is not None:  # `parse_stopper_spec` gives it one
            return load_budget(self.folder)
        if self.folder is not None:  # a folder, as `check` reads it (not its stopper.json)
            return stopper_from(ArtifactSpec.read(self.folder), self.folder)
        return BUILTIN[self.name][1](list(self.args), self.text)

    def check(self) -> None:
        """Refuse what `build` would refuse, without loading a model: a built-in's parameters,
        a learned stopper's `stopper.json`."""
        if self.name == BUDGET:
            self.build()
        elif self.folder is not None:
            ArtifactSpec.read(self.folder)
        else:
            self.build()


def parse_stopper_spec(text: str) -> StopperSpec:
    """`static:4`, `confidence:0.4`, `stopper:PATH` or a bare folder PATH, as a `StopperSpec`;
    UnknownStopperError for anything else. Only the syntax: `check` and `build` read the
    folder (MCSDError where it is no stopper artifact)."""
    name, *args = text.split(":")
    rest = text.partition(":")[2]
    if "@" in name:  # `survival@PROFILE`: the parameters left at their defaults
        name, at, tail = name.partition("@")
        args = [at + tail, *args]
    if name in BUILTIN:
        return StopperSpec(text, name, tuple(args))
    if name == BUDGET and rest:
        return StopperSpec(text, BUDGET, folder=Path(rest))
    if name == LEARNED and rest:
        folder = Path(rest)
    elif text and Path(text).is_dir():
        folder = Path(text)
    else:
        raise UnknownStopperError(
            f"unknown stopper {text!r}: use one of {', '.join(BUILTIN)} (e.g. confidence:0.4), "
            f"stopper:PATH to a trained stopper folder or budget:PATH to a trained budget")
    return StopperSpec(text, folder=folder)


def make_decision(spec: str | StopperOrPlanner | None,
                  k_config: tuple[int, ...] | None = None) -> StopperOrPlanner:
    """The stopper or planner (a verification budget) a spec string names (see the module
    docstring), or a `Stopper` or `Planner` object as it is; None: the static full-depth
    stopper. With `k_config` (the decoder's tree), `check_tree` runs."""
    if spec is None:
        decision: StopperOrPlanner = StaticStopper()
    elif isinstance(spec, str):
        decision = parse_stopper_spec(spec).build()
    else:
        decision = spec
    if not isinstance(decision, Planner):
        missing = [m for m in MEMBERS if not hasattr(decision, m)]
        if missing:
            raise MCSDError(f"{type(decision).__name__} is not a stopper: it lacks "
                            f"{', '.join(missing)}; subclass "
                            "mcsd_runtime.decisions.contract.StopperBase")
    if k_config is not None:
        decision.check_tree(parse_k_config(k_config))
    return decision


def make_stopper(spec: str | Stopper | None,
                 k_config: tuple[int, ...] | None = None) -> Stopper:
    """`make_decision` where a per-row stopper is needed: a planner (a verification budget)
    is refused."""
    decision = make_decision(spec, k_config)
    if isinstance(decision, Planner):
        raise MCSDError(f"{spec!r} is a verification budget, which plans whole steps rather "
                        f"than stopping each row: give it to a decoder as its planner "
                        f"(MCSDDecoder(pair, config, planner=...)), not as a stopper")
    return decision
