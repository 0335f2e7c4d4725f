"""Method runners: each turns a prompt's token ids into a `Record` (`.generate(ids)`, and for
our decoders `.generate_batch(batch)`): our decoders (`ar`, `mcsd[:K]`, a stopper), the
target's own `generate()` (`hf`, `hf-assisted`, `hf-static`) and our decoder inside it
(`hf-generate:S`).
`build_method` makes the runner of a method name."""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch

from mcsd_runtime import metrics
from mcsd_runtime.decisions.builtin import Planner, StopperOrPlanner, make_decision, make_stopper
from mcsd_runtime.decisions.learned import check_pair, training_temperatures
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, GenerationResult, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate.methods import (
    WIDTH,
    check_method,
    lookup_tree,
    parse_hf_static,
    parse_learned_lookup,
    parse_lookup,
)
from mcsd_runtime.evaluate.record import Record
from mcsd_runtime.models.pair import Pair
from mcsd_runtime.prompts.chat import encode_prompt as chat_encode
from mcsd_runtime.tree import parse_k_config


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


def static_cache_kwargs(compiled: bool, device) -> dict:
    """generate() arguments for a static cache, its one-token decode step compiled or not:
    transformers compiles it on its own on CUDA (`compile_config` or its default, "reduce-overhead"
    over the cache), and elsewhere only when told to."""
    kwargs = {"cache_implementation": "static"}
    if not compiled:
        return kwargs | {"disable_compile": True}
    if torch.device(device).type != "cuda":
        from transformers import CompileConfig

        config = CompileConfig()
        config._compile_all_devices = True  # transformers' switch for compiling off CUDA
        kwargs["compile_config"] = config
    return kwargs


