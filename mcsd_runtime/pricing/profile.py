"""A cost profile: each model's forward latency against the number of tokens it processes, per
batch size, and the decoder's own time per step and per drafted depth; the cost model replay
uses to turn a step's forwards (`step_model.step_forwards`) into seconds. `benchmarks.measure`
measures one on this machine; `mcsd profile` writes it.

A profile is JSON:

    {"format": "mcsd-cost-profile", "version": 2, "pair": {...fingerprint...},
     "device": "cpu", "dtype": "float32", "context": 256,
     "tokens": [1, 2, ...], "target_s": [...], "draft_s": [...],
     "step_overhead_s": 0.0004, "depth_overhead_s": 0.00005, "static": {...},
     "batches": {"8": {"target_s": [...], "draft_s": [...], "draft_first_s": [...],
                       "step_overhead_s": 0.002, "depth_overhead_s": 0.0002, "static": {...}}},
     "ragged": {"8": {"target": [[8, 0.021], [16, 0.022], ...], "draft": [[1, 0.002], ...],
                      "width": 9}}}

`target_s[i]` / `draft_s[i]`: seconds of one forward over `tokens[i]` new tokens with the
decoder's 4D mask over a KV cache of `context` tokens, at batch size 1. `batches[B]` holds the
same curves for B rows of `tokens[i]` new tokens each (a mask per row, [B, 1, n, context + n],
and position ids [B, n], over a cache of `context` tokens per row), with the overheads fitted to
batched runs at B. A version-1 profile (no `batches`) is a profile of batch size 1.
Counts in between are interpolated linearly, beyond the last extrapolated from the last two;
row counts between two measured batch sizes are interpolated linearly, and row counts outside
the measured ones are refused.
**Ragged forwards** (every row's new tokens packed into one forward, so its cost follows the
batch's total tokens, not rows x widest): `ragged[B]` (optional) holds, for a batch size B of
`batches`, the seconds of packed target and draft forwards measured at a few totals T,
`{"target": [[T, s], ...], "draft": [[T, s], ...], "width": W}`
(`benchmarks.ragged_bench.ragged_counts` lays T out over the B rows, none wider than W). A
ragged forward carrying T tokens over B rows (`ragged_target`, `ragged_draft`) costs, at a B
with such points, the measured curve at T (linear in between, beyond the last extrapolated as
above), and at a B without them what the padded curves give for B rows of T / B tokens each.
Either way no less than the curve's first point: its floor, the caches and attention of every
row of the batch, is paid whichever rows carry tokens (a draft forward of the few rows still
drafting pays it too); 0 when it carries no token. Row counts between two measured batch sizes
are interpolated linearly at the same tokens a row, each side priced so (batch size 1, a lone
row, has no padding: its padded curve); a step's first draft forward scales the measured draft
curve by the padded first forward's ratio to the others at B. A profile without `ragged`
prices every ragged forward by the padded curves.
`step_overhead_s` and `depth_overhead_s` are the decoder's own time outside model forwards
(bookkeeping, verification and sampling, cache cuts; per drafted depth: candidates, stopper);
`static` keeps the tokens/s of the end-to-end runs they were fitted to (AR and each static
depth), so that a replay can be checked against them, and the temperature they decoded at.
Users may write their own profile (e.g. measured on their GPU).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.step_model import packs, step_forwards

__all__ = ["FORMAT", "VERSION", "BatchCosts", "CostProfile", "RaggedCosts"]

FORMAT = "mcsd-cost-profile"
VERSION = 2  # 2 added `batches`; a version-1 file reads as a profile of batch size 1; the
# optional `ragged` needs no new version (a reader without it ignores it)


def _interp(xs: list[float], values: list[float], n: float) -> float:
    """`values` at `n` on the increasing counts `xs`: the first value at or below xs[0],
    linear in between, beyond the last extrapolated from the last two (slope at least 0; one
    point: proportionally)."""
    if n <= xs[0] or len(xs) == 1:
        return values[0] if n <= xs[0] else values[-1] * n / xs[-1]
    for i in range(1, len(xs)):
        if n <= xs[i]:
            w = (n - xs[i - 1]) / (xs[i] - xs[i - 1])
            return values[i - 1] + w * (values[i] - values[i - 1])
    slope = (values[-1] - values[-2]) / (xs[-1] - xs[-2])
    return values[-1] + max(slope, 0.0) * (n - xs[-1])


def _check_curves(n: int, target_s: list, draft_s: list, first: list | None, what: str) -> None:
    if len(target_s) != n or len(draft_s) != n:
        raise MCSDError(f"cost profile{what}: tokens, target_s and draft_s must be non-empty "
                        f"lists of the same length")
    if first is not None and len(first) != n:
        raise MCSDError(f"cost profile{what}: draft_first_s must be as long as tokens")
    if any(not v >= 0 for v in (*target_s, *draft_s, *(first or ()))):
        raise MCSDError(f"cost profile{what}: latencies must be non-negative numbers")


@dataclass
class BatchCosts:
    """One batch size's curves: seconds of one forward over B rows of `tokens[i]` new tokens
    each (`CostProfile.tokens`), and the decoder's overheads fitted to batched runs at B (None:
    not calibrated at B; interpolated from the sizes that were)."""

    target_s: list[float]
    draft_s: list[float]
    draft_first_s: list[float] | None = None
    step_overhead_s: float | None = None
    depth_overhead_s: float | None = None
    static: dict = field(default_factory=dict)


@dataclass
class RaggedCosts:
    """One batch size's measured ragged forwards: [T, seconds] of one packed forward carrying
    T new tokens in all over the batch's rows, T increasing, for the target and the draft;
    `width`: the widest row the timed layouts allowed (0: not recorded)."""

    target: list[list[float]]
    draft: list[list[float]]
    width: int = 0

    def check(self, what: str) -> None:
        """MCSDError unless both curves are non-empty [T, seconds] pairs, T increasing positive
        integers and seconds non-negative."""
        for name, points in (("target", self.target), ("draft", self.draft)):
            try:
                ts, secs = zip(*((int(t), float(s)) for t, s in points), strict=True)
            except (TypeError, ValueError):
                ts, secs = (), ()
            if not ts or list(ts) != sorted(set(ts)) or ts[0] < 1 or not all(
                    v >= 0 for v in secs) or any(t != int(t) for t, _ in points):
                raise MCSDError(f"cost profile{what}: ragged {name} must be [tokens, seconds] "
                                f"pairs, tokens increasing positive integers, seconds >= 0")
        if not isinstance(self.width, int) or self.width < 0:
            raise MCSDError(f"cost profile{what}: ragged width must be a count, got "
                            f"{self.width!r}")

    def at(self, model: str, tokens: float) -> float:
        """Seconds of `model`'s ("target" or "draft") forward carrying `tokens` (`_interp`)."""
        points = self.target if model == "target" else self.draft
        return _interp([p[0] for p in points], [p[1] for p in points], tokens)


