"""A learned width: how many of the draft's first-depth candidates a drafted step verifies.

On hardware where verifying more tokens costs more (a CPU), a step whose draft is confident needs
one candidate and a step whose draft hesitates may want all of them. After the draft's forward,
a `WidthPolicy` reads the draft's k largest probabilities at the root, turns each into the chance
that candidate i is the token the target commits (isotonic calibration per rank, fitted by
`mcsd train --decision width` on the target's own outputs), and verifies the w = 1..k
likeliest candidates that maximise

    expected tokens committed - rate * seconds of verifying them,

the expected-throughput rule (`rate`: the tokens per second the policy values time at, the
training outputs' throughput at width k). The draft's forward is spent whichever w it picks, so
only the verification's cost enters. The decision reads the draft's distribution alone, never
the drawn candidates: greedy, the first w of the top k; sampled, the first w of k candidates
drawn in order (without replacement: a draw of w; with replacement: w draws) — either way the
step stays lossless (`decode.proposers.WidthCut.propose`). The calibration is fitted on greedy
outputs: at temperature > 0 it still decodes losslessly, but its chances are greedy ones.

A policy is a folder holding `width.json`:

    {"format": "mcsd-width", "version": 1, "k": 4, "rate": 25.1,
     "calibration": [{"x": [...], "y": [...]}, ...],   # per rank: P(hit) at the draft's q
     "seconds": [s_1, ..., s_k],                       # verifying w candidates
     "temperature": 0.0, "trained": {...}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import atomic_write_text

FORMAT, VERSION, FILE = "mcsd-width", 1, "width.json"
METHOD = "width"  # `width:PATH`: depth 1 of --k-config, verifying the width PATH chooses


@dataclass
class WidthPolicy:
    """Chooses a drafted step's width from the draft's top-k probabilities (module docstring)."""

    decision: ClassVar[str] = "width"  # a `mcsd_runtime.decisions.manifest.Decision`

    k: int
    calibration: list[tuple[list[float], list[float]]]  # per rank: (q knots, P(hit) there)
    seconds: list[float]  # seconds of verifying w = 1..k candidates (what the choice changes)
    rate: float  # tokens per second that a second of verification is worth
    temperature: float = 0.0
    trained: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.k < 1 or len(self.calibration) != self.k or len(self.seconds) != self.k:
            raise MCSDError(f"a width policy needs k >= 1 and one calibration and one cost per "
                            f"width (k = {self.k}, {len(self.calibration)} calibrations, "
                            f"{len(self.seconds)} costs)")
        if not self.rate > 0:
            raise MCSDError(f"a width policy's rate must be positive, got {self.rate}")
        self._knots = [(np.asarray(x, float), np.asarray(y, float)) for x, y in self.calibration]
        self._seconds = np.asarray(self.seconds, float)

    def hit_chances(self, top: list[float]) -> np.ndarray:
        """[k]: the calibrated chance that each of the k likeliest candidates is the token the
        target commits, from their draft probabilities `top` (descending)."""
        return np.array([np.interp(q, x, y) for q, (x, y) in zip(top, self._knots, strict=True)])

    def values(self, top: list[float]) -> np.ndarray:
        """[k]: expected tokens committed minus rate * verification seconds, for w = 1..k."""
        hit = np.minimum(np.cumsum(self.hit_chances(top)), 1.0)
        return 1.0 + hit - self.rate * self._seconds

    def choose(self, top: list[float]) -> int:
        """The width in 1..k to verify (the smallest among equals)."""
        return int(np.argmax(self.values(top))) + 1

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "k": self.k, "rate": self.rate,
                "calibration": [{"x": list(map(float, x)), "y": list(map(float, y))}
                                for x, y in self.calibration],
                "seconds": list(map(float, self.seconds)), "temperature": self.temperature,
                "trained": self.trained}

    def save(self, folder: str | Path) -> Path:
        """Write `folder/width.json` (atomically: a file that exists is complete)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / FILE
        atomic_write_text(path, json.dumps(self.to_json(), indent=1))
        return path

    @classmethod
    def load(cls, folder: str | Path) -> WidthPolicy:
        """Read `folder/width.json` (or the file itself); MCSDError naming the fix when it is
        missing or not a width policy."""
        path = Path(folder)
        path = path / FILE if path.is_dir() else path
        if not path.is_file():
            raise MCSDError(f"no width policy at {folder}: train one with `mcsd train --decision "
                            f"width --out {folder}`")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise MCSDError(f"{path} is not readable JSON ({err}): retrain with `mcsd "
                            f"train --decision width`") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise MCSDError(f"{path} is not a width policy (format {FORMAT!r}): train one with "
                            f"`mcsd train --decision width`")
        if data.get("version") != VERSION:
            raise MCSDError(f"{path} is a version {data.get('version')} width policy; this "
                            f"release reads version {VERSION}: retrain with `mcsd train "
                            f"--decision width`")
        try:
            return cls(k=int(data["k"]), rate=float(data["rate"]),
                       calibration=[(c["x"], c["y"]) for c in data["calibration"]],
                       seconds=[float(s) for s in data["seconds"]],
                       temperature=float(data.get("temperature", 0.0)),
                       trained=dict(data.get("trained", {})))
        except (KeyError, TypeError, ValueError) as err:
            raise MCSDError(f"{path} is incomplete ({err!r}): retrain with `mcsd "
                            f"train --decision width`") from None


def parse_width(spec: str | None) -> Path | None:
    """PATH of a `width:PATH` stopper spec, else None; MCSDError without a PATH."""
    if spec is None:
        return None
    kind, _, arg = spec.partition(":")
    if kind != METHOD:
        return None
    if not arg:
        raise MCSDError(f"{spec!r}: name the folder `mcsd train --decision width` wrote, "
                        f"e.g. "
                        f"width:runs/width")
    return Path(arg)
