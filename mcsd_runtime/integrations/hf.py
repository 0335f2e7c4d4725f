"""MCSD inside Hugging Face `generate()`, as a `custom_generate` decoding loop.

    from mcsd_runtime.integrations.hf import generate as mcsd_generate
    out = target.generate(**tok(prompt, return_tensors="pt"), custom_generate=mcsd_generate,
                          draft_model=draft, k_config=(4, 2, 2, 1), stopper="heuristic",
                          max_new_tokens=200, do_sample=False)

transformers prepares the inputs, the generation config and the stopping criteria, then calls
`generate` below, which runs `MCSDDecoder` (the decoder of `mcsd eval`) and returns what
`generate()` returns: the prompt plus the new tokens, or a `GenerateDecoderOnlyOutput` with
`return_dict_in_generate=True` (whose `mcsd` field holds the decoder's steps and statistics).

Honoured: `max_new_tokens` / `max_length`, `eos_token_id` (one or several), `do_sample` with
`temperature`, stopping criteria (`max_time`, `StopStringCriteria`, your own: checked after each
committed token, as `generate()` does, the output cut where one fires), a streamer (fed each
step's tokens after `generate()` has fed it the prompt) and `return_dict_in_generate`.
Refused with a message: batches and padding, beams, anything that reshapes the target's
distribution (top-k, top-p, repetition penalty, other logits processors), which the draft side
of speculative verification cannot reproduce, and pairs whose vocabularies differ.
"""

from __future__ import annotations

import functools
import inspect
import sys
import weakref
from dataclasses import dataclass

import torch
from transformers import AutoTokenizer, GenerationMixin
from transformers.generation import (
    EosTokenCriteria,
    GenerateDecoderOnlyOutput,
    MaxLengthCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
)

from mcsd_runtime.constants import DEFAULT_K_CONFIG
from mcsd_runtime.decisions.artifact import description_file
from mcsd_runtime.decisions.builtin import Stopper, make_stopper, parse_stopper_spec
from mcsd_runtime.decisions.learned import check_pair
from mcsd_runtime.decode.decoder import DecodeConfig, GenerationResult, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.pair import Pair, check_same_vocab

_HINTS = {"TopKLogitsWarper": "pass top_k=0 (the generation config's default is 50)",
          "TopPLogitsWarper": "pass top_p=1.0"}


@dataclass
class MCSDGenerateOutput(GenerateDecoderOnlyOutput):
    """`generate()`'s output with `return_dict_in_generate=True`, plus the decoder's result
    (`mcsd.steps`, `mcsd.stats`: τ, target and draft calls, drafted and accepted tokens)."""

    mcsd: GenerationResult | None = None


def generate(model, input_ids: torch.LongTensor, logits_processor=None, stopping_criteria=None,
             generation_config=None, draft_model=None, k_config=DEFAULT_K_CONFIG,
             stopper: str | Stopper = "static", verify: str = "mcss", streamer=None,
             **model_kwargs) -> torch.LongTensor | MCSDGenerateOutput:
    """The decoding loop `generate(custom_generate=generate, draft_model=..., ...)` calls.

    `draft_model`: a causal LM with the target's vocabulary, on its device and dtype;
    `k_config`: children per depth of the drafted tree; `stopper`: a stopper spec as in
    `mcsd eval` (`static`, `heuristic`, `confidence:0.4`, `stopper:PATH`, ...) or a Stopper;
    `verify`: the sampling verifier (`mcss`, `mcss-replacement`, `naive`).
    """
    cfg = generation_config
    _check_config(cfg, logits_processor or [])
    _check_inputs(model, input_ids, model_kwargs)
    pair = _pair(model, draft_model)
    prompt = input_ids[0].tolist()
    max_length, eos, others = _split_criteria(stopping_criteria or [], cfg)
    if max_length <= len(prompt):
        raise MCSDError(f"max_length ({max_length}) leaves no room after the prompt "
                        f"({len(prompt)} tokens): pass max_new_tokens")
    temperature = float(cfg.temperature) if cfg.do_sample else 0.0
    config = DecodeConfig(k_config=k_config, temperature=temperature, verify=verify,
                          max_new_tokens=max_length - len(prompt), eos_token_ids=tuple(eos))
    stop = _stopper(stopper)
    check_pair(stop, pair)
    decoder = MCSDDecoder(pair, config, stop)
    streamer = streamer if streamer is not None else _generate_argument("streamer")
    seed = int(torch.randint(0, 2**62, (1,))) if temperature else 0  # torch.manual_seed applies
    result = decoder.generate(prompt, seed=seed,
                              on_commit=_commit_hook(prompt, others, streamer, input_ids.device))
    if streamer is not None:
        streamer.end()
    new = torch.tensor([result.token_ids], dtype=input_ids.dtype, device=input_ids.device)
    sequences = torch.cat([input_ids, new], dim=1)
    if cfg.return_dict_in_generate:
        return MCSDGenerateOutput(sequences=sequences, mcsd=result)
    return sequences


mcsd_generate = generate