@dataclass
class CostProfile:
    tokens: list[int]
    target_s: list[float]
    draft_s: list[float]
    step_overhead_s: float = 0.0
    depth_overhead_s: float = 0.0
    context: int = 0
    device: str = ""
    dtype: str = ""
    pair: dict = field(default_factory=dict)
    note: str = ""
    static: dict = field(default_factory=dict)  # end-to-end runs the overheads were fitted to
    # a step's first draft forward (over the pending tokens, right after the target's): slower
    # than the forwards that follow it while caches are warm; None: the same as draft_s
    draft_first_s: list[float] | None = None
    threads: int = 0  # torch CPU threads during the measurement (0: not recorded)
    batches: dict[int, BatchCosts] = field(default_factory=dict)  # batch size B > 1 -> curves
    ragged: dict[int, RaggedCosts] = field(default_factory=dict)  # B of batches -> packed forwards

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not n:
            raise MCSDError("cost profile: tokens, target_s and draft_s must be non-empty lists "
                            "of the same length")
        _check_curves(n, self.target_s, self.draft_s, self.draft_first_s, "")
        if sorted(set(self.tokens)) != list(self.tokens) or self.tokens[0] < 1:
            raise MCSDError("cost profile: tokens must be increasing positive integers")
        if any(not v >= 0 for v in (self.step_overhead_s, self.depth_overhead_s)):
            raise MCSDError("cost profile: latencies must be non-negative numbers")
        if "k_config" in self.static and "temperature" not in self.static:
            raise MCSDError("cost profile: static records the decoder's runs without their "
                            "temperature (a profile older than the field): measure it again "
                            "with `mcsd profile`")
        batches = {}
        for key, costs in (self.batches or {}).items():
            try:
                b = int(key)
                costs = costs if isinstance(costs, BatchCosts) else BatchCosts(**costs)
            except (TypeError, ValueError) as err:
                raise MCSDError(f"cost profile: batches[{key!r}] is not a batch size's curves "
                                f"({err})") from None
            if b < 2 or str(b) != str(key).strip():
                raise MCSDError(f"cost profile: batches keys are batch sizes above 1, got {key!r}")
            _check_curves(n, costs.target_s, costs.draft_s, costs.draft_first_s,
                          f" (batch size {b})")
            if any(v is not None and not v >= 0
                   for v in (costs.step_overhead_s, costs.depth_overhead_s)):
                raise MCSDError(f"cost profile (batch size {b}): overheads must be "
                                f"non-negative numbers")
            batches[b] = costs
        self.batches = dict(sorted(batches.items()))
        self.ragged = self._checked_ragged()

    def _checked_ragged(self) -> dict[int, RaggedCosts]:
        """`ragged` keyed by int batch sizes, each one of `batches`, its points checked."""
        out = {}
        for key, costs in (self.ragged or {}).items():
            try:
                b = int(key)
                costs = costs if isinstance(costs, RaggedCosts) else RaggedCosts(**costs)
            except (TypeError, ValueError) as err:
                raise MCSDError(f"cost profile: ragged[{key!r}] is not a batch size's ragged "
                                f"forwards ({err})") from None
            if b not in self.batches or str(b) != str(key).strip():
                raise MCSDError(f"cost profile: ragged keys are batch sizes of batches "
                                f"({', '.join(map(str, self.batches)) or 'none'}), got {key!r}")
            costs.check(f" (batch size {b})")
            out[b] = costs
        return dict(sorted(out.items()))

    @property
    def temperature(self) -> float | None:
        """The temperature the overheads were fitted at (`mcsd profile --temperature`); None
        when not calibrated on the decoder."""
        if "k_config" not in self.static:
            return None
        return float(self.static["temperature"])

    def temperature_note(self, temperature: float) -> str | None:
        """A warning when replays at `temperature` price steps with overheads fitted greedy
        and the replay samples, or the reverse (sampling costs a step more than an argmax; the
        temperature's value barely moves it); None when both sample or neither does."""
        own = self.temperature
        if own is None or (own > 0) == (temperature > 0):
            return None
        return (f"note: the cost profile's overheads were fitted at temperature {own:g}, the "
                f"replay decodes at {temperature:g}: sampling's own cost is priced as at "
                f"{own:g} (measure one with `mcsd profile --temperature {temperature:g}`)")

    @property
    def batch_sizes(self) -> list[int]:
        """The batch sizes measured: 1 and the keys of `batches`."""
        return [1, *self.batches]

    def _at(self, values: list[float], n: float) -> float:
        return _interp(self.tokens, values, n)

    def _curve(self, name: str, b: int) -> list[float]:
        """Batch size `b`'s curve `name` (draft_first_s falls back to draft_s)."""
        src = self if b == 1 else self.batches[b]
        if name == "draft_first_s":
            return src.draft_first_s or src.draft_s
        return getattr(src, name)

    def check_rows(self, rows: int) -> None:
        """MCSDError unless forwards over `rows` rows lie within the measured batch sizes."""
        sizes = self.batch_sizes
        if rows != int(rows) or not sizes[0] <= rows <= sizes[-1]:
            raise MCSDError(
                f"this cost profile was measured at batch size(s) "
                f"{', '.join(map(str, sizes))}: {rows} rows lie outside; measure one that covers "
                f"them (`mcsd profile --batch-size {','.join(map(str, sizes))},{rows}`)")

    def _bracket(self, rows: int) -> tuple[int, int, float]:
        """The measured batch sizes around `rows` and the weight of the upper one."""
        self.check_rows(rows)
        sizes = self.batch_sizes
        hi = next(b for b in sizes if b >= rows)
        lo = max(b for b in sizes if b <= rows)
        return lo, hi, (rows - lo) / (hi - lo) if hi > lo else 0.0

    def _latency(self, name: str, n: int, rows: int) -> float:
        lo, hi, w = self._bracket(rows)
        at_lo = self._at(self._curve(name, lo), n)
        return at_lo if not w else at_lo + w * (self._at(self._curve(name, hi), n) - at_lo)

    def target(self, n: int, rows: int = 1) -> float:
        """Seconds of one target forward over `rows` rows of `n` tokens each."""
        return self._latency("target_s", n, rows)

    def draft(self, n: int, rows: int = 1) -> float:
        """Seconds of one draft forward over `rows` rows of `n` tokens each."""
        return self._latency("draft_s", n, rows)

    def draft_first(self, n: int, rows: int = 1) -> float:
        """Seconds of a step's first draft forward, over `n` pending tokens per row."""
        return self._latency("draft_first_s", n, rows)

    def _ragged_at(self, name: str, per_row: float, b: int) -> float:
        """Curve `name`'s ragged price at measured batch size `b` for `per_row` tokens a row:
        `ragged[b]`'s points at b * per_row tokens (a first draft forward scaled by the padded
        first forward's ratio to the others), else the padded curve at `per_row`."""
        measured = self.ragged.get(b)
        if measured is None:
            return self._at(self._curve(name, b), per_row)
        if name == "target_s":
            return measured.at("target", b * per_row)
        cost = measured.at("draft", b * per_row)
        if name == "draft_first_s":
            rest = self._at(self._curve("draft_s", b), per_row)
            cost *= self._at(self._curve("draft_first_s", b), per_row) / rest if rest else 1.0
        return cost

    def _ragged(self, name: str, tokens: float, rows: int) -> float:
        if not rows or not tokens:
            return 0.0
        lo, hi, w = self._bracket(rows)
        at_lo = self._ragged_at(name, tokens / rows, lo)
        return at_lo if not w else at_lo + w * (self._ragged_at(name, tokens / rows, hi) - at_lo)

    def ragged_target(self, tokens: float, rows: int) -> float:
        """Seconds of one ragged target forward carrying `tokens` new tokens in all over a batch
        of `rows` rows: the measured ragged forwards at `rows` (`ragged`), else the padded curve
        of `rows` rows at `tokens / rows` tokens a row; no lower than the curve's first point (a
        forward's floor, its cache and attention over every row of the batch, is paid whatever
        rows carry tokens; 0 tokens: no forward, 0). See the module docstring."""
        return self._ragged("target_s", tokens, rows)

    def ragged_draft(self, tokens: float, rows: int, first: bool = False) -> float:
        """Seconds of one ragged draft forward carrying `tokens` new tokens over a batch of
        `rows` rows, priced as `ragged_target`; `first`: a step's first draft forward
        (`draft_first`)."""
        return self._ragged("draft_first_s" if first else "draft_s", tokens, rows)

    def ragged_step_seconds(self, tree, rows: list[tuple[int, int, int]]) -> float:
        """Seconds of one ragged batch step, each row given as (pending, drafted, verified):
        its draft-pending tokens, the depth it drafts to (0: none) and the depths the target
        verifies (<= drafted). Draft forward i carries the tokens of the rows that draft deeper
        than i, each feeding its `step_model.step_forwards` tokens (the first its pending
        ones), over the batch's caches; the target's every row's bonus token and verified
        nodes (`tree.cum`); plus the per-step overhead and the per-depth one for each draft
        forward, at the batch's rows. Each forward is priced as the engine runs it
        (`as_run`): packed where `step_model.packs`, else padded at its widest row."""
        step, depth = self.overheads(len(rows))
        cost = step + self.as_run("target_s", [1 + tree.cum[v] for _, _, v in rows])
        forwards = [step_forwards(tree, d, p).draft for p, d, _ in rows]
        for i in range(max((d for _, d, _ in rows), default=0)):
            fed = [f[i] if len(f) > i else 0 for f in forwards]
            cost += self.as_run("draft_first_s" if not i else "draft_s", fed) + depth
        return cost

    def as_run(self, name: str, counts: list[int]) -> float:
        """Seconds of one forward of curve `name` (target_s, draft_s, draft_first_s) whose rows
        carry `counts` tokens, as the engine runs it: packed (`ragged_target`, `ragged_draft`)
        where `step_model.packs` says so, else padded, every row at the widest row's tokens."""
        width = max(counts, default=0)
        if not width:
            return 0.0
        if packs(counts, width):
            return self._ragged(name, sum(counts), len(counts))
        return self._latency(name, width, len(counts))

    def overheads(self, rows: int = 1) -> tuple[float, float]:
        """The decoder's seconds per step and per drafted depth outside forwards at `rows`
        rows: interpolated between the batch sizes calibrated (1 always counts), held at the
        largest of them beyond it."""
        self._bracket(rows)
        known = [(1, self.step_overhead_s, self.depth_overhead_s)]
        known += [(b, c.step_overhead_s, c.depth_overhead_s) for b, c in self.batches.items()
                  if c.step_overhead_s is not None and c.depth_overhead_s is not None]
        if rows >= known[-1][0]:
            return known[-1][1], known[-1][2]
        hi = next(i for i, k in enumerate(known) if k[0] >= rows)
        (b0, s0, d0), (b1, s1, d1) = known[max(hi - 1, 0)], known[hi]
        w = (rows - b0) / (b1 - b0) if b1 > b0 else 0.0
        return s0 + w * (s1 - s0), d0 + w * (d1 - d0)

    def step_seconds(self, tree, s: int, pending: int, rows: int = 1) -> float:
        """Seconds of one decoder step over `rows` rows stopped at depth `s` of `tree` with
        `pending` tokens the draft has not seen (the most of any row: forwards are padded to
        it): its forwards (`step_model.step_forwards`, each over every row) plus
        the per-step and per-depth overheads."""
        forwards = step_forwards(tree, s, pending)
        step, depth = self.overheads(rows)
        cost = self.target(forwards.target, rows) + step + depth * s
        if forwards.draft:
            first, *rest = forwards.draft
            cost += self.draft_first(first, rows) + sum(self.draft(n, rows) for n in rest)
        return cost

    def copy_step_seconds(self, k: int) -> float:
        """Seconds of a step at batch size 1 verifying a prompt-lookup chain of `k` copied
        tokens (k = 0: the target alone): the target's forward over k + 1 and the per-step
        overhead."""
        return self.target(k + 1) + self.overheads(1)[0]

    def decode_seconds(self, tree, steps, from_prefill: bool = False) -> float:
        """Seconds this profile charges the decode phase of one generation at batch size 1,
        priced step by step as the decoder took them (`GenerationResult.steps`): a drafted step
        `step_seconds` at its depth with the draft's pending tokens before it (1 after the
        prefill; a first depth cut to w candidates by a learned width, the tree `(w,)`'s); a
        prompt-lookup chain of k tokens the target's forward over k + 1 and the per-step
        overhead. `from_prefill`: the first step's token came from the prefill's
        logits (`ARDecoder`) and is not charged. Unlike a replay over another output's trace,
        this checks the cost model alone, also when sampling."""
        total, pending = 0.0, 1
        for i, rec in enumerate(steps):
            if i or not from_prefill:
                if rec.copied:
                    total += self.copy_step_seconds(rec.tree_size)
                elif rec.drafted == 1 and rec.tree_size != tree.cum[1]:  # a learned width's cut
                    # the tree (w,): built by `tree`'s own class (no torch import here)
                    total += self.step_seconds(type(tree)((rec.tree_size,)), 1, pending)
                else:
                    total += self.step_seconds(tree, rec.drafted, pending)
            pending = rec.draft_pending
        return total

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION} | asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CostProfile:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise MCSDError(f"cannot read cost profile {path}: {err}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise MCSDError(f"{path} is not a cost profile (format {FORMAT!r}); make one with "
                            f"`mcsd profile`")
        keys = {f for f in cls.__dataclass_fields__}
        try:
            return cls(**{k: v for k, v in data.items() if k in keys})
        except TypeError as err:
            raise MCSDError(f"cost profile {path}: {err}") from None
        except MCSDError as err:
            raise MCSDError(f"{path}: {err}") from None

    @classmethod
    def relative(cls, draft_ratio: float = 0.1) -> CostProfile:
        """A stand-in when nothing was measured: a target forward costs 1 (plus 1% per token),
        a draft forward `draft_ratio` of that. Throughputs are then relative, not tokens/s."""
        tokens = [1, 64]
        return cls(tokens=tokens, target_s=[1.0, 1.63], draft_s=[draft_ratio, draft_ratio * 1.63],
                   note=f"relative stand-in (draft/target = {draft_ratio}), not measured")
