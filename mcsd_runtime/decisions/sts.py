"""Per-position confidence calibration: DSpark's sequential temperature scaling (STS).

A step drafts gamma tokens. Position j's *confidence* is sigmoid(logit_j / T_j), and its
*survival*, the probability that the first j drafted tokens are all accepted, the product of the
confidences up to j. A verification budget reads survivals, so the temperatures are fitted
against the survival, one position at a time (`fit_sts`): position j takes the T of a log grid
(0.1 to 10, 41 points) whose survival, the fitted survival to j - 1 times sigmoid(logit_j / T),
has the lowest expected calibration error (15 equal-width bins) against whether the first j
tokens were accepted. A sample that drafted fewer positions counts only at those it drafted.

The logits: an engine's DSpark draft has a confidence head, whose logits SGLang and TensorRT-LLM
record in shards; ours has none, and a drafted token's confidence logit is logit(q), q the
draft's probability of the token it drafted (`confidence_logit`). A confidence head is trained
to predict acceptance, so a scale is all it lacks; logit(q) also carries an offset (a draft is
overconfident: its q overstates acceptance at every q), which no temperature removes, since
sigmoid(0 / T) is 1/2 for every T. `fit_sts(..., offsets=True)` fits a per-position offset b_j
beside T_j, the confidence then sigmoid(logit_j / T_j + b_j); the offsets are our key
(`mcsd_offsets`), which the engines do not read, so such a table calibrates our budget only.

One file (`StsCalibration.write`) is read by both engines and by our verification budget
(`survival-sts:PATH@PROFILE`, `mcsd_runtime.decisions.verify_budget`):

    {"sts_temperatures": [T_1, ..., T_gamma], "temperatures": [the same], "dataset": "...",
     "num_samples": N, "ece_before": [...], "ece_after": [...], "format": "mcsd-sts", ...}

TensorRT-LLM reads `sts_temperatures` (tensorrt_llm/_torch/speculative/dspark_sts.py), SGLang
`temperatures` (its `DSparkStsCalibration`, which ignores keys it does not know); both refuse
a table whose length is not their number of draft positions.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import atomic_write_text

GRID = np.logspace(-1.0, 1.0, 41)  # the temperatures tried at each position
OFFSET_GRID = np.linspace(-4.0, 2.0, 61)  # the offsets tried with them (fit_sts offsets=True)
BINS = 15  # equal-width bins of the ECE over [0, 1]
PROB_EPS = 1e-8  # the ECE clamps probabilities into [eps, 1 - eps] before binning
Q_EPS, LOGIT_CLIP = 1e-6, 10.0  # confidence_logit's clipping of q and of the logit
STS_FILE, STS_FORMAT, STS_VERSION = "sts.json", "mcsd-sts", 1
KEYS = ("sts_temperatures", "temperatures")  # TensorRT-LLM's, SGLang's
OFFSETS_KEY = "mcsd_offsets"  # ours: per-position offsets, which the engines do not read
FIX = "fit one with `mcsd train --decision sts --out DIR` (docs/sts.md)"


def confidence_logit(q: float) -> float:
    """logit(q) of a draft probability, q clipped to [1e-6, 1 - 1e-6] and the logit to
    [-10, 10]: our draft's confidence logit for the token it drafted."""
    q = min(max(float(q), Q_EPS), 1.0 - Q_EPS)
    return max(-LOGIT_CLIP, min(LOGIT_CLIP, math.log(q / (1.0 - q))))


def confidence_logits(q: np.ndarray) -> np.ndarray:
    """`confidence_logit` of every element (float64; NaN stays NaN)."""
    q = np.clip(np.asarray(q, dtype=np.float64), Q_EPS, 1.0 - Q_EPS)
    return np.clip(np.log(q / (1.0 - q)), -LOGIT_CLIP, LOGIT_CLIP)


def sigmoid(x: np.ndarray | float) -> np.ndarray | float:
    """The logistic function, without overflow for large |x|."""
    if isinstance(x, float | int):
        return 0.5 * (1.0 + math.tanh(0.5 * x))
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


