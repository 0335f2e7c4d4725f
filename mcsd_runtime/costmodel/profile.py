"""`mcsd profile`: each model's forward latency against the number of tokens it processes, per
batch size, and the decoder's own time per step and per drafted depth, measured on this machine
the way the decoder runs; and the cost model replay uses to turn a step's forwards into seconds.

A profile is JSON:

    {"format": "mcsd-cost-profile", "version": 2, "pair": {...fingerprint...},
     "device": "cpu", "dtype": "float32", "context": 256,
     "tokens": [1, 2, ...], "target_s": [...], "draft_s": [...],
     "step_overhead_s": 0.0004, "depth_overhead_s": 0.00005, "static": {...},
     "batches": {"8": {"target_s": [...], "draft_s": [...], "draft_first_s": [...],
                       "step_overhead_s": 0.002, "depth_overhead_s": 0.0002, "static": {...}}}}

`target_s[i]` / `draft_s[i]`: seconds of one forward over `tokens[i]` new tokens with the
decoder's 4D mask over a KV cache of `context` tokens, at batch size 1. `batches[B]` holds the
same curves for B rows of `tokens[i]` new tokens each (a mask per row, [B, 1, n, context + n],
and position ids [B, n], over a cache of `context` tokens per row), with the overheads fitted to
batched runs at B. A version-1 profile (no `batches`) is a profile of batch size 1.
Token counts are timed in a random order, round after round (so slow spells of a shared machine
spread over all counts instead of bending the curve), each count's median is kept, and the curve
is made non-decreasing (isotonic fit): a forward over more tokens never costs less. Counts in
between are interpolated linearly, beyond the last extrapolated from the last two; row counts
between two measured batch sizes are interpolated linearly, and row counts outside the measured
ones are refused.
`step_overhead_s` and `depth_overhead_s` are the decoder's own time outside model forwards
(bookkeeping, verification, cache cuts; per drafted depth: candidates, stopper), fitted by least
squares to end-to-end runs of every static depth of a k-config, interleaved per prompt (at
B > 1: per batch of prompts, `MCSDDecoder.generate_batch`); those runs' tokens/s are kept under
`static` so that a replay can be checked against them.
Users may write their own profile (e.g. measured on their GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from mcsd_runtime import metrics
from mcsd_runtime.costmodel.step_model import step_forwards
from mcsd_runtime.errors import MCSDError

FORMAT = "mcsd-cost-profile"
VERSION = 2  # 2 added `batches`; a version-1 file reads as a profile of batch size 1
DEFAULT_TOKENS = (*range(1, 17), 20, 24, 28, 32, 40, 48, 56, 64)
DEFAULT_BATCH_SIZES = (1,)


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

    @property
    def batch_sizes(self) -> list[int]:
        """The batch sizes measured: 1 and the keys of `batches`."""
        return [1, *self.batches]

    def _at(self, values: list[float], n: int) -> float:
        xs = self.tokens
        if n <= xs[0] or len(xs) == 1:
            return values[0] if n <= xs[0] else values[-1] * n / xs[-1]
        for i in range(1, len(xs)):
            if n <= xs[i]:
                w = (n - xs[i - 1]) / (xs[i] - xs[i - 1])
                return values[i - 1] + w * (values[i] - values[i - 1])
        slope = (values[-1] - values[-2]) / (xs[-1] - xs[-2])
        return values[-1] + max(slope, 0.0) * (n - xs[-1])

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
                f"them (`mcsd profile --batch-sizes {','.join(map(str, sizes))},{rows}`)")

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


def parse_batch_sizes(text: str, option: str) -> tuple[int, ...]:
    """`1,8` -> (1, 8); MCSDError naming `option` for anything else."""
    try:
        sizes = tuple(int(b) for b in str(text).split(",") if b.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise MCSDError(f"{option} takes positive integers separated by commas (e.g. 1,8), got "
                        f"{text!r}")
    return sizes


def monotone(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to `values` in least squares (isotonic fit)."""
    from sklearn.isotonic import IsotonicRegression

    xs = list(range(len(values)))
    return [float(v) for v in IsotonicRegression().fit_transform(xs, values)]


