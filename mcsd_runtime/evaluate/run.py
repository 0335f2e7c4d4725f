"""End-to-end evaluation behind `mcsd eval` (eval_cli.py): method runners, interleaved runs,
the summary every report number comes from, tables, plots and the report."""

from __future__ import annotations

import contextlib
import json
import statistics
import textwrap
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from mcsd_runtime import metrics
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, GenerationResult, MCSDDecoder
from mcsd_runtime.decode.tree import parse_k_config
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate import quality
from mcsd_runtime.models.pair import Pair
from mcsd_runtime.paths import short_model_name
from mcsd_runtime.stop.artifact import ArtifactSpec
from mcsd_runtime.stop.builtin import BUILTIN, UnknownStopperError, make_stopper, parse_stopper_spec
from mcsd_runtime.stop.learned import check_pair


def split_methods(spec: str) -> list[str]:
    """`ar,mcsd:4,2,2,1,heuristic` -> `["ar", "mcsd:4,2,2,1", "heuristic"]`."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part.isdigit() and out and out[-1].startswith(("mcsd:", "mcsd-target-init:")):
            out[-1] += f",{part}"
        else:
            out.append(part)
    if not out:
        raise MCSDError("no methods given: e.g. --methods ar,mcsd:4,2,2,1,heuristic")
    return out


@dataclass
class Record:
    method: str
    prompt_id: str
    token_ids: list[int]
    new_tokens: int
    wall_time: float
    target_calls: int
    draft_calls: int
    drafted_tokens: int | None  # None: the method does not say (hf-assisted)
    accepted_tokens: int | None
    acceptance_rate: float | None
    lossless: bool
    steps: list[tuple[int, int]]  # (drafted depth, accepted) per step
    forward_time: float = 0.0  # seconds inside model forwards
    hf_divergence: dict | None = None  # greedy: where the output first leaves `hf`'s
    # batches: the prompts decoded together (`batch_id`) are the unit speed is paired on, and
    # their throughput is the batch's, committed tokens of all rows per decode second
    batch_id: str | None = None
    batch_tokens_per_s: float | None = None
    target_nll: float | None = None  # target NLL per new token (mcsd_runtime.evaluate.quality)
    target_top1_share: float | None = None  # share of new tokens that are the target's top-1
    repeat_share: float | None = None  # share of the output's 4-grams seen earlier in it

    @property
    def tokens_per_s(self) -> float:
        if self.batch_tokens_per_s is not None:
            return self.batch_tokens_per_s
        return metrics.throughput(self.new_tokens, self.wall_time)

    @property
    def unit(self) -> str:
        """What speed is paired on: the prompt, or the batch it was decoded in."""
        return self.batch_id or self.prompt_id


class ForwardMeter:
    """Counts and times the forwards of some models while active, with hooks removed on exit."""

    def __init__(self, models: dict[str, torch.nn.Module]) -> None:
        self.models = models
        self.calls = dict.fromkeys(models, 0)
        self.seconds = 0.0
        self._handles: list = []
        self._t0 = 0.0

    def __enter__(self) -> ForwardMeter:
        for name, model in self.models.items():
            self._handles.append(model.register_forward_pre_hook(
                lambda *_, n=name: self._start(n)))
            self._handles.append(model.register_forward_hook(lambda *_: self._stop()))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _start(self, name: str) -> None:
        self.calls[name] += 1
        self._t0 = time.perf_counter()

    def _stop(self) -> None:
        self.seconds += time.perf_counter() - self._t0


def hf_sampling_kwargs(config: DecodeConfig) -> dict:
    """generate() arguments for greedy decoding, or sampling the full distribution at the
    config's temperature (no top-k / top-p, as our decoder samples)."""
    if config.temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": config.temperature, "top_k": 0, "top_p": 1.0}


def _eos_kwargs(config: DecodeConfig) -> dict:
    """generate() arguments for a config that ignores EOS (`eos_token_ids=()`)."""
    return {"eos_token_id": None} if config.eos_token_ids == () else {}