# ------------------------------------------------------------------------------ the metrics
def ece(probs: np.ndarray, targets: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error: over `bins` equal-width bins of [0, 1], |mean prediction -
    mean target| weighted by the bin's share of samples; NaN without samples."""
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), PROB_EPS, 1.0 - PROB_EPS)
    y = np.asarray(targets, dtype=np.float64).ravel()
    if not p.size:
        return math.nan
    index = np.minimum((p * bins).astype(np.int64), bins - 1)
    gap = np.bincount(index, p, bins) - np.bincount(index, y, bins)  # count * (mean p - mean y)
    return float(np.abs(gap).sum() / p.size)


def brier(probs: np.ndarray, targets: np.ndarray) -> float:
    """Mean squared error of the probabilities; NaN without samples."""
    p, y = np.asarray(probs, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    return float(np.mean((p - y) ** 2)) if p.size else math.nan


def auroc(probs: np.ndarray, targets: np.ndarray) -> float:
    """Area under the ROC curve from ranks (ties take their mean rank); NaN when one class is
    absent."""
    p = np.asarray(probs, dtype=np.float64).ravel()
    y = np.asarray(targets).ravel().astype(bool)
    pos = int(y.sum())
    neg = y.size - pos
    if not pos or not neg:
        return math.nan
    order = np.argsort(p, kind="mergesort")
    _, first, counts = np.unique(p[order], return_index=True, return_counts=True)
    ranks = np.empty(p.size)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)  # 1-based mean ranks
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


