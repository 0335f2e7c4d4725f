"""Early-stop policies and the two contracts between them and the decoder.

The decoder consults a `Stopper` after each draft depth and tells it each step's outcome; it never
knows which kind it runs (as with transformers' candidate generators: decide, then learn from the
outcome). Subclass `StopperBase` and implement `should_continue`:

- `reset()`: a new sequence starts;
- `should_continue(frontier) -> bool`: after drafting `frontier.depth`, draft one more depth? It is
  asked before the frontier goes through the draft, so stopping saves that forward;
- `update(drafted, accepted)`: the step drafted `drafted` depths and `accepted` were accepted;
- `needs_hidden`: True when `should_continue` reads `frontier.hidden()` (the decoder then keeps the
  draft's hidden states; recorders use the same name);
- `check_tree(k_config)`: called once by the decoder with its tree; a stopper tied to one tree
  shape (a learned one) raises MCSDError for another.

A `Frontier` is what a stopper sees: the nodes of the depth just drafted. The decoder serves it
from the tensors it drafted with, offline replay from collected rows; both compute features only
when asked, so stoppers that ignore them cost nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.features import column


class Frontier(Protocol):
    """The nodes of the depth just drafted, before they go through the draft."""

    depth: int  # depth just drafted (1-based)
    max_depth: int  # deepest depth the decoder could still draft in this step

    def trajectory(self) -> list[float]:
        """TRAJECTORY_FEATURES of the run before this step."""
        ...

    def features(self) -> torch.Tensor:
        """[n, len(FEATURE_NAMES)] float32: node features, then the trajectory on every row."""
        ...

    def decision_features(self) -> np.ndarray:
        """[n, len(DECISION_FEATURES)] float64 on the host: the cheap subset learned stoppers
        read (no extra pass over the vocabulary)."""
        ...

    def hidden(self) -> torch.Tensor:
        """[n, H]: the draft's last hidden state that proposed each node (its parent's);
        MCSDError where there is none (target-initialized roots, replay without hidden)."""
        ...


class Stopper(Protocol):
    needs_hidden: bool

    def reset(self) -> None: ...

    def should_continue(self, frontier: Frontier) -> bool: ...

    def update(self, drafted: int, accepted: int) -> None: ...

    def check_tree(self, k_config: tuple[int, ...]) -> None: ...


class StopperBase:
    """Defaults for every `Stopper` member but `should_continue`: stateless, features only, any
    tree."""

    needs_hidden = False

    def reset(self) -> None:
        pass

    def should_continue(self, frontier: Frontier) -> bool:
        raise NotImplementedError

    def update(self, drafted: int, accepted: int) -> None:
        pass

    def check_tree(self, k_config: tuple[int, ...]) -> None:
        pass


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
                f"k-config {','.join(map(str, k_config)) or '()'} has {len(k_config)}; use "
                f"static:1..{len(k_config)} or a deeper --k-config")


class ConfidenceStopper(StopperBase):
    """HF/DISCO style: continue while some frontier token's draft probability is >= T."""

    def __init__(self, threshold: float = 0.4) -> None:
        self.threshold = threshold

    def should_continue(self, frontier: Frontier) -> bool:
        prob = frontier.features()[:, column("draft_prob")]
        return bool((prob >= self.threshold).any())


class EntropyStopper(StopperBase):
    """AdaEDL style: the acceptance lower bound 1 - sqrt(gamma * H) must stay >= lam to
    continue, H being the lowest entropy among the distributions that proposed the frontier."""

    def __init__(self, lam: float = 0.5, gamma: float = 0.5) -> None:
        self.lam, self.gamma = lam, gamma

    def should_continue(self, frontier: Frontier) -> bool:
        entropy = frontier.features()[:, column("q_entropy")]
        bound = 1.0 - torch.sqrt(self.gamma * entropy.min())
        return bool(bound >= self.lam)


class CumprodStopper(StopperBase):
    """SpecDec++ style: stop once the estimated probability that the best path has a rejection,
    1 - prod(q) along it, exceeds T (the draft's own probabilities estimate acceptance)."""

    def __init__(self, threshold: float = 0.7) -> None:
        self.threshold = threshold

    def should_continue(self, frontier: Frontier) -> bool:
        log_path = frontier.features()[:, column("log_path_prob")]
        return bool(1.0 - log_path.max().exp() <= self.threshold)


class HeuristicStopper(StopperBase):
    """HF's assisted-generation schedule: a depth budget, +2 after a fully accepted step and
    -1 (not below 1) otherwise. Starts at the tree's depth."""

    def __init__(self, initial: int | None = None) -> None:
        self.initial = initial
        self.budget: float = initial or math.inf

    def reset(self) -> None:
        self.budget = self.initial or math.inf

    def should_continue(self, frontier: Frontier) -> bool:
        self.budget = min(self.budget, frontier.max_depth)
        return frontier.depth < self.budget

    def update(self, drafted: int, accepted: int) -> None:
        self.budget = self.budget + 2 if accepted == drafted else max(1, self.budget - 1)


def _floats(args: list[str], spec: str, n_max: int) -> list[float]:
    if len(args) > n_max:
        raise MCSDError(f"stopper {spec!r} takes at most {n_max} parameter(s)")
    try:
        return [float(a) for a in args]
    except ValueError:
        raise MCSDError(
            f"stopper {spec!r}: parameters must be numbers, e.g. confidence:0.4") from None


Builder = Callable[[list[str], str], Stopper]

BUILTIN: dict[str, tuple[str, Builder]] = {
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
}

def stopper_help() -> str:
    return "; ".join(text for text, _ in BUILTIN.values())


_MEMBERS = ("reset", "should_continue", "update", "check_tree", "needs_hidden")


def make_stopper(spec: str | Stopper | None,
                 k_config: tuple[int, ...] | None = None) -> Stopper:
    """A stopper from a spec string such as `static`, `confidence:0.4`, `heuristic`, or a
    learned stopper's artifact folder (`stopper:PATH` or a folder holding `stopper.json`), or a
    `Stopper` object as it is. With `k_config` (the decoder's tree), `check_tree` runs."""
    stopper = _build(spec)
    missing = [m for m in _MEMBERS if not hasattr(stopper, m)]
    if missing:
        raise MCSDError(f"{type(stopper).__name__} is not a stopper: it lacks "
                        f"{', '.join(missing)}; subclass mcsd_runtime.stoppers.StopperBase")
    if k_config is not None:
        stopper.check_tree(tuple(k_config))
    return stopper


def _build(spec: str | Stopper | None) -> Stopper:
    if spec is None:
        return StaticStopper()
    if not isinstance(spec, str):
        return spec
    name, *args = spec.split(":")
    if name in BUILTIN:
        return BUILTIN[name][1](args, spec)
    path = Path(spec.split(":", 1)[1] if name == "stopper" else spec)
    if (path / "stopper.json").is_file():
        from mcsd_runtime.learned import load_stopper

        return load_stopper(path)
    raise MCSDError(
        f"unknown stopper {spec!r}: use one of {', '.join(BUILTIN)} (e.g. confidence:0.4) or "
        f"stopper:PATH to a trained stopper folder"
    )