def clip_at_eos(tokens: list[int], eos: list[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


class HFGenerate:
    """The target's own `generate()`, timed around the call, its forwards counted and timed with
    hooks: alone (`hf`, an AR reference sharing no mask or cache code with our decoder) or with
    the draft as its assistant (`hf-assisted`, whose drafted token count is unknown)."""

    lossless = True

    def __init__(self, pair: Pair, config: DecodeConfig, assisted: bool = False) -> None:
        self.pair, self.config, self.assisted = pair, config, assisted
        self.models = {"target": pair.target} | ({"draft": pair.draft} if assisted else {})

    @torch.inference_mode()
    def generate(self, ids: list[int]) -> Record:
        pair, cfg = self.pair, self.config
        x = torch.tensor([ids], device=pair.device)
        kwargs = hf_sampling_kwargs(cfg) | ({"assistant_model": pair.draft} if self.assisted
                                            else {})
        eos = list(pair.eos_token_ids if cfg.eos_token_ids is None else cfg.eos_token_ids)
        torch.manual_seed(cfg.seed)
        with ForwardMeter(self.models) as meter, _quiet_transformers(self.assisted):
            t0 = time.perf_counter()
            out = pair.target.generate(x, attention_mask=torch.ones_like(x),
                                       max_new_tokens=cfg.max_new_tokens,
                                       pad_token_id=(pair.eos_token_ids or [0])[0],
                                       **kwargs | _eos_kwargs(cfg))
            wall = time.perf_counter() - t0
        new = clip_at_eos(out[0, len(ids):].tolist(), eos)
        unknown = None if self.assisted else 0
        return Record("", "", new, len(new), wall, meter.calls["target"],
                      meter.calls.get("draft", 0), unknown, unknown, None, True, [],
                      forward_time=meter.seconds)


@contextlib.contextmanager
def _quiet_transformers(quiet: bool = True):
    """transformers' warnings off for a while: assisted generation warns on every call about
    arguments it passes itself (`generation_config` with `max_new_tokens`)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    if quiet:
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


class HFCustomGenerate:
    """Our decoder behind transformers' `generate(custom_generate=mcsd_runtime.models.hf.generate)`
    (`hf-generate:STOPPER`), timed around the call like `hf`: its overhead against the same
    stopper run through `MCSDDecoder` directly."""

    lossless = True

    def __init__(self, pair: Pair, config: DecodeConfig, stopper: str) -> None:
        check_pair(make_stopper(stopper), pair)  # refuse a bad spec before any decoding
        self.pair, self.config, self.stopper = pair, config, stopper

    @torch.inference_mode()
    def generate(self, ids: list[int]) -> Record:
        from mcsd_runtime.models.hf import generate as mcsd_generate

        pair, cfg = self.pair, self.config
        x = torch.tensor([ids], device=pair.device)
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        out = pair.target.generate(x, attention_mask=torch.ones_like(x),
                                   custom_generate=mcsd_generate, draft_model=pair.draft,
                                   k_config=cfg.k_config, stopper=self.stopper, verify=cfg.verify,
                                   max_new_tokens=cfg.max_new_tokens, return_dict_in_generate=True,
                                   **hf_sampling_kwargs(cfg) | _eos_kwargs(cfg))
        wall = time.perf_counter() - t0
        rec = _from_result(out.mcsd, roots=0)
        rec.wall_time = wall
        return rec


def _from_result(result: GenerationResult, roots: int) -> Record:
    """`roots` = 1 when the tree's first layer came from the target (not drafted)."""
    s = result.stats
    return Record("", "", result.token_ids, s.new_tokens, s.wall_time, s.target_calls,
                  s.draft_calls, s.drafted_tokens, s.accepted_tokens,
                  s.acceptance_rate if s.drafting_steps else None, result.lossless,
                  [(max(st.drafted - roots, 0), st.accepted) for st in result.steps],
                  forward_time=s.target_time + s.draft_time)


class DecoderRunner:
    """One of our decoders as an eval method."""

    def __init__(self, decoder: MCSDDecoder) -> None:
        self.decoder = decoder
        self.roots = 1 if decoder.config.init == "target" else 0

    def generate(self, ids: list[int]) -> Record:
        return _from_result(self.decoder.generate(ids), self.roots)

    def generate_batch(self, batch: list[list[int]]) -> list[Record]:
        """The prompts decoded together (batch size = their number); every record carries the
        batch's throughput over its decode phase (prefills excluded)."""
        out = self.decoder.generate_batch(batch, batch_size=len(batch))
        tps = metrics.throughput(out.stats.new_tokens, out.stats.decode_time)
        records = [_from_result(r, self.roots) for r in out]
        for rec in records:
            rec.batch_tokens_per_s = tps
        return records


def check_method(name: str) -> None:
    """Refuse a method that cannot run before any pair is loaded: an unknown name, a bad
    k-config, or a stopper spec that loading would refuse (`StopperSpec.check`: a built-in with
    bad parameters, a trained stopper folder whose `stopper.json` is bad)."""
    kind, _, arg = name.partition(":")
    if name in ("ar", "hf", "hf-assisted"):
        return
    try:
        if kind in ("mcsd", "mcsd-target-init"):
            if arg:
                parse_k_config(arg)
            return
        parse_stopper_spec(arg if kind == "hf-generate" else name).check()
    except UnknownStopperError:
        raise MCSDError(
            f"unknown method {name!r}: use ar, hf, mcsd[:K], mcsd-target-init[:K], hf-assisted, "
            f"hf-generate:STOPPER, a stopper spec ({', '.join(BUILTIN)}) or stopper:PATH"
        ) from None
    except MCSDError as err:
        raise MCSDError(f"method {name!r}: {err}") from None


def _stopper_folder(method: str) -> Path | None:
    """The trained stopper folder a method runs (`stopper:PATH`, a bare folder, or either
    inside `hf-generate:`), else None."""
    kind, _, arg = method.partition(":")
    try:
        return parse_stopper_spec(arg if kind == "hf-generate" else method).folder
    except UnknownStopperError:  # ar, hf, mcsd:K, ...
        return None


def stopper_trees(methods: list[str]) -> dict[str, tuple[int, ...]]:
    """The k-config each trained stopper among `methods` records (those that record one)."""
    trees = {}
    for m in methods:
        folder = _stopper_folder(m)
        if folder is not None and (k := ArtifactSpec.read(folder).k_config):
            trees[m] = k
    return trees


def tree_for(methods: list[str], k_config: str | None,
             default: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """The tree to decode with and why: `k_config` when given, else the one tree the trained
    stoppers among `methods` were trained on, else `default`."""
    if k_config is not None:
        return parse_k_config(k_config), "--k-config"
    trees = stopper_trees(methods)
    if len(set(trees.values())) > 1:
        listed = "; ".join(f"{m}: {','.join(map(str, k))}" for m, k in trees.items())
        raise MCSDError(f"the trained stoppers were trained on different trees ({listed}); "
                        f"pass --k-config and keep only the stoppers trained on it")
    if trees:
        method, k = next(iter(trees.items()))
        return k, f"the tree {short_name(method)} was trained on"
    return default, "the default"


def explicit_label(method: str, k_config: tuple[int, ...]) -> str:
    """The name a method runs under with its defaults spelt out (`mcsd` -> `mcsd:4,2,2,1`,
    `confidence` -> `confidence:0.4`, `static` -> `static:4`), after checking a built-in
    stopper against the tree (`static:9` on a 4-deep tree is refused)."""
    import inspect
    import itertools

    kind, _, arg = method.partition(":")
    if kind in ("mcsd", "mcsd-target-init") and not arg:
        return f"{kind}:{','.join(map(str, k_config))}"
    if kind == "hf-generate":
        return f"{kind}:{explicit_label(arg, k_config)}"
    if kind not in BUILTIN:
        return method
    try:
        stopper = make_stopper(method, k_config)
    except MCSDError as err:
        raise MCSDError(f"method {method!r}: {err}") from None
    if kind == "static":
        return f"static:{stopper.depth or len(k_config)}"
    values = [getattr(stopper, p) for p in inspect.signature(type(stopper)).parameters]
    values = list(itertools.takewhile(lambda v: v is not None, values))
    return ":".join([kind, *(f"{v:g}" for v in values)])


def explicit_methods(methods: list[str], k_config: tuple[int, ...]) -> list[str]:
    """`explicit_label` of every method, refusing two that name the same run."""
    labels = [explicit_label(m, k_config) for m in methods]
    for label in set(labels):
        same = [m for m, lab in zip(methods, labels, strict=True) if lab == label]
        if len(same) > 1:
            raise MCSDError(f"--methods lists {' and '.join(map(repr, same))}, which run the same "
                            f"thing ({label}); keep one")
    return labels


def build_method(name: str, pair: Pair, base: DecodeConfig):
    """A runner with `.generate(ids) -> Record` for one method name."""
    check_method(name)
    kind, _, arg = name.partition(":")
    if name == "ar":
        return DecoderRunner(ARDecoder(pair, base))
    if kind in ("mcsd", "mcsd-target-init"):
        k = parse_k_config(arg) if arg else base.k_config
        init = "target" if kind == "mcsd-target-init" else "draft"
        return DecoderRunner(MCSDDecoder(pair, replace(base, k_config=k, init=init), "static"))
    if name in ("hf", "hf-assisted"):
        return HFGenerate(pair, base, assisted=name == "hf-assisted")
    if kind == "hf-generate":
        return HFCustomGenerate(pair, replace(base, init="draft"), arg)
    stopper = make_stopper(name)
    check_pair(stopper, pair)
    return DecoderRunner(MCSDDecoder(pair, replace(base, init="draft"), stopper))


def encode_prompt(pair: Pair, text: str, chat: bool) -> list[int]:
    tok = pair.tokenizer
    if tok is None:
        raise MCSDError("this pair has no tokenizer; pass a pair loaded from model folders")
    if chat and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                      add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    return tok(text)["input_ids"]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two outputs differ (a token against another, or against the
    end of the shorter one); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def top2_margin(model, ids: list[int]) -> float:
    """The gap between the two largest next-token logits after `ids`: one forward of `model`.
    A float32 near-tie (a gap near 0) lets two exact greedy decoders part ways there."""
    x = torch.tensor([ids], device=model.device)
    logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, -1].double()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def divergence(model, prompt: list[int], tokens: list[int], ref: list[int]) -> dict | None:
    """Where `tokens` first leaves `ref` (both greedy continuations of `prompt`) and the
    target's top-2 logit margin there; None when they are equal."""
    i = first_difference(tokens, ref)
    if i is None:
        return None
    at = [seq[i] if i < len(seq) else None for seq in (tokens, ref)]
    return {"position": i, "token": at[0], "reference_token": at[1],
            "top2_margin": top2_margin(model, prompt + tokens[:i])}


def mark_divergences(pair: Pair, records: list[Record], prompts: dict[str, list[int]]) -> None:
    """Greedy runs: give every lossless record that differs from `hf`'s its `hf_divergence`."""
    hf = {r.prompt_id: r.token_ids for r in records if r.method == "hf"}
    for r in records:
        if r.lossless and r.method != "hf" and r.prompt_id in hf:
            r.hf_divergence = divergence(pair.target, prompts[r.prompt_id], r.token_ids,
                                         hf[r.prompt_id])


def agreement(a: list[int], b: list[int]) -> float:
    """Share of positions (over the longer output) where two outputs carry the same token."""
    n = max(len(a), len(b))
    return sum(x == y for x, y in zip(a, b, strict=False)) / n if n else 1.0


def run_eval(pair: Pair, prompts, methods: list[str], base: DecodeConfig, chat: bool = False,
             progress: bool = True, batch_size: int = 1, batched: bool = False) -> list[Record]:
    """Run every method on every prompt (or batch of `batch_size` prompts), interleaved, after
    one warm-up generation each (`batched`: through `generate_batch` even at batch size 1,
    so that speed is over the decode phase as at larger batch sizes); then score every
    output's quality (`mcsd_runtime.evaluate.quality`)."""
    if not prompts:
        raise MCSDError("the prompt set is empty: pass a set or file with at least one prompt")
    check_batch_methods(methods, batch_size)
    runners = {m: build_method(m, pair, base) for m in methods}
    encoded = [(p.id, encode_prompt(pair, p.text, chat)) for p in prompts]
    records = run_runners(pair, runners, encoded, greedy=base.temperature == 0, progress=progress,
                          batch_size=batch_size, batched=batched)
    quality.annotate(pair.target, records, dict(encoded))  # after the timed runs
    return records


SINGLE_SEQUENCE = ("hf", "hf-assisted", "hf-generate", "mcsd-target-init")  # no batches


def check_batch_methods(methods: list[str], batch_size: int) -> None:
    """Refuse, at batch sizes above 1, the methods that decode one sequence at a time."""
    single = [m for m in methods if m.split(":", 1)[0] in SINGLE_SEQUENCE]
    if batch_size > 1 and single:
        raise MCSDError(f"--batch-size {batch_size}: {', '.join(single)} decode one sequence at "
                        f"a time (transformers' generate, or the lossy target-initialized "
                        f"mode); drop them from --methods or use --batch-size 1")


def run_runners(pair: Pair, runners: dict, encoded: list[tuple[str, list[int]]], greedy: bool,
                progress: bool = True, desc: str = "eval", batch_size: int = 1,
                batched: bool = False) -> list[Record]:
    """Runners (name -> `.generate(ids) -> Record`) on encoded prompts: one warm-up each, then
    prompt by prompt in a rotating order; greedy records are then compared with `hf`'s. With
    `batch_size` > 1, consecutive prompts are decoded `batch_size` at a time by every runner's
    `generate_batch`, batch by batch in a rotating order."""
    if batch_size > 1 or batched:
        return _run_batches(pair, runners, encoded, greedy, progress, desc, batch_size)
    from mcsd_runtime.progress import progress as progress_bar

    for runner in runners.values():  # warm-up
        runner.generate(encoded[0][1])
    records: list[Record] = []
    names = list(runners)
    bar = progress_bar(encoded, desc=desc, unit="prompt", disable=not progress)
    for i, (pid, ids) in enumerate(bar):
        for name in names[i % len(names):] + names[: i % len(names)]:
            rec = runners[name].generate(ids)
            rec.method, rec.prompt_id = name, pid
            records.append(rec)
        bar.set_postfix_str(f"{sum(r.new_tokens for r in records)} tokens")
    if greedy:
        mark_divergences(pair, records, dict(encoded))
    return records


def _run_batches(pair: Pair, runners: dict, encoded: list[tuple[str, list[int]]], greedy: bool,
                 progress: bool, desc: str, batch_size: int) -> list[Record]:
    from mcsd_runtime.progress import progress as progress_bar

    batches = [encoded[i : i + batch_size] for i in range(0, len(encoded), batch_size)]
    for runner in runners.values():  # warm-up
        runner.generate_batch([ids for _, ids in batches[0]])
    records: list[Record] = []
    names = list(runners)
    bar = progress_bar(total=len(encoded), desc=f"{desc} (batch size {batch_size})",
                       unit="prompt", disable=not progress)
    for i, batch in enumerate(batches):
        for name in names[i % len(names):] + names[: i % len(names)]:
            for (pid, _), rec in zip(batch, runners[name].generate_batch(
                    [ids for _, ids in batch]), strict=True):
                rec.method, rec.prompt_id, rec.batch_id = name, pid, f"batch{i:04d}"
                records.append(rec)
        bar.update(len(batch))
        bar.set_postfix_str(f"{sum(r.new_tokens for r in records)} tokens")
    bar.close()
    if greedy:
        mark_divergences(pair, records, dict(encoded))
    return records


def _quantile(xs: list[float], q: float) -> float:
    return float(torch.tensor(xs, dtype=torch.float64).quantile(q)) if xs else float("nan")


def _paired(recs: list[Record], ref: list[Record], greedy: bool) -> dict:
    """Against a reference method's records on the same prompts: the median per-unit speedup,
    and for greedy runs the share of equal outputs and the mean token agreement."""
    by_prompt = {r.prompt_id: r for r in ref}
    pairs = [(r, by_prompt[r.prompt_id]) for r in recs if r.prompt_id in by_prompt]
    if not pairs:
        return {"speedup": None, "equal_share": None, "agreement": None}
    mine, theirs = _tps_by_unit(recs), _tps_by_unit(ref)
    return {"speedup": statistics.median(mine[u] / theirs[u] for u in mine if u in theirs),
            "equal_share": (sum(r.token_ids == a.token_ids for r, a in pairs) / len(pairs)
                            if greedy else None),
            "agreement": (statistics.mean(agreement(r.token_ids, a.token_ids) for r, a in pairs)
                          if greedy else None)}


def decoder_twin(method: str, methods: list[str]) -> str | None:
    """`hf-generate:S`'s twin: the method that runs stopper S through MCSDDecoder directly."""
    kind, _, spec = method.partition(":")
    if kind != "hf-generate":
        return None
    for name in (spec, "mcsd" if spec == "static" else None):
        if name in methods:
            return name
    return None


def is_static(method: str) -> bool:
    """A static schedule: `mcsd[:K]` (draft-initialised) or the `static[:D]` stopper."""
    kind = method.split(":", 1)[0]
    return kind in ("mcsd", "static")


def _tps_by_unit(records: list[Record]) -> dict[str, float]:
    """Throughput per pairing unit: per prompt, or per batch (its records share one)."""
    return {r.unit: r.tokens_per_s for r in records}


def _geo(recs: list[Record], ref: list[Record]) -> dict:
    """Geometric mean of paired per-prompt speedups over `ref` with its 95% bootstrap CI."""
    mine, theirs = _tps_by_unit(recs), _tps_by_unit(ref)
    common = [p for p in mine if p in theirs]
    if not common:
        return {"geomean": None, "ci_low": None, "ci_high": None, "n": 0}
    return metrics.paired_speedup([mine[p] for p in common], [theirs[p] for p in common])


def _by_method(records: list[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for r in records:
        out.setdefault(r.method, []).append(r)
    return out


def best_static(records: list[Record]) -> str | None:
    """The static schedule of the run with the highest geometric-mean speedup over `ar` (over
    the slowest static one when `ar` did not run)."""
    by_method = _by_method(records)
    statics = [m for m in by_method if is_static(m)]
    if not statics:
        return None
    base = by_method.get("ar") or min((by_method[m] for m in statics),
                                      key=lambda rs: statistics.median(
                                          _tps_by_unit(rs).values()))
    return max(statics, key=lambda m: _geo(by_method[m], base)["geomean"] or 0.0)


def summarize(records: list[Record], greedy: bool, reference: str | None = None) -> list[dict]:
    """One row per method: the report's numbers, all derived from the per-prompt records.
    Speedups and output equality are paired per prompt against `ar` (our decoder's AR) and
    `hf` (the target's own generate()) when they ran; `hf-generate:S` is also paired with S.
    Every method also gets the geometric mean of its paired per-prompt speedups, with a 95%
    bootstrap CI, over `ar` and over `reference` (default: the run's best static schedule)."""
    by_method = _by_method(records)
    reference = reference or best_static(records)
    if reference is not None and reference not in by_method:
        raise MCSDError(f"reference method {reference!r} did not run: add it to --methods")
    rows = []
    for method, recs in by_method.items():
        tps = list(_tps_by_unit(recs).values())
        geo_ar = _geo(recs, by_method.get("ar", []))
        geo_ref = _geo(recs, by_method.get(reference, []))
        tokens = sum(r.new_tokens for r in recs)
        calls = sum(r.target_calls for r in recs)
        rates = [r.acceptance_rate for r in recs if r.acceptance_rate is not None]
        drafted = [r.drafted_tokens for r in recs]
        vs = {ref: _paired(recs, by_method.get(ref, []), greedy) for ref in ("ar", "hf")}
        diffs = [r.hf_divergence for r in recs if r.hf_divergence]
        twin = decoder_twin(method, list(by_method))
        rows.append({
            "method": method,
            "prompts": len(recs),
            "tokens_per_s_median": statistics.median(tps),
            "tokens_per_s_p25": _quantile(tps, 0.25),
            "tokens_per_s_p75": _quantile(tps, 0.75),
            "speedup_vs_ar": vs["ar"]["speedup"],
            "geomean_vs_ar": geo_ar["geomean"],
            "ci_vs_ar": [geo_ar["ci_low"], geo_ar["ci_high"]],
            "reference": reference,
            "geomean_vs_reference": geo_ref["geomean"],
            "ci_vs_reference": [geo_ref["ci_low"], geo_ref["ci_high"]],
            "speedup_vs_hf": vs["hf"]["speedup"],
            "tau": metrics.tau(tokens, calls) if calls else None,
            "acceptance_rate": statistics.mean(rates) if rates else None,
            "drafted_per_token": (sum(drafted) / tokens if tokens and None not in drafted
                                  else None),
            "target_calls": calls,
            "new_tokens": tokens,
            "lossless": all(r.lossless for r in recs),
            "ar_equal_share": vs["ar"]["equal_share"],
            "ar_agreement": vs["ar"]["agreement"],
            "hf_equal_share": vs["hf"]["equal_share"],
            "hf_agreement": vs["hf"]["agreement"],
            "hf_differences": len(diffs) if greedy and "hf" in by_method else None,
            "hf_min_margin": min((d["top2_margin"] for d in diffs), default=None),
            "decoder_twin": twin,
            "speedup_vs_twin": (_paired(recs, by_method[twin], greedy)["speedup"] if twin
                                else None),
        } | quality.summary(recs, by_method.get("ar")))
    return rows


def _fmt(v, pct: bool = False) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.1%}" if pct else f"{v:.2f}"
    return str(v)


def _ci(geomean: float | None, ci: list) -> str:
    if geomean is None or None in ci:
        return "–"
    return f"{geomean:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}]"


def markdown_table(rows: list[dict]) -> str:
    ref = next((r["reference"] for r in rows if r.get("reference")), None)
    head = ("| method | tok/s (median) | tok/s IQR | speedup vs AR | speedup vs hf | "
            f"vs AR, geomean [95% CI] | vs {ref or 'reference'}, geomean [95% CI] | τ | "
            "acceptance | drafted/token | target calls | lossless | AR-equal | hf-equal | "
            "AR agreement | NLL/token | NLL vs AR [95% CI] | target top-1 | repeated 4-grams | "
            "loops |")
    lines = [head, "|" + "---|" * 20]
    for r in rows:
        lines.append(
            f"| {r['method']} | {_fmt(r['tokens_per_s_median'])} | "
            f"{_fmt(r['tokens_per_s_p25'])}–{_fmt(r['tokens_per_s_p75'])} | "
            f"{_times(r['speedup_vs_ar'])} | {_times(r['speedup_vs_hf'])} | "
            f"{_ci(r['geomean_vs_ar'], r['ci_vs_ar'])} | "
            f"{_ci(r['geomean_vs_reference'], r['ci_vs_reference'])} | {_fmt(r['tau'])} | "
            f"{_fmt(r['acceptance_rate'], pct=True)} | {_fmt(r['drafted_per_token'])} | "
            f"{r['target_calls']} | {_fmt(r['lossless'])} | {_fmt(r['ar_equal_share'], pct=True)} "
            f"| {_fmt(r['hf_equal_share'], pct=True)} | {_fmt(r['ar_agreement'], pct=True)} | "
            f"{_nll(r.get('target_nll'))} | "
            f"{_delta(r.get('target_nll_vs_ar'), r.get('ci_target_nll_vs_ar'))} | "
            f"{_fmt(r.get('target_top1_share'), pct=True)} | "
            f"{_fmt(r.get('repeat4_share'), pct=True)} | {_fmt(r.get('loop_share'), pct=True)} |")
    return "\n".join(lines)


def short_table(rows: list[dict]) -> str:
    """The few columns a first look needs: tokens/s, speedups over AR and over the reference
    (geometric means of paired per-prompt ratios, 95% CI), τ, output equality with AR and the
    target's NLL per new token."""
    ref = next((r["reference"] for r in rows if r.get("reference")), None)
    head = ["method", "tok/s", "vs AR [95% CI]", f"vs {ref or 'reference'} [95% CI]", "τ",
            "= AR", "NLL/tok"]
    body = [[short_name(r["method"]), f"{r['tokens_per_s_median']:.1f}",
             _ci(r["geomean_vs_ar"], r["ci_vs_ar"]),
             _ci(r["geomean_vs_reference"], r["ci_vs_reference"]), _fmt(r["tau"]),
             _fmt(r["ar_equal_share"], pct=True), _nll(r.get("target_nll"))] for r in rows]
    return "\n".join("| " + " | ".join(cells) + " |"
                     for cells in [head, ["---"] * len(head), *body])


def _nll(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def _delta(v: float | None, ci: list | None) -> str:
    """A signed NLL difference with its CI: `+0.120 [+0.050, +0.190]`."""
    if v is None:
        return "–"
    if not ci or None in ci:
        return f"{v:+.3f}"
    return f"{v:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _times(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else _fmt(v)


def markdown_notes(rows: list[dict], records: list[Record]) -> str:
    """Below the table: where lossless outputs leave `hf`'s (with the target's top-2 logit
    margin there: a near-tie is numerics, a wide margin a bug), and `hf-generate`'s overhead."""
    lines = []
    for r in records:
        d = r.hf_divergence
        if d:
            lines.append(f"- {r.method}, prompt {r.prompt_id}: first differs from hf at new token "
                         f"{d['position']} ({d['token']} vs {d['reference_token']}); target "
                         f"top-2 logit margin there {d['top2_margin']:.3g}")
    for row in rows:
        if row["speedup_vs_twin"] is not None:
            lines.append(f"- {row['method']} runs at {row['speedup_vs_twin']:.3f}x the tokens/s "
                         f"of {row['decoder_twin']} (median paired ratio per prompt)")
    return "\n".join(lines)


def short_name(method: str) -> str:
    """`stopper:/long/path/lightgbm` -> `stopper:lightgbm`, for plot labels."""
    kind, _, arg = method.partition(":")
    return f"stopper:{Path(arg).name}" if kind == "stopper" else method


def plot(records: list[Record], rows: list[dict], out: Path, title: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    title = textwrap.fill(title, 80, break_on_hyphens=False)

    def save(fig, ax, name: str) -> None:
        ax.set_title(title, fontsize=8)
        ax.tick_params(labelsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120, bbox_inches="tight")
        files.append(name)
        plt.close(fig)

    named = [r for r in rows if r["geomean_vs_ar"] is not None and None not in r["ci_vs_ar"]]
    fig, ax = plt.subplots(figsize=(7, 1.5 + 0.3 * len(named)))
    geo = [r["geomean_vs_ar"] for r in named]
    err = [[g - r["ci_vs_ar"][0] for g, r in zip(geo, named, strict=True)],
           [r["ci_vs_ar"][1] - g for g, r in zip(geo, named, strict=True)]]
    ax.barh([short_name(r["method"]) for r in named], geo, xerr=err, color="tab:blue",
            error_kw={"lw": 1, "capsize": 2})
    ax.axvline(1.0, color="gray", lw=1)
    ax.invert_yaxis()
    ax.set_xlabel("speedup vs AR: geometric mean of per-prompt ratios, 95% CI")
    save(fig, ax, "speedup.png")

    methods = [r["method"] for r in rows if r["method"] not in ("ar", "hf", "hf-assisted")]
    fig, ax = plt.subplots(figsize=(7, 1.5 + 0.3 * len(methods)))
    data = [[metrics.tau(r.new_tokens, r.target_calls) for r in records if r.method == m]
            for m in methods]
    if methods:
        ax.boxplot(data, tick_labels=[short_name(m) for m in methods], vert=False)
        ax.invert_yaxis()
    ax.set_xlabel("τ per prompt (tokens / target call)")
    save(fig, ax, "tau.png")

    fig, ax = plt.subplots(figsize=(9, 4))
    for i, m in enumerate(methods):
        steps = [s for r in records if r.method == m for s in r.steps]
        depth = max((d for d, _ in steps), default=0)
        xs, ys = [], []
        for d in range(1, depth + 1):
            reached = [a for s, a in steps if s >= d and a >= d - 1]
            if reached:
                xs.append(d)
                ys.append(sum(a >= d for a in reached) / len(reached))
        ax.plot(xs, ys, label=short_name(m), **line_style(i))
    ax.set_xlabel("depth d")
    ax.set_ylabel("P(depth d accepted | d-1 accepted)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if methods:  # beside the axes, never over the data
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    save(fig, ax, "acceptance_by_depth.png")
    return files


def line_style(i: int) -> dict:
    """Colour, marker and dash of the i-th line: 10 distinct colours, then the same colours with
    other markers and dashes, so no two of up to 40 lines look alike."""
    import matplotlib

    colours = matplotlib.colormaps["tab10"].colors
    return {"color": colours[i % 10], "marker": "os^D"[i // 10 % 4],
            "linestyle": ("-", "--", "-.", ":")[i // 10 % 4], "markersize": 4}


def check_writable(out: Path) -> None:
    """Refuse an output folder that cannot be written, before any decoding; folders created
    for the check are removed again, so a run refused later leaves nothing behind."""
    created = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise MCSDError(f"cannot write to {out}: {err.strerror}; pass a writable --out") from None
    finally:
        for folder in created:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()


OUTPUTS = ("per_prompt.jsonl", "summary.json", "summary.csv", "summary.md", "report.md",
           "speedup.png", "tau.png", "acceptance_by_depth.png")


def write_outputs(records: list[Record], rows: list[dict], out: Path, settings: dict,
                  tokenizer=None, stoppers: list[dict] | None = None) -> list[str]:
    """Per-prompt JSONL (with the decoded text when a tokenizer is given), summary
    CSV/JSON/Markdown, plots and report.md, each written whole. Returns the files it replaced."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    replaced = [name for name in OUTPUTS if (out / name).exists()]

    def record(r: Record) -> dict:
        text = {"text": tokenizer.decode(r.token_ids)} if tokenizer is not None else {}
        return vars(r) | text | {"tokens_per_s": r.tokens_per_s}

    _atomic(out / "per_prompt.jsonl", "".join(json.dumps(record(r)) + "\n" for r in records))
    _atomic(out / "summary.json", json.dumps({"settings": settings, "methods": rows,
                                              "stoppers": stoppers or []}, indent=2))
    _atomic(out / "summary.csv", pd.DataFrame(rows).to_csv(index=False))
    table = markdown_table(rows)
    notes = markdown_notes(rows, records)
    table += f"\n\n{notes}" if notes else ""
    _atomic(out / "summary.md", table + "\n")
    title = (f"{short_model_name(settings['target'])} / {short_model_name(settings['draft'])} · "
             f"{settings['prompts']} x{settings['n_prompts']} · T={settings['temperature']} · "
             f"k={settings['k_config']} · {settings['max_new_tokens']} new tokens")
    files = plot(records, rows, out, title)
    report = [f"# Evaluation: {title}", "", short_table(rows), "", "## Every column", "", table,
              "", LEGEND]
    if stoppers:
        report += ["", "## The trained stoppers, offline (from their metrics.json)", "",
                   stopper_table(stoppers)]
    report += ["", "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]
    report += [f"![{f}]({f})" for f in files]
    _atomic(out / "report.md", "\n".join(report) + "\n")
    return replaced


LEGEND = """Columns: *tok/s* is the median over prompts of new tokens per second (*IQR*: its
25th-75th percentiles). *speedup vs AR* and *speedup vs hf* are medians of the per-prompt
ratios of tokens/s (paired: the same prompt, interleaved); *vs AR, geomean* and *vs REFERENCE,
geomean* are geometric means of the same paired ratios with a 95% bootstrap CI over prompts.
The two statistics differ when the ratios are skewed (a few prompts much faster or slower
than the rest); the reference (best static schedule) is chosen by the geometric mean, which
the short table shows. *τ*: committed tokens per target call. *acceptance*: per drafting step,
accepted / drafted depth, averaged. *drafted/token*: drafted tokens per committed token (–:
unknown, hf-assisted). *target calls*: target forwards over all prompts. *lossless*: the method
keeps the target's output distribution (mcsd-target-init does not). *AR-equal* / *hf-equal*
(greedy): share of prompts whose output equals ar's / hf's token for token; *AR agreement*:
mean share of positions carrying the same token. *NLL/token*: the target's negative
log-likelihood (nats, temperature 1) of the method's outputs given their prompts, per new
token over all of them (one teacher-forced forward per output after the timed runs; lossless
greedy outputs equal AR's, and so does their NLL); *NLL vs AR*: the mean over prompts of the
per-prompt difference from ar's, 95% bootstrap CI (positive: text the target finds less
likely). *target top-1*: share of new tokens that are the target's most likely token after the
text before them (100% for greedy lossless methods; below it, how often a lossy one overrode
the target). *repeated 4-grams*: mean share of an output's 4-grams already seen earlier in it;
*loops*: share of outputs where at least half are (read both against ar's: code repeats
legitimately)."""


def stopper_results(methods: list[str]) -> list[dict]:
    """Training results of the trained stoppers among `methods`, read from each folder's
    metrics.json (held-out AUCs, replayed speed against the best static depth and the oracle,
    the replay's end-to-end check); stoppers without one are left out."""
    out = []
    for m in methods:
        folder = _stopper_folder(m)
        path = folder / "metrics.json" if folder is not None else None
        if path is None or not path.is_file():
            continue
        try:
            metrics_ = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        head, test = metrics_.get("headline", {}), metrics_.get("metrics", {}).get("test", {})
        check = metrics_.get("replay_check") or {}
        out.append({"method": m, "model": metrics_.get("model"),
                    "roc_auc": test.get("roc_auc"), "pr_auc": test.get("pr_auc"),
                    "replay_vs_best_static": head.get("speedup_vs_best_static"),
                    "best_static": head.get("best_static"),
                    "oracle_gain_captured": head.get("oracle_gain_captured"),
                    "replay_units": head.get("units"),
                    "check_prompts": check.get("prompts"),
                    "check_max_error": check.get("max_abs_relative_error")})
    return out


def stopper_lines(stoppers: list[dict]) -> list[str]:
    """One line per trained stopper for the terminal (the table is in report.md)."""
    lines = []
    for s in stoppers:
        vs = s["replay_vs_best_static"]
        lines.append(f"{short_name(s['method'])} offline, on its collection's test prompts: "
                     f"ROC-AUC {_fmt(s['roc_auc'])}, replayed "
                     + (f"{vs:.3f}x {s['best_static']}" if vs is not None else "–")
                     + f", {_fmt(s['oracle_gain_captured'], pct=True)} of the oracle's gain")
    return lines


def stopper_table(stoppers: list[dict]) -> str:
    lines = ["| stopper | model | ROC-AUC | PR-AUC | replayed vs best static | oracle's gain "
             "captured | replay vs end to end, worst error |", "|---|---|---|---|---|---|---|"]
    for s in stoppers:
        vs = s["replay_vs_best_static"]
        vs = f"{vs:.3f}x ({s['best_static']}, {s['replay_units']})" if vs is not None else "–"
        check = (f"{s['check_max_error']:.1%} on {s['check_prompts']} prompts"
                 if s["check_max_error"] is not None else "not checked")
        lines.append(f"| {short_name(s['method'])} | {s['model']} | {_fmt(s['roc_auc'])} | "
                     f"{_fmt(s['pr_auc'])} | {vs} | {_fmt(s['oracle_gain_captured'], pct=True)} "
                     f"| {check} |")
    return "\n".join(lines + ["", "AUCs on the collection's test prompts; replayed figures "
                               "there too; the check decodes some of those prompts end to end "
                               "(after dividing out a common factor)."])


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
