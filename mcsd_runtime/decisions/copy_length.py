"""A learned prompt-lookup copy length (`lookup-learned:PATH`).

Where the context repeats itself (a match of `min_ngram`..`max_ngram` tokens), prompt lookup
verifies what followed the repeat. A static copy length K copies all of it, up to K tokens; this
policy predicts, for each length i, the probability that the target accepts the chain's first i
tokens (one LightGBM model over the match, the row's copy history, the target's confidence in its
last tokens, and i) and copies the length L that maximizes the expected committed tokens minus
the time the step takes, at the exchange rate it was tuned to:

    1 + sum_{i <= L} P(i) - rate * cost(L)

where cost(L) is a profiled step verifying L copied tokens. L = 0 decodes one token with the
target alone, or, for a policy trained beside a draft (`mcsd train --decision copy --k-config`)
and decoded as `lookup-learned:PATH+STOPPER`, lets STOPPER draft the step: its value is then the
tokens the row's drafted steps have committed lately (a running mean, from the training mean)
less the rate times a profiled drafted step. Lossless: it only chooses what to verify.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.lookup import Match, find_match
from mcsd_runtime.paths import atomic_write_text

FORMAT = "mcsd-copy-length"
SPEC_FILE, MODEL_FILE = "copy_length.json", "model.txt"
CONF_WINDOW = 4  # the target's confidence in the row's last tokens: over this many
DISTANCE_CAP = 512
DRAFT_EMA = 0.3  # weight of a drafted step's committed tokens in the row's running value
# per row and length i: the match, the copy history, the target's confidence, then i
FEATURES = ("ngram", "hits", "distance", "agree", "in_prompt", "last_copied", "last_accepted",
            "copy_rate", "conf_last", "conf_mean", "conf_min", "length")


@dataclass
class CopyHistory:
    """One row's copies so far and the target's top-1 probability for its last tokens."""

    last_copied: int = 0
    last_accepted: int = 0
    copied: int = 0
    accepted: int = 0
    conf: deque = field(default_factory=lambda: deque(maxlen=CONF_WINDOW))
    draft_value: float = 1.0  # running mean of the tokens the row's drafted steps committed

    def update(self, copied: int, accepted: int, conf: list[float]) -> None:
        """After a step that copied `copied` tokens (0: none) of which `accepted` were accepted,
        and committed tokens the target gave top-1 probabilities `conf`."""
        if copied:
            self.last_copied, self.last_accepted = copied, accepted
            self.copied += copied
            self.accepted += accepted
        self.conf.extend(conf)

    def drafted(self, committed: int) -> None:
        """After a step the draft drafted (nothing copied) that committed `committed` tokens."""
        self.draft_value += DRAFT_EMA * (committed - self.draft_value)


def features(match: Match, context_len: int, n_prompt: int, history: CopyHistory) -> list[float]:
    """The features of a step's match, without the length (`FEATURES[:-1]`)."""
    conf = list(history.conf) or [-1.0]
    return [match.ngram, match.hits, min(match.distance(context_len), DISTANCE_CAP), match.agree,
            float(match.start < n_prompt), history.last_copied, history.last_accepted,
            history.accepted / history.copied if history.copied else -1.0,
            conf[-1], sum(conf) / len(conf), min(conf)]


def drafted_step(history: CopyHistory, draft_costs: list[float],
                 pending: int) -> tuple[float, float]:
    """(tokens, seconds) of a drafted step in place of a copy, for a row with `pending` tokens
    the draft has not seen (`draft_costs[p - 1]`, held at the last beyond it)."""
    return history.draft_value, draft_costs[min(max(pending, 1), len(draft_costs)) - 1]


def survival(booster, feats: list[float], n: int) -> np.ndarray:
    """P(the first i copied tokens are all accepted) for i = 1..n, non-increasing."""
    x = np.empty((n, len(FEATURES)))
    x[:, :-1] = feats
    x[:, -1] = np.arange(1, n + 1)
    return np.minimum.accumulate(booster.predict(x))


