"""`mcsd profile`: each model's forward latency against the number of tokens it processes, over a
KV cache of typical length, on this machine; and the cost model replay uses to turn a step's
forwards into seconds.

A profile is JSON:

    {"format": "mcsd-cost-profile", "version": 1, "pair": {...fingerprint...},
     "device": "cpu", "dtype": "float32", "context": 256,
     "tokens": [1, 2, ...], "target_s": [...], "draft_s": [...],
     "step_overhead_s": 0.0004}

`target_s[i]` / `draft_s[i]`: seconds of one forward over `tokens[i]` new tokens (the fastest
of `repeats`, robust to other load on a shared machine); counts in between are interpolated
linearly, beyond the last extrapolated from the last two.
`step_overhead_s` is the decoder's own time per step outside model forwards (bookkeeping,
verification, cache cuts). Users may write their own profile (e.g. measured on their GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mcsd_runtime.errors import MCSDError

FORMAT = "mcsd-cost-profile"
DEFAULT_TOKENS = (*range(1, 17), 20, 24, 28, 32, 40, 48, 56, 64)


@dataclass
class CostProfile:
    tokens: list[int]
    target_s: list[float]
    draft_s: list[float]
    step_overhead_s: float = 0.0
    context: int = 0
    device: str = ""
    dtype: str = ""
    pair: dict = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not n or len(self.target_s) != n or len(self.draft_s) != n:
            raise MCSDError("cost profile: tokens, target_s and draft_s must be non-empty lists "
                            "of the same length")
        if sorted(set(self.tokens)) != list(self.tokens) or self.tokens[0] < 1:
            raise MCSDError("cost profile: tokens must be increasing positive integers")
        if any(not v >= 0 for v in (*self.target_s, *self.draft_s, self.step_overhead_s)):
            raise MCSDError("cost profile: latencies must be non-negative numbers")

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

    def target(self, n: int) -> float:
        """Seconds of one target forward over `n` tokens."""
        return self._at(self.target_s, n)

    def draft(self, n: int) -> float:
        """Seconds of one draft forward over `n` tokens."""
        return self._at(self.draft_s, n)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": 1} | asdict(self)

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

    @classmethod
    def relative(cls, draft_ratio: float = 0.1) -> CostProfile:
        """A stand-in when nothing was measured: a target forward costs 1 (plus 1% per token),
        a draft forward `draft_ratio` of that. Throughputs are then relative, not tokens/s."""
        tokens = [1, 64]
        return cls(tokens=tokens, target_s=[1.0, 1.63], draft_s=[draft_ratio, draft_ratio * 1.63],
                   note=f"relative stand-in (draft/target = {draft_ratio}), not measured")


def measure(pair, tokens=DEFAULT_TOKENS, context: int = 256, repeats: int = 7,
            warmup: int = 2, progress: bool = False) -> CostProfile:
    """Fastest forward latency of each model over `n` new tokens on a cache of `context` tokens
    (`progress`: show the points measured on stderr, see mcsd_runtime.progress)."""
    import torch
    from transformers import DynamicCache

    from mcsd_runtime.progress import progress as progress_bar

    dev = pair.device
    context = max(1, min(context, pair.max_positions - max(tokens)))
    gen = torch.Generator().manual_seed(0)
    ctx_ids = torch.randint(0, pair.vocab_size, (1, context), generator=gen).to(dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    result = {}
    bar = progress_bar(total=2 * len(tokens), desc="profile", unit="point", disable=not progress)
    with bar, torch.inference_mode():
        for name, model in (("target", pair.target), ("draft", pair.draft)):
            cache = DynamicCache()
            model(input_ids=ctx_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            times = []
            for n in tokens:
                ids = torch.randint(0, pair.vocab_size, (1, n), generator=gen).to(dev)
                pos = torch.arange(context, context + n, device=dev)[None]
                samples = []
                for r in range(warmup + repeats):
                    sync()
                    t0 = time.perf_counter()
                    model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
                    sync()
                    if r >= warmup:
                        samples.append(time.perf_counter() - t0)
                    cache.crop(-n)  # transformers 5: a negative count removes tokens
                times.append(min(samples))  # min: robust to other load on a shared machine
                bar.set_postfix_str(f"{name}, {n} tokens: {times[-1] * 1e3:.2f} ms",
                                    refresh=False)
                bar.update()
            result[name] = times
    return CostProfile(tokens=list(tokens), target_s=result["target"], draft_s=result["draft"],
                       context=context, device=str(dev),
                       dtype=str(pair.dtype).replace("torch.", ""), pair=dict(pair.fingerprint))


def step_overhead(pair, prompts: list[str], k_config=(4, 2, 2, 1),
                  max_new_tokens: int = 48, progress: bool = False) -> float:
    """Decoder time per step spent outside model forwards (median over prompts)."""
    from mcsd_runtime.decoder import DecodeConfig, MCSDDecoder
    from mcsd_runtime.progress import progress as progress_bar

    dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, max_new_tokens=max_new_tokens))
    dec.generate(prompts[0])
    per_step = []
    for p in progress_bar(prompts, desc="profile: step overhead", unit="prompt",
                          disable=not progress):
        r = dec.generate(p)
        st = r.stats
        per_step.append(max(0.0, st.wall_time - st.target_time - st.draft_time) / len(r.steps))
    return statistics.median(per_step)


def register(sub: argparse._SubParsersAction) -> None:
    from mcsd_runtime.cli_args import add_pair_args, add_threads_arg

    p = sub.add_parser(
        "profile", help="measure forward latency against tokens processed (cost profile JSON)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(p)
    p.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument("--max-tokens", type=int, default=64,
                   help="largest number of new tokens per forward (default %(default)s)")
    p.add_argument("--context", type=int, default=256,
                   help="KV cache length the forwards run over (default %(default)s)")
    p.add_argument("--repeats", type=int, default=7,
                   help="timed forwards per point (the fastest is kept)")
    p.add_argument("--overhead-prompts", default="toy-code", help="prompt set used to measure the "
                   "decoder's per-step overhead; 'none' to skip (default %(default)s)")
    add_threads_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    from mcsd_runtime.cli_args import apply_threads, pair_from_args

    if args.max_tokens < 1 or args.repeats < 1 or args.context < 1:
        raise MCSDError("--max-tokens, --repeats and --context must be positive")
    apply_threads(args)
    pair = pair_from_args(args)
    tokens = [n for n in DEFAULT_TOKENS if n <= args.max_tokens]
    if tokens[-1] != args.max_tokens:
        tokens.append(args.max_tokens)
    profile = measure(pair, tokens, context=args.context, repeats=args.repeats, progress=True)
    if args.overhead_prompts != "none":
        from mcsd_runtime.prompts import load_prompts

        texts = [p.text for p in load_prompts(args.overhead_prompts, limit=4)]
        profile.step_overhead_s = step_overhead(pair, texts, progress=True)
    profile.save(args.out)
    t, d = profile.target_s, profile.draft_s
    print(f"target: {t[0] * 1e3:.2f} ms at 1 token, {t[-1] * 1e3:.2f} ms at {tokens[-1]}; "
          f"draft: {d[0] * 1e3:.2f} ms / {d[-1] * 1e3:.2f} ms; step overhead "
          f"{profile.step_overhead_s * 1e3:.2f} ms -> {args.out}")
    return 0