def measure(pair, tokens=DEFAULT_TOKENS, context: int = 256, rounds: int = 7,
            seed: int = 0, progress: bool = False,
            batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES) -> CostProfile:
    """Median forward latency of each model over B rows of `n` new tokens each, on a cache of
    `context` tokens per row, with the decoder's 4D additive mask (one per row) and position ids
    per row, for every B of `batch_sizes` (1 is always measured); (model, B, n) jobs in a fresh
    random order every round (`progress`: report rounds on stderr, see
    mcsd_runtime.progress)."""
    import random

    import torch
    from transformers import DynamicCache

    from mcsd_runtime.decode.decoder import causal_bias
    from mcsd_runtime.progress import progress as progress_bar

    sizes = sorted({1, *(int(b) for b in batch_sizes)})
    if sizes[0] < 1:
        raise MCSDError(f"batch sizes must be positive, got {batch_sizes}")
    dev = pair.device
    context = max(1, min(context, pair.max_positions - max(tokens)))
    gen = torch.Generator().manual_seed(seed)
    order = random.Random(seed)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    block = causal_bias(max(tokens), pair.dtype, dev)
    models = {"target": pair.target, "draft": pair.draft}
    samples = {(name, b, n): [] for name in models for b in sizes for n in tokens}
    with torch.inference_mode():
        caches = {}
        for b in sizes:  # a cache of `context` random tokens per row
            ctx_ids = torch.randint(0, pair.vocab_size, (b, context), generator=gen).to(dev)
            for name, model in models.items():
                caches[(name, b)] = DynamicCache()
                model(input_ids=ctx_ids, past_key_values=caches[(name, b)], use_cache=True,
                      logits_to_keep=1)
        jobs = list(samples)
        for r in progress_bar(range(rounds + 1), desc="profile", unit="round",
                              disable=not progress):  # round 0 warms up
            order.shuffle(jobs)
            for name, b, n in jobs:
                ids = torch.randint(0, pair.vocab_size, (b, n), generator=gen).to(dev)
                pos = torch.arange(context, context + n, device=dev)[None].expand(b, n)
                mask = torch.cat([torch.zeros(n, context, dtype=pair.dtype, device=dev),
                                  block[:n, :n]], -1)[None, None].expand(b, 1, n, context + n)
                sync()
                t0 = time.perf_counter()
                models[name](input_ids=ids, position_ids=pos, attention_mask=mask,
                             past_key_values=caches[(name, b)], use_cache=True)
                sync()
                if r:
                    samples[(name, b, n)].append(time.perf_counter() - t0)
                caches[(name, b)].crop(-n)  # transformers 5: a negative count removes tokens
    curve = {(name, b): monotone([statistics.median(samples[(name, b, n)]) for n in tokens])
             for name in models for b in sizes}
    batches = {b: BatchCosts(target_s=curve[("target", b)], draft_s=curve[("draft", b)])
               for b in sizes[1:]}
    return CostProfile(tokens=list(tokens), target_s=curve[("target", 1)],
                       draft_s=curve[("draft", 1)], context=context, device=str(dev),
                       threads=torch.get_num_threads(), batches=batches,
                       dtype=str(pair.dtype).replace("torch.", ""), pair=dict(pair.fingerprint))


def static_runs(pair, prompts: list[list[int]], k_config, max_new_tokens: int = 48,
                seed: int = 0, progress: bool = False,
                batch_size: int = 1) -> tuple[list[dict], dict]:
    """Every static depth 1..D of `k_config` end to end, after one warm-up. At batch size 1 each
    prompt alone, depths in a fresh random order per prompt; above it all `prompts` through
    `MCSDDecoder.generate_batch` once per depth, in a random order. Returns the runs (depth,
    steps, drafted depths, tokens, decode seconds after the prefill, seconds inside forwards
    then) and every forward's seconds by (model, new tokens per row): forwards timed the way the
    decoder runs them, a step's first draft forward (right after a target forward) apart as
    `draft_first`; above batch size 1 only forwards over `batch_size` rows."""
    import random

    from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
    from mcsd_runtime.progress import progress as progress_bar

    depth = len(k_config)
    decs = {d: MCSDDecoder(pair, DecodeConfig(k_config=k_config, max_new_tokens=max_new_tokens),
                           stopper=f"static:{d}") for d in range(1, depth + 1)}
    order = random.Random(seed)
    if batch_size > 1:
        return _static_batch_runs(pair, decs, prompts, batch_size, order, progress)
    decs[depth].generate(prompts[0])
    runs, forwards = [], {}
    for i, ids in enumerate(progress_bar(prompts, desc="static runs", unit="prompt",
                                         disable=not progress)):
        depths = list(decs)
        order.shuffle(depths)
        for d in depths:
            log = decs[d].forward_log = []
            r = decs[d].generate(ids)
            decs[d].forward_log = None
            prev = "target"  # the first logged forward follows the prefill: a first draft
            for name, n, dt in log:
                kind = "draft_first" if name == "draft" and prev == "target" else name
                forwards.setdefault((kind, n), []).append(dt)
                prev = name
            runs.append({"prompt": i, "depth": d, "steps": len(r.steps),
                         "drafted": sum(s.drafted for s in r.steps),
                         "tokens": r.stats.new_tokens, "decode_s": r.stats.decode_time,
                         "forward_s": sum(dt for _, _, dt in log)})
    return runs, forwards