@dataclass
class CopyLength:
    """The policy: a model of P(accepted >= i), the profiled step costs and the rate."""

    decision: ClassVar[str] = "copy"  # a `mcsd_runtime.decisions.manifest.Decision`

    booster: object  # `.predict(x [rows, len(FEATURES)]) -> probabilities`
    costs: list[float]  # seconds of a step verifying k copied tokens, k = 0..max_copy
    rate: float  # tokens per second: what a second of verification must buy
    min_ngram: int = 1
    max_ngram: int = 4
    temperature: float = 0.0  # of the outputs it was trained on (0: greedy)
    # trained beside a draft: seconds of a step drafting instead, by the draft's pending tokens
    # (index p - 1), and the tokens such a step commits before a row has drafted any
    draft_costs: list[float] | None = None
    draft_prior: float = 1.0
    draft_tree: str | None = None  # the k-config whose first depth those costs are of

    @property
    def max_copy(self) -> int:
        return len(self.costs) - 1

    def history(self) -> CopyHistory:
        """A new row's history."""
        return CopyHistory(draft_value=self.draft_prior)

    def alternative(self, history: CopyHistory, pending: int) -> tuple[float, float] | None:
        """`drafted_step` under this policy's draft costs; None for a policy trained without a
        draft."""
        if self.draft_costs is None:
            return None
        return drafted_step(history, self.draft_costs, pending)

    def choose(self, match: Match, feats: list[float],
               alt: tuple[float, float] | None = None) -> int:
        """How many of the match's tokens to copy (0: none); `alt` (tokens, seconds) values
        copying nothing (default: one token by the target alone)."""
        n = min(len(match.tokens), self.max_copy)
        gain = np.concatenate([[0.0], np.cumsum(survival(self.booster, feats, n))])
        gain -= self.rate * np.asarray(self.costs[: n + 1])
        if alt is not None:
            gain[0] = alt[0] - 1 - self.rate * alt[1]
        return int(np.argmax(gain))

    def copy(self, context: list[int], cap: int, n_prompt: int, history: CopyHistory,
             pending: int | None = None) -> list[int]:
        """The tokens a row copies this step, at most `cap` ([]: none): the policy's length of
        the match in the row's `context` (its first `n_prompt` tokens the prompt). `pending`:
        the tokens the row's draft has not seen, where copying nothing drafts the step (a policy
        trained beside a draft, `alternative`); None: copying nothing leaves the target alone.
        The one copy decision of our decoder (`decode.planning.CopyRule`) and of the vLLM
        proposer class."""
        match = find_match(context, min(self.max_copy, cap), self.min_ngram, self.max_ngram)
        if match is None:
            return []
        alt = None if pending is None else self.alternative(history, pending)
        return match.tokens[: self.choose(match, features(match, len(context), n_prompt,
                                                          history), alt)]

    def save(self, folder: str | Path, booster_text: str, meta: dict | None = None) -> None:
        """Write `copy_length.json` and the model file (`booster_text`, LightGBM's format)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MODEL_FILE).write_text(booster_text)
        spec = {"format": FORMAT, "version": 1, "features": list(FEATURES), "costs": self.costs,
                "rate": self.rate, "min_ngram": self.min_ngram, "max_ngram": self.max_ngram,
                "temperature": self.temperature, "draft_costs": self.draft_costs,
                "draft_prior": self.draft_prior, "beside_draft": self.draft_tree, **(meta or {})}
        # written last: a folder with it is complete
        atomic_write_text(folder / SPEC_FILE, json.dumps(spec, indent=1))

    @classmethod
    def load(cls, folder: str | Path) -> CopyLength:
        """The policy `mcsd train --decision copy` wrote to `folder`; MCSDError if it is not
        one."""
        from mcsd_runtime.decisions.learned import load_lightgbm

        folder = Path(folder)
        spec = read_spec(folder)
        booster = load_lightgbm(folder / MODEL_FILE)
        drafts = spec.get("draft_costs")
        return cls(booster, [float(c) for c in spec["costs"]], float(spec["rate"]),
                   int(spec["min_ngram"]), int(spec["max_ngram"]),
                   float(spec.get("temperature", 0.0)),
                   None if drafts is None else [float(c) for c in drafts],
                   float(spec.get("draft_prior", 1.0)), spec.get("beside_draft"))


def read_spec(folder: str | Path) -> dict:
    """`copy_length.json` of a policy folder, checked; MCSDError if it is not one."""
    folder = Path(folder)
    try:
        spec = json.loads((folder / SPEC_FILE).read_text())
    except (OSError, ValueError) as err:
        raise MCSDError(f"{folder} is not a learned copy length (cannot read {SPEC_FILE}: "
                        f"{err}); train one with `mcsd train --decision copy`") from None
    if (not isinstance(spec, dict) or spec.get("format") != FORMAT
            or spec.get("features") != list(FEATURES)):
        raise MCSDError(f"{folder / SPEC_FILE} is not a copy length this version reads; retrain "
                        f"with `mcsd train --decision copy`")
    return spec