class HFGenerate:
    """The target's own `generate()`, timed around the call, its forwards counted and timed with
    hooks: alone (`hf`, an AR reference sharing no mask or cache code with our decoder), with
    the draft as its assistant (`hf-assisted`, whose drafted token count is unknown), or alone
    on a static cache (`hf-static`; `compiled`: its decode step through torch.compile).

    generate() sizes a static cache to the prompt plus `max_new_tokens`, or to the largest it
    made for the model before if that is larger (transformers keeps it, to spare recompiles).
    Compiled, the first call at a cache size compiles or records the step, so each new size gets
    one untimed generate() first; and no hooks are put on the model (they would be traced into
    the graph and re-traced each call): target calls are then generate()'s one forward per new
    token, and forward time is not measured (0)."""

    lossless = True

    def __init__(self, pair: Pair, config: DecodeConfig, assisted: bool = False,
                 static: bool = False, compiled: bool = False) -> None:
        self.pair, self.config, self.assisted = pair, config, assisted
        self.compiled = static and compiled
        self.models = {"target": pair.target} | ({"draft": pair.draft} if assisted else {})
        self.cache_kwargs = static_cache_kwargs(compiled, pair.device) if static else {}
        self.warmed: set[int] = set()  # static cache sizes compiled for

    def _call(self, x: torch.Tensor) -> torch.Tensor:
        pair, cfg = self.pair, self.config
        kwargs = (hf_sampling_kwargs(cfg) | _eos_kwargs(cfg) | self.cache_kwargs
                  | ({"assistant_model": pair.draft} if self.assisted else {}))
        return pair.target.generate(x, attention_mask=torch.ones_like(x),
                                    max_new_tokens=cfg.max_new_tokens,
                                    pad_token_id=(pair.eos_token_ids or [0])[0], **kwargs)

    def _warm_up(self, x: torch.Tensor) -> None:
        """One untimed generate() at a static cache size not compiled for yet (the size
        transformers will give it: the prompt and the new tokens less the last one, or the
        largest it made before)."""
        size = max(x.shape[1] + self.config.max_new_tokens - 1,
                   getattr(self.pair.target, "_previous_max_cache_length", -1))
        if size not in self.warmed:
            self._call(x)
            self.warmed.add(size)

    @torch.inference_mode()
    def generate(self, ids: list[int]) -> Record:
        pair, cfg = self.pair, self.config
        x = torch.tensor([ids], device=pair.device)
        eos = list(pair.eos_token_ids if cfg.eos_token_ids is None else cfg.eos_token_ids)
        if self.compiled:
            self._warm_up(x)
        torch.manual_seed(cfg.seed)
        with (ForwardMeter({} if self.compiled else self.models) as meter,
              _quiet_transformers(self.assisted)):
            t0 = time.perf_counter()
            out = self._call(x)
            wall = time.perf_counter() - t0
        generated = out[0, len(ids):].tolist()
        new = clip_at_eos(generated, eos)
        target_calls = len(generated) if self.compiled else meter.calls["target"]
        unknown = None if self.assisted else 0
        return Record("", "", new, len(new), wall, target_calls, meter.calls.get("draft", 0),
                      unknown, unknown, None, True, [], forward_time=meter.seconds)


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
    """Our decoder behind transformers' `generate()`, as
    `custom_generate=mcsd_runtime.integrations.hf.generate` (`hf-generate:STOPPER`), timed
    around the call like `hf`: its overhead against the same stopper run through `MCSDDecoder`
    directly."""

    lossless = True

    def __init__(self, pair: Pair, config: DecodeConfig, stopper: str) -> None:
        check_pair(make_stopper(stopper), pair)  # refuse a bad spec before any decoding
        self.pair, self.config, self.stopper = pair, config, stopper

    @torch.inference_mode()
    def generate(self, ids: list[int]) -> Record:
        from mcsd_runtime.integrations.hf import generate as mcsd_generate

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
                  forward_time=s.target_time + s.draft_time, prefill_time=s.prefill_time)


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
    if (look := parse_lookup(name)) is not None:
        return lookup_runner(pair, base, *look)
    if (learned := parse_learned_lookup(name)) is not None:
        return learned_lookup_runner(pair, base, *learned)
    if kind == WIDTH:
        decision, width = decision_and_width(name, pair, base.temperature)
        return DecoderRunner(decoder_for(pair, replace(base, init="draft"), decision, width=width))
    if name in ("hf", "hf-assisted"):
        if name == "hf-assisted" and getattr(pair.draft, "is_feature_draft", False):
            raise MCSDError("hf-assisted runs the draft inside transformers' generate(), which "
                            "does not hand it the target's states: a feature draft cannot be its "
                            "assistant; drop hf-assisted or use a draft built without --features")
        return HFGenerate(pair, base, assisted=name == "hf-assisted")
    if (mode := parse_hf_static(name)) is not None:
        compiled = mode == "compile" or (mode == "auto" and
                                         torch.device(pair.device).type == "cuda")
        if compiled:
            print(f"{name}: the target's decode step is compiled (torch.compile) over a static "
                  f"cache; one untimed generate() at each new cache size comes before the timed "
                  f"ones", flush=True)
        return HFGenerate(pair, base, static=True, compiled=compiled)
    if kind == "hf-generate":
        return HFCustomGenerate(pair, replace(base, init="draft"), arg)
    decision = make_decision(name)
    check_pair(decision, pair)
    warn_temperature(decision, base.temperature, name)
    return DecoderRunner(decoder_for(pair, replace(base, init="draft"), decision))


def decoder_for(pair: Pair, config: DecodeConfig, decision: StopperOrPlanner,
                **kwargs) -> MCSDDecoder:
    """An `MCSDDecoder` with `decision` where it belongs: a planner (a verification budget) as
    its planner, a stopper as its stopper."""
    if isinstance(decision, Planner):
        return MCSDDecoder(pair, config, planner=decision, **kwargs)
    return MCSDDecoder(pair, config, decision, **kwargs)


def warn_temperature(stopper, temperature: float, name: str) -> None:
    """Warn (once per process) when a trained stopper's collections were decoded at another
    temperature than `temperature`: acceptance under sampling differs from greedy, so its
    scores are off there."""
    trained = training_temperatures(getattr(stopper, "spec", None))
    if trained:
        _warn_temperature_once(f"{name} was trained on collections decoded at", trained,
                               temperature, "acceptance", f"collect at --temperature "
                               f"{temperature:g} and train a stopper on that collection")