class _ForwardTimer:
    """Times every forward of a pair's two models through module hooks, as (model, rows, new
    tokens per row, seconds), leaving out prefills (a target forward that keeps one position's
    logits, and the draft forward that follows it)."""

    def __init__(self, pair) -> None:
        self.pair, self.log, self._handles = pair, [], []
        self._t0, self._prefill = 0.0, False

    def __enter__(self) -> list[tuple[str, int, int, float]]:
        for name, model in (("target", self.pair.target), ("draft", self.pair.draft)):
            self._handles.append(model.register_forward_pre_hook(self._start, with_kwargs=True))
            self._handles.append(model.register_forward_hook(
                lambda m, args, kwargs, out, name=name: self._stop(name, kwargs),
                with_kwargs=True))
        return self.log

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()

    def _start(self, module, args, kwargs) -> None:
        if self.pair.device.type == "cuda":
            import torch

            torch.cuda.synchronize()
        self._t0 = time.perf_counter()

    def _stop(self, name: str, kwargs: dict) -> None:
        if self.pair.device.type == "cuda":
            import torch

            torch.cuda.synchronize()
        dt = time.perf_counter() - self._t0
        rows, n = kwargs["input_ids"].shape
        if name == "target" and kwargs.get("logits_to_keep") == 1:
            self._prefill = True  # an admission: the target's prefill, then the draft's
        elif self._prefill and name == "draft":
            self._prefill = False
        else:
            self.log.append((name, rows, n, dt))


def _static_batch_runs(pair, decs: dict, prompts: list[list[int]], batch_size: int, order,
                       progress: bool) -> tuple[list[dict], dict]:
    """`static_runs` above batch size 1: each static depth decodes all prompts once with
    `generate_batch`, depths in a random order after a warm-up of the deepest."""
    from mcsd_runtime.progress import progress as progress_bar

    decs[max(decs)].generate_batch(prompts[:batch_size], batch_size=batch_size)
    depths = list(decs)
    order.shuffle(depths)
    runs, forwards = [], {}
    for d in progress_bar(depths, desc=f"static runs at batch size {batch_size}", unit="depth",
                          disable=not progress):
        with _ForwardTimer(pair) as log:
            st = decs[d].generate_batch(prompts, batch_size=batch_size).stats
        prev = "target"
        for name, rows, n, dt in log:
            kind = "draft_first" if name == "draft" and prev == "target" else name
            if rows == batch_size:
                forwards.setdefault((kind, n), []).append(dt)
            prev = name
        # a drafting step of the batch runs one draft forward per depth it drafts
        runs.append({"prompt": 0, "depth": d, "steps": st.target_calls,
                     "drafted": st.draft_calls, "tokens": st.new_tokens,
                     "decode_s": st.decode_time, "forward_s": sum(x[3] for x in log)})
    return runs, forwards


def calibrate(profile: CostProfile, runs: list[dict], forwards: dict,
              min_samples: int = 5, batch_size: int = 1) -> CostProfile:
    """`profile` with batch size `batch_size`'s forward latencies replaced by the ones the
    decoder itself measured (medians, where a token count was seen `min_samples` times; curves
    made monotone again) and its per-step and per-depth overheads fitted to those runs."""
    own = profile if batch_size == 1 else profile.batches[batch_size]
    curves = {"target": list(own.target_s), "draft": list(own.draft_s),
              "draft_first": list(own.draft_s)}
    for (name, n), samples in forwards.items():
        if n in profile.tokens and len(samples) >= min_samples:
            curves[name][profile.tokens.index(n)] = statistics.median(samples)
    step, depth = fit_overheads(runs)
    fitted = dict(target_s=monotone(curves["target"]), draft_s=monotone(curves["draft"]),
                  draft_first_s=monotone(curves["draft_first"]), step_overhead_s=step,
                  depth_overhead_s=depth, static={"tokens_per_s": static_throughput(runs)})
    if batch_size == 1:
        return replace(profile, **fitted)
    return replace(profile, batches=profile.batches | {batch_size: BatchCosts(**fitted)})


def fit_overheads(runs: list[dict]) -> tuple[float, float]:
    """Per-step and per-drafted-depth seconds outside forwards in decode time (both >= 0,
    least squares): the decoder's own work."""
    import numpy as np
    from scipy.optimize import nnls

    a = np.array([[r["steps"], r["drafted"]] for r in runs], dtype=float)
    b = np.array([r["decode_s"] - r["forward_s"] for r in runs])
    coef, _ = nnls(a, b)
    return float(coef[0]), float(coef[1])


def static_throughput(runs: list[dict]) -> dict[str, float]:
    """Decode-phase tokens/s of each static depth over all prompts of `static_runs`."""
    out = {}
    for d in sorted({r["depth"] for r in runs}):
        sel = [r for r in runs if r["depth"] == d]
        out[f"static:{d}"] = metrics.throughput(sum(r["tokens"] for r in sel),
                                                sum(r["decode_s"] for r in sel))
    return out