def _check_inputs(model, input_ids: torch.Tensor, model_kwargs: dict) -> None:
    if model.config.is_encoder_decoder:
        raise MCSDError("MCSD generate() works with decoder-only models, not encoder-decoders")
    if model_kwargs.get("inputs_embeds") is not None:
        raise MCSDError("MCSD generate() takes input_ids, not inputs_embeds")
    if input_ids.shape[0] != 1:
        raise MCSDError(f"MCSD generate() decodes one sequence at a time, got a batch of "
                        f"{input_ids.shape[0]} (num_return_sequences or several prompts): "
                        f"call it once per prompt")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise MCSDError("the attention_mask masks some prompt tokens: pass the prompt without "
                        "padding (batch size 1)")
    for name in ("past_key_values", "cache"):  # `cache` from transformers 5.24
        cache = model_kwargs.get(name)
        if cache is not None and cache.get_seq_length():
            raise MCSDError("MCSD generate() starts from an empty cache: do not pass "
                            "past_key_values (or cache)")


def _check_config(cfg, logits_processor) -> None:
    if cfg.num_beams > 1:
        raise MCSDError(f"num_beams={cfg.num_beams}: MCSD decodes greedily or by sampling; "
                        f"pass num_beams=1")
    if cfg.return_dict_in_generate and (cfg.output_scores or cfg.output_logits or
                                        cfg.output_attentions or cfg.output_hidden_states):
        raise MCSDError("MCSD generate() returns sequences only: drop output_scores, "
                        "output_logits, output_attentions and output_hidden_states")
    for proc in logits_processor:
        if isinstance(proc, TemperatureLogitsWarper) and cfg.do_sample:
            continue  # MCSD samples both models at the temperature
        name = type(proc).__name__
        raise MCSDError(f"{name} reshapes the target's distribution, which speculative "
                        f"verification cannot reproduce on the draft's side: "
                        f"{_HINTS.get(name, 'remove it (logits_processor or generation config)')}")


# target -> (draft, fingerprint) of the last pair checked: weak, so models can be freed
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _pair(target, draft) -> Pair:
    """The pair, refused like `load_pair` refuses it: vocabulary sizes, and the tokenizers'
    token-to-id maps and special tokens where both models' folders (or hub caches) have one.
    Checked once per (target, draft); the result is remembered."""
    if draft is None:
        raise MCSDError("pass the draft model: generate(..., custom_generate=mcsd_generate, "
                        "draft_model=draft)")
    if draft.device != target.device or draft.dtype != target.dtype:
        raise MCSDError(f"the draft is on {draft.device} in {draft.dtype}, the target on "
                        f"{target.device} in {target.dtype}: load both on one device, one dtype")
    names = {"target_name": target.name_or_path or "target",
             "draft_name": draft.name_or_path or "draft"}
    known = _CHECKED.get(target)
    if known is None or known[0]() is not draft:
        t_tok, d_tok = _tokenizer(target.name_or_path), _tokenizer(draft.name_or_path)
        if t_tok is not None and d_tok is not None:
            check_same_vocab(t_tok, d_tok, names["target_name"], names["draft_name"])
        known = (weakref.ref(draft), Pair(target, draft, t_tok, **names).fingerprint)
        _CHECKED[target] = known
    return Pair(target, draft, **names, fingerprint=known[1])


@functools.lru_cache(maxsize=16)
def _tokenizer(name: str):
    """The tokenizer saved with a model, if its folder or the hub cache has one (no download)."""
    if not name:
        return None
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError):
        return None


def _stopper(spec: str | Stopper) -> Stopper:
    """`make_stopper`, with trained artifacts loaded once (again when stopper.json changes)."""
    if not isinstance(spec, str):
        return make_stopper(spec)
    parsed = parse_stopper_spec(spec)
    if parsed.folder is None:
        return make_stopper(spec)
    try:
        stamp = description_file(parsed.folder).stat().st_mtime_ns
    except (OSError, MCSDError):
        stamp = None
    return _learned_stopper(spec, stamp)


@functools.lru_cache(maxsize=8)
def _learned_stopper(spec: str, stamp: int | None) -> Stopper:
    return make_stopper(spec)


def _split_criteria(criteria, cfg) -> tuple[int, set[int], StoppingCriteriaList]:
    """The maximum length and EOS ids (which the decoder applies itself) and the other criteria
    (checked after each committed token)."""
    max_length, eos, others = cfg.max_length, set(), StoppingCriteriaList()
    for c in criteria:
        if isinstance(c, MaxLengthCriteria):
            max_length = min(max_length, c.max_length)
        elif isinstance(c, EosTokenCriteria):
            eos |= set(c.eos_token_id.view(-1).tolist())
        else:
            others.append(c)
    return max_length, eos, others


def _commit_hook(prompt: list[int], criteria: StoppingCriteriaList, streamer, device):
    """The decoder's `on_commit`: stopping criteria after each token, then the streamer."""
    seq = list(prompt)

    def on_commit(tokens: list[int]) -> int | None:
        keep = None
        for i in range(len(tokens) if criteria else 0):
            ids = torch.tensor([seq + tokens[: i + 1]], device=device)
            if bool(criteria(ids, None).any()):
                keep = i + 1
                break
        kept = tokens[:keep]
        seq.extend(kept)
        if streamer is not None:
            streamer.put(torch.tensor(kept))
        return keep

    return on_commit


def _generate_argument(name: str):
    """An argument of the `GenerationMixin.generate` call that called us. transformers 5 passes
    a callable `custom_generate` neither the streamer nor the tokenizer, so the streamer is read
    from that call's frame (None when called some other way)."""
    code = inspect.unwrap(GenerationMixin.generate).__code__  # under its decorators
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return None
        if frame.f_code is code:
            return frame.f_locals.get(name)
        frame = frame.f_back
    return None