# ------------------------------------------------------------------------------- the fit
def check_arrays(logits, valid, prefix_mask, source: str = "the samples"
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The [n, gamma] confidence logits (0 where not valid), valid positions and prefix
    targets as float64, bool and float64; MCSDError for shapes or values they cannot have."""
    x = np.asarray(logits, dtype=np.float64)
    ok = np.asarray(valid, dtype=bool)
    y = np.asarray(prefix_mask, dtype=np.float64)
    if x.ndim != 2 or x.shape != ok.shape or x.shape != y.shape:
        raise MCSDError(f"{source}: logits {x.shape}, valid {ok.shape} and prefix_mask {y.shape} "
                        f"must be [n, gamma] arrays of one shape")
    if not x.shape[1]:
        raise MCSDError(f"{source}: no draft positions (gamma 0)")
    if (ok[:, 1:] & ~ok[:, :-1]).any():
        raise MCSDError(f"{source}: a sample's valid positions must be its first ones")
    if not np.isfinite(x[ok]).all():
        raise MCSDError(f"{source}: the confidence logits must be finite")
    if not np.isin(y[ok], (0.0, 1.0)).all():
        raise MCSDError(f"{source}: prefix_mask must hold 0 or 1")
    return np.where(ok, x, 0.0), ok, np.where(ok, y, 0.0)


@dataclass(frozen=True)
class StsFit:
    """Per position: the fitted temperature, the ECE of the survival at T = 1 (`ece_before`)
    and at the fitted temperatures (`ece_after`) on the data fitted, and its samples."""

    temperatures: list[float]
    ece_before: list[float]
    ece_after: list[float]
    samples: list[int]
    offsets: list[float] = field(default_factory=list)  # with offsets=True, else empty


def fit_sts(logits, valid, prefix_mask, grid=GRID, bins: int = BINS,
            offsets: bool = False) -> StsFit:
    """Sequential temperature scaling (module docstring): each position's T from `grid`
    (the smallest of equals), and with `offsets` its offset from OFFSET_GRID, fitted against
    the survival; MCSDError where a position has no samples."""
    x, ok, y = check_arrays(logits, valid, prefix_mask)
    grid = [float(t) for t in np.asarray(grid, dtype=np.float64).ravel()]
    if not grid or min(grid) <= 0:
        raise MCSDError("the temperature grid must hold positive temperatures")
    shifts = [float(b) for b in OFFSET_GRID] if offsets else [0.0]
    fitted, raw = np.ones(len(x)), np.ones(len(x))
    out = StsFit([], [], [], [], [])
    for j in range(x.shape[1]):
        rows = ok[:, j]
        if not rows.any():
            raise MCSDError(f"draft position {j + 1} has no samples: fit fewer positions "
                            f"(--gamma {j})")
        raw = raw * sigmoid(x[:, j])
        t, b, error = _best_scaling(fitted[rows], x[rows, j], y[rows, j], grid, shifts, bins)
        out.temperatures.append(t)
        out.offsets.extend([b] if offsets else [])
        out.ece_before.append(ece(raw[rows], y[rows, j], bins))
        out.ece_after.append(error)
        out.samples.append(int(rows.sum()))
        fitted = fitted * sigmoid(x[:, j] / t + b)
    return out


def _best_scaling(prior: np.ndarray, x: np.ndarray, y: np.ndarray, grid: list[float],
                  shifts: list[float], bins: int) -> tuple[float, float, float]:
    """The (T, b) of `grid` x `shifts` whose survival, `prior` * sigmoid(x / T + b), has the
    lowest ECE against `y` (the first of equals: the smallest T, then b), and that ECE."""
    cells = [(t, b) for t in grid for b in shifts]
    errors = [ece(prior * sigmoid(x / t + b), y, bins) for t, b in cells]
    i = int(np.argmin(errors))  # the first of equal minima
    return cells[i][0], cells[i][1], errors[i]


def survival(logits, valid, temperatures, offsets=None) -> np.ndarray:
    """[n, gamma] survival: the running product of sigmoid(logit_j / T_j + b_j) along each
    sample (`offsets` b, none: 0); NaN where a position is not valid."""
    x, ok = np.asarray(logits, dtype=np.float64), np.asarray(valid, dtype=bool)
    t = np.asarray(temperatures, dtype=np.float64)[: x.shape[1]]
    b = np.zeros_like(t) if offsets is None or not len(offsets) else \
        np.asarray(offsets, dtype=np.float64)[: x.shape[1]]
    conf = sigmoid(np.where(ok, x, 0.0) / t[None, :] + b[None, :])
    return np.where(ok, np.cumprod(conf, axis=1), np.nan)


def position_metrics(logits, valid, prefix_mask, temperatures,
                     offsets=None) -> list[dict[str, Any]]:
    """Per draft position (1-based), over the samples that drafted it: samples, how many had
    every token to it accepted, and the ECE, Brier score and AUROC of the survival under
    `temperatures` (and `offsets`; NaN where undefined)."""
    x, ok, y = check_arrays(logits, valid, prefix_mask)
    surv = survival(x, ok, temperatures, offsets)
    out = []
    for j in range(x.shape[1]):
        rows = ok[:, j]
        p, t = surv[rows, j], y[rows, j]
        out.append({"position": j + 1, "samples": int(rows.sum()), "accepted": int(t.sum()),
                    "ece": ece(p, t), "brier": brier(p, t), "auroc": auroc(p, t)})
    return out


# ------------------------------------------------------------------------------- the file
def _positive(values: Any, what: str, path: Path | str) -> tuple[float, ...]:
    """`values` as a non-empty tuple of finite floats > 0; MCSDError naming the problem."""
    if not isinstance(values, list | tuple) or not values:
        raise MCSDError(f"{path}: {what} must be a non-empty list of temperatures, got "
                        f"{values!r}; {FIX}")
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise MCSDError(f"{path}: {what} must hold numbers, got {values!r}; {FIX}")
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise MCSDError(f"{path}: {what} must all be finite and > 0, got {list(values)}; {FIX}")
    return tuple(float(v) for v in values)


def _finite_list(values: Any, what: str, path: Path | str) -> tuple[float, ...]:
    if not isinstance(values, list | tuple) or any(
            isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
            for v in values):
        raise MCSDError(f"{path}: {what} must be a list of finite numbers, got {values!r}; "
                        f"{FIX}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class StsCalibration:
    """A per-position temperature table (one per draft position) and what it was fitted on;
    `extra` holds our own keys (written after the engines' ones, ignored by them)."""

    temperatures: tuple[float, ...]
    dataset: str = ""
    num_samples: int = 0
    ece_before: tuple[float, ...] = ()
    ece_after: tuple[float, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    offsets: tuple[float, ...] = ()  # ours (OFFSETS_KEY): empty, or one per temperature

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "temperatures", _positive(self.temperatures, "temperatures", "the table"))
        set_(self, "offsets", _finite_list(self.offsets, OFFSETS_KEY, "the table"))
        if self.offsets and len(self.offsets) != len(self.temperatures):
            raise MCSDError(f"the table has {len(self.temperatures)} temperatures but "
                            f"{len(self.offsets)} {OFFSETS_KEY}: one per position; {FIX}")
        set_(self, "ece_before", _finite_list(self.ece_before, "ece_before", "the table"))
        set_(self, "ece_after", _finite_list(self.ece_after, "ece_after", "the table"))
        if isinstance(self.num_samples, bool) or not isinstance(self.num_samples, int):
            raise MCSDError(f"num_samples must be a whole number, got {self.num_samples!r}")

    @property
    def gamma(self) -> int:
        """The draft positions the table holds."""
        return len(self.temperatures)

    def temperature(self, depth: int) -> float:
        """T of draft position `depth` (1-based); a position beyond the table takes its last."""
        return self.temperatures[min(max(depth, 1), self.gamma) - 1]

    def offset(self, depth: int) -> float:
        """b of draft position `depth` (0 without offsets; beyond the table, its last)."""
        return self.offsets[min(max(depth, 1), self.gamma) - 1] if self.offsets else 0.0

    def confidence(self, logit: float, depth: int) -> float:
        """The calibrated confidence of a confidence logit at `depth` (1-based)."""
        return float(sigmoid(logit / self.temperature(depth) + self.offset(depth)))

    def acceptance(self, q: float, depth: int) -> float:
        """The calibrated confidence of a token of draft probability `q` at `depth`."""
        return self.confidence(confidence_logit(q), depth)

    def to_json(self) -> dict[str, Any]:
        """Both engines' keys (the table under both names), then ours."""
        temps = list(self.temperatures)
        engines = {"sts_temperatures": temps, "temperatures": temps, "dataset": self.dataset,
                   "num_samples": self.num_samples, "ece_before": list(self.ece_before),
                   "ece_after": list(self.ece_after)}
        ours = {"format": STS_FORMAT, "version": STS_VERSION,
                **({OFFSETS_KEY: list(self.offsets)} if self.offsets else {})}
        return engines | {k: v for k, v in {**ours, **self.extra}.items() if k not in engines}

    def write(self, path: str | Path) -> Path:
        """Write the table (atomically) to `path`, or to `path/sts.json` for a folder."""
        path = Path(path)
        path = path / STS_FILE if path.is_dir() else path
        atomic_write_text(path, json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> StsCalibration:
        """The table at `path` (a file, or a folder holding sts.json), read as either engine
        reads it: `sts_temperatures` or `temperatures` (equal where both are present)."""
        data, path = _read(path)
        found = [k for k in KEYS if k in data]
        if not found:
            raise MCSDError(f"{path} has neither {KEYS[0]!r} nor {KEYS[1]!r} (keys: "
                            f"{sorted(data)}); {FIX}")
        temps = [_positive(data[k], k, path) for k in found]
        if len(temps) == 2 and temps[0] != temps[1]:
            raise MCSDError(f"{path}: {KEYS[0]} and {KEYS[1]} differ ({list(temps[0])} vs "
                            f"{list(temps[1])}): TensorRT-LLM and SGLang would read different "
                            f"tables; keep one, or {FIX}")
        dataset, n = data.get("dataset", ""), data.get("num_samples", 0)
        if not isinstance(dataset, str) or isinstance(n, bool) or not isinstance(n, int):
            raise MCSDError(f"{path}: dataset must be a string and num_samples a whole number "
                            f"(SGLang refuses the file otherwise); {FIX}")
        extra = {k: v for k, v in data.items() if k not in (*KEYS, "dataset", "num_samples",
                                                            "ece_before", "ece_after",
                                                            OFFSETS_KEY)}
        offsets = _finite_list(data.get(OFFSETS_KEY, []), OFFSETS_KEY, path)
        if offsets and len(offsets) != len(temps[0]):
            raise MCSDError(f"{path}: {len(temps[0])} temperatures but {len(offsets)} "
                            f"{OFFSETS_KEY}: one per position; {FIX}")
        return cls(temps[0], dataset, n, _finite_list(data.get("ece_before", []), "ece_before",
                                                      path),
                   _finite_list(data.get("ece_after", []), "ece_after", path), extra, offsets)


def _read(path: str | Path) -> tuple[dict[str, Any], Path]:
    """The JSON object at `path` (or `path/sts.json`), and the file's path."""
    path = Path(path)
    path = path / STS_FILE if path.is_dir() else path
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MCSDError(f"no STS table at {path}; {FIX}") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise MCSDError(f"{path} is not readable JSON ({err}); {FIX}") from None
    if not isinstance(data, dict):
        raise MCSDError(f"{path} is not a JSON object; {FIX}")
    return data, path
