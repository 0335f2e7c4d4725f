"""The draft length K by batch size: `Schedule`, one table for every serving engine, and its
artifact `schedule.json` (`mcsd train --decision schedule` writes it, `mcsd export` turns it into
an engine's own format: `mcsd_runtime.serving.export`).

A schedule is bands `(lo, hi, k)`: at a batch size b with lo <= b <= hi (both inclusive) each
request drafts k tokens a step (0: no speculation). Stored sorted by `lo`; the first band starts
at 1; each next band starts one past the end of the one before it (no overlap, no gap). The last
band is open-ended: its `hi` is None (`null` in JSON), covering every batch size from its `lo`
up, because no engine has a batch size the table may leave out. A finite last `hi` is read too
(a table written by hand), and `k_for` refuses a batch size above it; exports write an open end
as the cap each engine needs (`--max-batch-size`).

A schedule may hold bands per category besides the pooled ones (`categories`, where the traces
it was trained on carry categories); `k_for(b, category)` reads a category's own bands where it
has them and the pooled bands otherwise (an unknown category, or None).

    {"format": "mcsd-schedule", "version": 1,
     "bands": [[1, 3, 4], [4, 15, 2], [16, null, 0]],
     "categories": {"code": [[1, 7, 5], [8, null, 1]]},
     "meta": {"engine": "vllm", "method": "ngram", ...}, "report": {...}}

`meta` says what the schedule was trained for (engine, model, method, the profile and traces);
`report` is the training's replayed report (`train.schedule.trainer`). Every problem with a table
is an MCSDError that names it and the fix.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import atomic_write_text

FORMAT, VERSION, FILE = "mcsd-schedule", 1, "schedule.json"
TRAIN_HINT = "mcsd train --decision schedule --runs TRACES --cost-profile PROFILE --out FOLDER"


class Band(NamedTuple):
    """Batch sizes `lo`..`hi` (inclusive; `hi` None: no end) draft `k` tokens a step."""

    lo: int
    hi: int | None
    k: int

    @property
    def label(self) -> str:
        """`4-15`, or `16+` for an open end."""
        return f"{self.lo}+" if self.hi is None else f"{self.lo}-{self.hi}"

    def covers(self, batch_size: int) -> bool:
        return self.lo <= batch_size and (self.hi is None or batch_size <= self.hi)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _band(entry: Any, where: str) -> Band:
    """One `[lo, hi, k]` entry, checked (MCSDError naming `where` and the fix)."""
    if not isinstance(entry, (list, tuple)) or len(entry) != 3:
        raise MCSDError(f"{where}: band {entry!r} is not [lo, hi, K]: write each band as three "
                        f"numbers, e.g. [1, 4, 3] (hi null for the open-ended last band)")
    lo, hi, k = entry
    if not _integer(lo) or lo < 1:
        raise MCSDError(f"{where}: band {list(entry)} starts at {lo!r}: a band starts at a "
                        f"batch size, an integer >= 1")
    if hi is not None and (not _integer(hi) or hi < lo):
        raise MCSDError(f"{where}: band {list(entry)} ends at {hi!r}: its end must be an integer "
                        f">= its start {lo} (or null: open-ended)")
    if not _integer(k) or k < 0:
        raise MCSDError(f"{where}: band {Band(lo, hi, 0).label} has K={k!r}: K is the number of "
                        f"tokens drafted a step, an integer >= 0 (0: no speculation)")
    return Band(lo, hi, k)


def check_bands(bands: Sequence[Any], where: str = "the schedule") -> tuple[Band, ...]:
    """`bands` sorted by start, after checking that they cover every batch size from 1 once
    (module docstring); MCSDError naming the problem and the fix."""
    if not isinstance(bands, (list, tuple)):
        raise MCSDError(f"{where}: the bands are {type(bands).__name__}, not a list: write them "
                        f"as [[lo, hi, K], ...]")
    parsed = sorted((_band(b, where) for b in bands), key=lambda b: b.lo)
    if not parsed:
        raise MCSDError(f"{where} has no bands: give at least one [lo, hi, K], the first "
                        f"starting at 1 (e.g. [[1, null, 3]])")
    if parsed[0].lo != 1:
        raise MCSDError(f"{where}: the first band starts at batch size {parsed[0].lo}, not 1, so "
                        f"batch sizes 1-{parsed[0].lo - 1} have no K: start it at 1")
    for prev, band in zip(parsed, parsed[1:], strict=False):
        if prev.hi is None:
            raise MCSDError(f"{where}: band {prev.label} is open-ended but band {band.label} "
                            f"follows it: only the last band may be open (hi null); end "
                            f"{prev.label} at {band.lo - 1}")
        if band.lo <= prev.hi:
            both = prev.hi if band.hi is None else min(prev.hi, band.hi)
            raise MCSDError(f"{where}: bands {prev.label} (K={prev.k}) and {band.label} "
                            f"(K={band.k}) overlap at batch sizes {band.lo}-{both}: start "
                            f"{band.label} at {prev.hi + 1} or end {prev.label} at {band.lo - 1}")
        if band.lo > prev.hi + 1:
            raise MCSDError(f"{where}: batch sizes {prev.hi + 1}-{band.lo - 1} lie between bands "
                            f"{prev.label} and {band.label} and have no K: start {band.label} at "
                            f"{prev.hi + 1} or end {prev.label} at {band.lo - 1}")
    return tuple(parsed)


@dataclass(frozen=True)
class Schedule:
    """K by batch size (module docstring): the pooled `bands`, optional bands per category,
    what it was trained for (`meta`) and the training's report; checked on construction."""

    bands: tuple[Band, ...]
    categories: Mapping[str, tuple[Band, ...]] = field(default_factory=dict, hash=False)
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    report: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bands", check_bands(self.bands, "the pooled bands"))
        if not isinstance(self.categories, Mapping):
            raise MCSDError("a schedule's categories are a JSON object {category: bands}")
        cats = {}
        for name, bands in self.categories.items():
            if not isinstance(name, str) or not name:
                raise MCSDError(f"category {name!r}: a category is named by a non-empty string")
            cats[name] = check_bands(bands, f"category {name!r}")
        object.__setattr__(self, "categories", cats)

    @property
    def max_k(self) -> int:
        """The largest K of any band, pooled or per category."""
        return max(b.k for bands in (self.bands, *self.categories.values()) for b in bands)

    def bands_for(self, category: str | None = None) -> tuple[Band, ...]:
        """The category's own bands where it has them, else the pooled bands."""
        return self.categories.get(category, self.bands) if category else self.bands

    def k_for(self, batch_size: int, category: str | None = None) -> int:
        """The K to draft at `batch_size` (for `category`; module docstring)."""
        if not _integer(batch_size) or batch_size < 1:
            raise MCSDError(f"batch size {batch_size!r}: a batch size is an integer >= 1")
        bands = self.bands_for(category)
        band = bands[bisect_right([b.lo for b in bands], batch_size) - 1]
        if not band.covers(batch_size):
            raise MCSDError(f"batch size {batch_size} is above the schedule's last band "
                            f"{band.label}: end that band at null (open-ended) or past "
                            f"{batch_size}")
        return band.k

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"format": FORMAT, "version": VERSION,
                                "bands": [list(b) for b in self.bands]}
        if self.categories:
            data["categories"] = {c: [list(b) for b in bands]
                                  for c, bands in self.categories.items()}
        data["meta"] = dict(self.meta)
        if self.report is not None:
            data["report"] = dict(self.report)
        return data

    @classmethod
    def from_json(cls, data: Any, source: str = "the schedule") -> Schedule:
        """A schedule from its JSON object; MCSDError naming `source` and the fix."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise MCSDError(f"{source} is not a schedule (a JSON object with \"format\": "
                            f"\"{FORMAT}\"): pass the folder `{TRAIN_HINT}` wrote")
        if data.get("version") != VERSION:
            raise MCSDError(f"{source} is version {data.get('version')!r} of {FORMAT}; this "
                            f"release reads version {VERSION}: retrain it with `{TRAIN_HINT}`")
        if not isinstance(data.get("bands"), list):
            raise MCSDError(f"{source} has no \"bands\" list: write the pooled bands as "
                            f"[[lo, hi, K], ...] (the first starting at 1)")
        for key in ("meta", "report"):
            if data.get(key) is not None and not isinstance(data[key], dict):
                raise MCSDError(f"{source}: \"{key}\" must be a JSON object")
        return cls(data["bands"], data.get("categories") or {}, data.get("meta") or {},
                   data.get("report"))

    def write(self, folder: str | Path) -> Path:
        """Write `folder/schedule.json` atomically (the folder made if missing); its path."""
        path = Path(folder) / FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json_text(self.to_json()))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Schedule:
        """The schedule in `path`: a folder holding `schedule.json`, or the file itself."""
        path = Path(path)
        file = path / FILE if path.is_dir() else path
        data = read_json(file, f"no schedule at {file}: pass a folder written by `{TRAIN_HINT}` "
                               f"(or its {FILE})",
                         f"pass the {FILE} that `mcsd train --decision schedule` wrote, or fix "
                         f"the file")
        return cls.from_json(data, str(file))


def read_json(file: Path, missing: str, fix: str) -> Any:
    """The JSON in `file`; MCSDError `missing` where there is no such file, or naming what
    is wrong and `fix` where it does not read as JSON."""
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise MCSDError(missing) from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise MCSDError(f"{file} is not readable JSON ({err}): {fix}") from None


_FLAT_LIST = re.compile(r"\[\s+([^\[\]{}\"]*?)\s+\]")


def json_text(data: Any) -> str:
    """`data` as indented JSON with each list of numbers on one line (a band, a point)."""
    text = json.dumps(data, indent=1, default=float)
    return _FLAT_LIST.sub(lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text) + "\n"