def register(sub: argparse._SubParsersAction) -> None:
    from mcsd_runtime.cli.args import DEFAULT_K_TEXT, add_pair_args, add_threads_arg

    p = sub.add_parser(
        "profile", help="measure forward latency against tokens processed (cost profile JSON)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    p.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument("--max-tokens", type=int, default=64,
                   help="largest number of new tokens per forward (default %(default)s)")
    p.add_argument("--context", type=int, default=256,
                   help="KV cache length the forwards run over (default %(default)s)")
    p.add_argument("--rounds", "--repeats", type=int, default=7, dest="rounds",
                   help="timed rounds over all token counts, each in a random order; the median "
                        "is kept (default %(default)s)")
    p.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)),
                   metavar="B[,B...]",
                   help="batch sizes whose forwards are timed (B rows of n tokens each; 1 is "
                        "always measured) and whose overheads are fitted to batched runs; "
                        "replay at B rows needs B within them (default %(default)s)")
    p.add_argument("--k-config", default=DEFAULT_K_TEXT,
                   help="tree whose static depths 1..D are run end to end: the forwards timed "
                        "there replace the isolated ones, and the decoder's per-step and "
                        "per-depth overheads are fitted to them; use the collection's tree "
                        "(default %(default)s, as collect's)")
    p.add_argument("--overhead-prompts", default="toy-code", help="prompt set of those runs; "
                   "'none' to skip (default %(default)s)")
    p.add_argument("--overhead-limit", type=int, default=6,
                   help="prompts of those runs (at batch size B > 1 at least 2B; default "
                        "%(default)s)")
    p.add_argument("--overhead-tokens", type=int, default=48,
                   help="new tokens per run (default %(default)s)")
    add_threads_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.cli.args import apply_threads, pair_from_args
    from mcsd_runtime.decode.tree import parse_k_config
    from mcsd_runtime.extras import require_toolkit

    require_toolkit("mcsd profile", "sklearn", "scipy")  # the monotone fit, the overhead fit
    if min(args.max_tokens, args.rounds, args.context, args.overhead_limit,
           args.overhead_tokens) < 1:
        raise MCSDError("--max-tokens, --rounds, --context, --overhead-limit and "
                        "--overhead-tokens must be positive")
    k_config = parse_k_config(args.k_config)
    sizes = sorted({1, *parse_batch_sizes(args.batch_sizes, "--batch-sizes")})
    apply_threads(args)
    pair = pair_from_args(args)
    tokens = [n for n in DEFAULT_TOKENS if n <= args.max_tokens]
    if tokens[-1] != args.max_tokens:
        tokens.append(args.max_tokens)
    print(f"timing forwards: {len(tokens)} token counts x 2 models x {len(sizes)} batch size(s) "
          f"x {args.rounds} rounds", flush=True)
    profile = measure(pair, tokens, context=args.context, rounds=args.rounds, progress=True,
                      batch_sizes=tuple(sizes))
    if args.overhead_prompts != "none" and k_config:
        from mcsd_runtime.prompts.sets import load_prompts

        for b in sizes:  # above batch size 1: enough prompts to fill the batch twice
            limit = args.overhead_limit if b == 1 else max(args.overhead_limit, 2 * b)
            texts = [p.text for p in load_prompts(args.overhead_prompts, limit=limit)]
            ids = [pair.tokenizer(t)["input_ids"] if pair.tokenizer else t for t in texts]
            print(f"calibrating on the decoder at batch size {b}: static depths "
                  f"1..{len(k_config)} of {k_config} on {len(ids)} prompts", flush=True)
            runs, forwards = static_runs(pair, ids, k_config, args.overhead_tokens,
                                         progress=True, batch_size=b)
            profile = calibrate(profile, runs, forwards, batch_size=b)
            if b > 1:
                profile.batches[b].static["prompts"] = len(ids)
        profile.static |= {"k_config": list(k_config), "prompt_set": args.overhead_prompts,
                           "max_new_tokens": args.overhead_tokens}
    profile.save(args.out)
    for b in profile.batch_sizes:
        t, d = profile._curve("target_s", b), profile._curve("draft_s", b)
        step, depth = profile.overheads(b)
        print(f"B={b}: target {t[0] * 1e3:.2f} ms at 1 token per row, {t[-1] * 1e3:.2f} ms at "
              f"{tokens[-1]}; draft {d[0] * 1e3:.2f} ms / {d[-1] * 1e3:.2f} ms; overhead "
              f"{step * 1e3:.2f} ms/step + {depth * 1e3:.3f} ms/depth")
    print(f"-> {args.out}")
    return 0
