"""`EngineProfile`: what one engine step costs at each concurrency and draft length K, measured in
the engine a user serves with (`mcsd profile --engine vllm` writes it), and read by
`mcsd train --decision schedule` to price its replay.

    {"format": "mcsd-engine-profile", "version": 1, "engine": "vllm",
     "engine_version": "0.32.0", "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
     "dtype": "bfloat16", "method": "ngram",
     "points": [{"concurrency": 1, "k": 0, "step_seconds": 0.011, "steps": 400}, ...],
     "plain": [{"concurrency": 1, "step_seconds": 0.010, "steps": 400}, ...]}

A point is the mean wall time of one engine step (`step_seconds`, over `steps` steps) with
`concurrency` requests running, each drafting `k` tokens a step. K = 0 is the speculative
engine drafting nothing, which is what a schedule's K = 0 band runs; `plain` (optional: older
profiles lack it) holds the same engine started without speculation, what a user who turns
speculation off serves with. `step_seconds(c, k)` and `plain_step_seconds(c)` interpolate
linearly in concurrency between the points measured and hold the end values outside them
(clamped, never extrapolated); a K never measured is an MCSDError that says how to measure it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import atomic_write_text
from mcsd_runtime.serving.schedule import json_text, read_json

FORMAT, VERSION = "mcsd-engine-profile", 1
FIELDS = ("engine", "engine_version", "model", "dtype", "method")


@dataclass(frozen=True)
class ProfilePoint:
    """One measurement: `concurrency` requests drafting `k` tokens, `step_seconds` a step
    (mean over `steps` steps)."""

    concurrency: int
    k: int
    step_seconds: float
    steps: int


def _point(entry: Any, where: str, plain: bool = False) -> ProfilePoint:
    """One point of `points` (of `plain`: no "k", read as 0), checked (MCSDError naming `where`
    and the fix)."""
    if plain and isinstance(entry, dict):
        entry = {"k": 0, **entry}
    keys = ("concurrency", "k", "step_seconds", "steps")
    if not isinstance(entry, dict) or any(k not in entry for k in keys):
        raise MCSDError(f"{where}: point {entry!r} lacks one of {', '.join(keys)}: re-measure "
                        f"with `mcsd profile --engine ENGINE`")
    c, k, s, n = (entry[key] for key in keys)
    ints = [v for v in (c, k, n) if not isinstance(v, int) or isinstance(v, bool)]
    if ints or c < 1 or k < 0 or n < 1:
        raise MCSDError(f"{where}: point {entry!r}: concurrency and steps must be integers >= 1 "
                        f"and k an integer >= 0")
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
        raise MCSDError(f"{where}: point {entry!r}: step_seconds must be a positive number of "
                        f"seconds")
    return ProfilePoint(c, k, float(s), n)


@dataclass(frozen=True)
class EngineProfile:
    """An engine's step times by concurrency and K (module docstring); checked on
    construction, its points kept sorted by (k, concurrency)."""

    engine: str
    engine_version: str
    model: str
    dtype: str
    method: str
    points: tuple[ProfilePoint, ...]
    plain: tuple[ProfilePoint, ...] = ()  # the engine without speculation (k 0)

    def __post_init__(self) -> None:
        for name in FIELDS:
            if not isinstance(getattr(self, name), str):
                raise MCSDError(f"engine profile: \"{name}\" must be a string")
        if not self.engine or not self.method:
            raise MCSDError("engine profile: \"engine\" and \"method\" must name the engine and "
                            "its drafting method (e.g. vllm, ngram)")
        points = sorted(self.points, key=lambda p: (p.k, p.concurrency))
        if not points:
            raise MCSDError("engine profile has no points: measure it with `mcsd profile "
                            "--engine ENGINE`")
        seen = set()
        for p in points:
            if (p.concurrency, p.k) in seen:
                raise MCSDError(f"engine profile measures concurrency {p.concurrency} at K={p.k} "
                                f"twice: keep one point per (concurrency, k)")
            seen.add((p.concurrency, p.k))
        plain = sorted(self.plain, key=lambda p: p.concurrency)
        if len({p.concurrency for p in plain}) < len(plain) or any(p.k for p in plain):
            raise MCSDError("engine profile: \"plain\" holds one point per concurrency, "
                            "without a K: measure it again with `mcsd profile --engine ENGINE`")
        object.__setattr__(self, "points", tuple(points))
        object.__setattr__(self, "plain", tuple(plain))

    @property
    def ks(self) -> tuple[int, ...]:
        """The draft lengths measured, ascending."""
        return tuple(sorted({p.k for p in self.points}))

    @property
    def concurrencies(self) -> tuple[int, ...]:
        """The concurrencies measured (at any K), ascending."""
        return tuple(sorted({p.concurrency for p in self.points}))

    def step_seconds(self, concurrency: float, k: int) -> float:
        """Seconds a step takes at `concurrency` requests drafting `k` tokens (module
        docstring: linear between measured concurrencies, clamped outside them)."""
        if isinstance(concurrency, bool) or not concurrency >= 1:
            raise MCSDError(f"concurrency {concurrency!r}: a concurrency is a number >= 1")
        at_k = [p for p in self.points if p.k == k]
        if not at_k:
            measured = ", ".join(map(str, self.ks))
            raise MCSDError(f"the {self.engine} profile has no step time at K={k} (it measured "
                            f"K={measured}): measure K={k} with `mcsd profile --engine "
                            f"{self.engine}`, or leave it out (--max-k)")
        xs = [p.concurrency for p in at_k]
        return float(np.interp(concurrency, xs, [p.step_seconds for p in at_k]))

    def plain_step_seconds(self, concurrency: float) -> float | None:
        """Seconds a step of the engine without speculation takes at `concurrency` requests
        (interpolated as `step_seconds`); None where the profile did not measure it."""
        if not self.plain:
            return None
        xs = [p.concurrency for p in self.plain]
        return float(np.interp(concurrency, xs, [p.step_seconds for p in self.plain]))

    def step_seconds_drafting(self, concurrency: float, drafted: float) -> float:
        """Seconds a step takes at `concurrency` requests drafting `drafted` tokens each on
        average (a fraction where some draft and some do not): linear between the measured
        K around it, as the tokens a step verifies grow."""
        ks = self.ks
        if not ks[0] <= drafted <= ks[-1]:
            raise MCSDError(f"{drafted:g} drafted tokens a request lie outside the profile's "
                            f"K={ks[0]}..{ks[-1]}: measure those K with `mcsd profile --engine "
                            f"{self.engine}`")
        return float(np.interp(drafted, ks, [self.step_seconds(concurrency, k) for k in ks]))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION,
                **{name: getattr(self, name) for name in FIELDS},
                "points": [asdict(p) for p in self.points],
                **({"plain": [{k: v for k, v in asdict(p).items() if k != "k"}
                              for p in self.plain]} if self.plain else {})}

    @classmethod
    def from_json(cls, data: Any, source: str = "the engine profile") -> EngineProfile:
        """A profile from its JSON object; MCSDError naming `source` and the fix."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise MCSDError(f"{source} is not an engine profile (a JSON object with \"format\": "
                            f"\"{FORMAT}\"): measure one with `mcsd profile --engine vllm` (a "
                            f"decoder's `mcsd profile` without --engine is another format)")
        if data.get("version") != VERSION:
            raise MCSDError(f"{source} is version {data.get('version')!r} of {FORMAT}; this "
                            f"release reads version {VERSION}: measure it again")
        missing = [name for name in (*FIELDS, "points") if name not in data]
        if missing or not isinstance(data["points"], list):
            raise MCSDError(f"{source} lacks {', '.join(missing) or 'a points list'}: measure it "
                            f"again with `mcsd profile --engine ENGINE`")
        plain = data.get("plain") or []
        if not isinstance(plain, list):
            raise MCSDError(f"{source}: \"plain\" must be a list of points")
        points = tuple(_point(p, source) for p in data["points"])
        plain_points = tuple(_point(p, f"{source} (plain)", plain=True) for p in plain)
        try:
            return cls(*(data[name] for name in FIELDS), points, plain_points)
        except MCSDError as err:
            raise MCSDError(f"{source}: {err}") from None

    def save(self, path: str | Path) -> Path:
        """Write the profile to `path` atomically; returns it."""
        path = Path(path)
        atomic_write_text(path, json_text(self.to_json()))
        return path

    @classmethod
    def load(cls, path: str | Path) -> EngineProfile:
        path = Path(path)
        data = read_json(path, f"no engine profile at {path}: measure one with `mcsd profile "
                               f"--engine vllm`", "measure the profile again")
        return cls.from_json(data, str(path))