def _warn_once(message: str, stacklevel: int = 3) -> None:
    """`message` as a warning, once per process."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, UserWarning, stacklevel=stacklevel)


_WARNED: set[str] = set()


def _warn_temperature_once(who: str, trained: list[float], temperature: float, estimates: str,
                           fix: str) -> None:
    """One warning per process that something fitted at the `trained` temperatures decodes at
    `temperature`, unless they agree."""
    if trained != [temperature]:
        _warn_once(f"{who} temperature {', '.join(f'{t:g}' for t in trained)} and decodes at "
                   f"{temperature:g}: still lossless, but its {estimates} estimates are off "
                   f"({fix})", stacklevel=4)


def decision_and_width(spec: str | None, pair: Pair, temperature: float = 0.0):
    """The stopper or budget a spec names and the learned width it verifies with: `width:PATH`
    is the first depth (`static:1`) cut to the width PATH chooses
    (`mcsd_runtime.decisions.width`); any other spec its decision at full width (None: the
    target alone)."""
    from mcsd_runtime.decisions.width import WidthPolicy, parse_width

    if (folder := parse_width(spec)) is not None:
        width = WidthPolicy.load(folder)
        _warn_temperature_once(f"{folder} was calibrated on outputs at", [width.temperature],
                               temperature, "hit-chance", "its calibration is greedy")
        return make_stopper("static:1"), width
    decision = make_decision(spec or "none")
    check_pair(decision, pair)
    return decision, None


def lookup_runner(pair: Pair, base: DecodeConfig, k: int | None, n: int,
                  spec: str | None) -> DecoderRunner:
    """Prompt lookup (`lookup[:K[:N]][+STOPPER]`): a chain of K copied tokens where the context
    repeats itself, else STOPPER's step on --k-config, or the target alone (`none`) on a chain
    of K depths."""
    k, tree = lookup_tree(k, spec, base.k_config)
    decision, width = decision_and_width(spec, pair, base.temperature)
    cfg = replace(base, k_config=tree, init="draft", lookup=k, lookup_min_ngram=n)
    return DecoderRunner(decoder_for(pair, cfg, decision, width=width))


def learned_lookup_runner(pair: Pair, base: DecodeConfig, folder: Path,
                          spec: str | None = None) -> DecoderRunner:
    """A learned copy length (`lookup-learned:PATH[+STOPPER]`): where the context repeats
    itself it copies as many tokens as it chooses, else (or choosing none) the target decodes
    alone, or STOPPER drafts on --k-config."""
    from mcsd_runtime.decisions.copy_length import CopyLength

    policy = CopyLength.load(folder)
    _warn_temperature_once(f"{folder} was trained on outputs at", [policy.temperature],
                           base.temperature, "survival", f"retrain with `mcsd train --decision "
                           f"copy --temperature {base.temperature:g}`")
    if spec is not None and policy.draft_tree is not None and (
            parse_k_config(policy.draft_tree) != parse_k_config(base.k_config)):
        _warn_once(f"{folder} was trained beside the draft tree {policy.draft_tree} and decodes "
                   f"on {parse_k_config(base.k_config)}: still lossless, but it prices a "
                   f"drafted step as that tree's first depth (retrain with `mcsd train --decision "
                   f"copy` on this --k-config)")
    return DecoderRunner(learned_lookup_decoder(pair, base, policy, spec))


def learned_lookup_decoder(pair: Pair, base: DecodeConfig, policy,
                           spec: str | None = None) -> MCSDDecoder:
    """The decoder of a copy length `policy` (`CopyLength`) on `base`'s budget and sampling:
    alone, on a chain of its longest copy; composed with the stopper `spec`, on `base`'s tree."""
    k = policy.max_copy
    tree = (1,) * k if spec is None else base.k_config
    cfg = replace(base, k_config=tree, init="draft", lookup=k,
                  lookup_min_ngram=policy.min_ngram, lookup_max_ngram=policy.max_ngram)
    decision, width = decision_and_width(spec, pair, base.temperature)
    return decoder_for(pair, cfg, decision, copy_length=policy, width=width)


def encode_prompt(pair: Pair, prompt, chat: str = "auto") -> list[int]:
    """The token ids of `prompt` (a Prompt, or a str: a text prompt) for this pair under the
    `--chat` setting (`mcsd_runtime.prompts.chat`)."""
    return chat_encode(prompt, pair.tokenizer, chat)
