"""Loading a target/draft pair of Hugging Face causal LMs that share one vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from mcsd_runtime.backend.device import pick_device, pick_dtype
from mcsd_runtime.backend.fingerprint import config_hash, tokenizer_hash
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.attention import NAME as ATTENTION
from mcsd_runtime.models.attention import check_attention


def check_same_vocab(target_tok, draft_tok, target_name: str = "target",
                     draft_name: str = "draft") -> None:
    """Raise MCSDError naming the first difference between two tokenizers' vocabularies."""
    if len(target_tok) != len(draft_tok):
        raise MCSDError(
            f"vocabularies differ in size: {target_name} has {len(target_tok)} tokens, "
            f"{draft_name} has {len(draft_tok)}; choose a draft trained with the target's tokenizer"
        )
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        diff = sorted(set(tv.items()) ^ set(dv.items()))[:3]
        raise MCSDError(
            f"vocabularies differ in their token-to-id map (e.g. {diff}); "
            f"choose a draft trained with the target's tokenizer"
        )
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        if a != b:
            raise MCSDError(
                f"special tokens differ: {attr} is {a} for {target_name} and {b} for "
                f"{draft_name}; set the same special tokens on both tokenizers"
            )


def check_model_vocab(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise MCSDError(
            f"vocabularies differ in size: target model has {tv} output tokens, draft has {dv}; "
            f"choose a draft with the target's vocabulary"
        )


@dataclass
class Pair:
    """A target and a draft model on one device, with their shared tokenizer (optional)."""

    target: PreTrainedModel
    draft: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None = None
    target_name: str = "target"
    draft_name: str = "draft"
    fingerprint: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_model_vocab(self.target, self.draft)
        self.target.eval()
        self.draft.eval()
        if not self.fingerprint:
            self.fingerprint = {
                "target": self.target_name,
                "draft": self.draft_name,
                "target_config": config_hash(self.target),
                "draft_config": config_hash(self.draft),
                "tokenizer": tokenizer_hash(self.tokenizer) if self.tokenizer else None,
            }

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def dtype(self) -> torch.dtype:
        return self.target.dtype

    @property
    def vocab_size(self) -> int:
        return self.target.config.vocab_size

    @property
    def max_positions(self) -> int:
        return min(
            getattr(m.config, "max_position_embeddings", 1 << 30) for m in (self.target, self.draft)
        )

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.target.generation_config.eos_token_id
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return []
        return list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.count("/") > 1


DISTILL = "distill"  # as draft: the draft distilled from the target (mcsd_runtime.distill)


def distill_recipe(name: str | None) -> str | None:
    """The distillation recipe a draft name asks for (`distill` -> default, `distill:features`
    -> features), None for any other name; an unknown recipe is refused."""
    if name is None or (name != DISTILL and not name.startswith(DISTILL + ":")):
        return None
    recipe = name.partition(":")[2] or "default"
    if recipe == "default":
        return recipe
    from mcsd_runtime.distill.recipe import PRESETS

    if recipe not in PRESETS:
        raise MCSDError(f"unknown distillation recipe in draft {name!r}: use {DISTILL} (the "
                        f"default recipe) or {DISTILL}:RECIPE with one of {', '.join(PRESETS)}")
    return recipe


def pair_names(target: str | Path, draft: str | Path | None = None,
               build: bool = False) -> tuple[str, str]:
    """The target and draft to load for `load_pair(target, draft)`.

    - A toy spec (`toy`, `toy:PRESET`, `toy:PRESET:SEED`) names the embedded pair's folders
      and brings its own draft; `toy-draft:NAME` as draft is an extra draft distilled from the
      toy target (`mcsd toy draft --list`).
    - A named real model (`smollm2`, `models.named`) resolves to its converted GGUF folder or
      its hub name, and brings the draft distilled for it.
    - A `.gguf` file, or a folder holding exactly one, is converted once into the cache
      (`models.gguf`), as target or as draft.
    - `distill` as draft is the draft distilled from the target, and `distill:RECIPE` the one
      of another recipe (`distill:features`).
    - Any other name is a folder or hub name; such a target needs a draft.

    What takes minutes to build (a distilled draft: tens of minutes on a CPU; the default toy
    pair and its extra drafts) is built only if `build`, saying so on stderr; otherwise a name
    of one not built yet raises MCSDError naming the command that builds it. The tiny toy pair
    and its draft, built in seconds, are built on first use either way.

    A local-looking path that does not exist, a missing GGUF file, or a toy draft that is not
    the toy target's, is refused before anything is built, converted or loaded."""
    from mcsd_runtime.backend.named import is_named
    from mcsd_runtime.toy import is_toy_spec
    from mcsd_runtime.toy.spec import is_draft_spec

    target, draft = str(target), None if draft is None else str(draft)
    if draft is not None and is_draft_spec(draft):
        from mcsd_runtime.toy.drafts import resolve_draft

        return resolve_draft(draft, target, build=build)
    _check_exist(target, draft)
    toy_draft = _toy_draft(target, draft)
    if is_toy_spec(target):
        from mcsd_runtime.toy.build import resolve_toy

        toy_target, toy_draft_dir = resolve_toy(target, build=build)
        if draft is None or toy_draft:
            return toy_target, toy_draft_dir
        target = toy_target
    elif draft is None and not is_named(target):
        raise MCSDError(f"a draft model is required with target {target!r} (only the toy pair "
                        f"and smollm2 bring their own): pass --draft (a folder, hub name, .gguf "
                        f"file, or {DISTILL} for a draft distilled from the target), or "
                        f"load_pair(target, draft)")
    else:
        target = _real_model(target)
    recipe = distill_recipe(draft)
    if draft is None or recipe:
        return target, _distilled_draft(target, recipe or "default", build)
    return target, _real_model(draft)


def target_folder(target: str | Path, build: bool = False) -> str:
    """The folder (or hub name) of `target` alone, as `pair_names` resolves it, without its
    draft: what a runtime that brings its own drafting (vLLM) loads. The default toy pair is
    built only if `build`."""
    from mcsd_runtime.toy import is_toy_spec

    target = str(target)
    _check_exist(target, None)
    if is_toy_spec(target):
        from mcsd_runtime.toy.build import resolve_toy

        return resolve_toy(target, build=build)[0]
    return _real_model(target)


def _check_exist(target: str, draft: str | None) -> None:
    """Refuse a missing GGUF file, or a local-looking path that does not exist, as target or
    draft (distilled drafts and named models are resolved later)."""
    from mcsd_runtime.backend.gguf import find_gguf, is_gguf_spec
    from mcsd_runtime.backend.named import is_named

    for role, name in (("target", target), ("draft", draft)):
        if name is None or distill_recipe(name) or is_named(name):
            continue
        if is_gguf_spec(name):
            find_gguf(name)
        elif _looks_like_path(name) and not Path(name).expanduser().exists():
            raise MCSDError(f"no model folder at {name} (the {role}): pass an existing folder "
                            f"written by save_pretrained, a .gguf file, a hub name such as "
                            f"JackFram/llama-68m, smollm2, or toy / toy:tiny for the embedded "
                            f"pair")


def _toy_draft(target: str, draft: str | None) -> bool:
    """Whether `draft` is a toy pair's spec; MCSDError unless `target` is that same pair."""
    from mcsd_runtime.toy import is_toy_spec, parse_toy_spec

    toy_draft = draft is not None and is_toy_spec(draft)
    if toy_draft and not (is_toy_spec(target) and parse_toy_spec(draft) == parse_toy_spec(target)):
        raise MCSDError(
            f"draft {draft!r} is the toy pair's draft, which goes with its own target: pass the "
            f"target {draft!r} alone (e.g. --target {draft}, or load_pair({draft!r}))")
    return toy_draft


def _real_model(name: str) -> str:
    """A named model or GGUF file as the folder (or hub name) to load; other names as they are."""
    from mcsd_runtime.backend.gguf import gguf_model_dir, is_gguf_spec
    from mcsd_runtime.backend.named import is_named, resolve_named

    if is_named(name):
        return resolve_named(name)
    return str(gguf_model_dir(name)) if is_gguf_spec(name) else name


def _distilled_draft(target: str, recipe: str, build: bool) -> str:
    """The draft of `recipe` distilled from `target` (`mcsd_runtime.distill`), built first if
    missing and `build`."""
    from mcsd_runtime.distill.cache import default_draft_dir

    return str(default_draft_dir(target, build=build, recipe=recipe))


def _load_tokenizer(name: str):
    if _looks_like_path(name) and not Path(name).expanduser().is_dir():
        raise MCSDError(f"no model folder at {name}: pass an existing folder written by "
                        f"save_pretrained, or a hub name such as JackFram/llama-68m")
    try:
        return AutoTokenizer.from_pretrained(name)
    except OSError as err:
        raise MCSDError(
            f"cannot load the tokenizer of {name!r}: {err}. Pass a local model folder or a hub "
            f"name reachable from this machine (or toy / toy:tiny for the embedded pair)"
        ) from None


def _load_model(name: str, device: torch.device, dtype: torch.dtype | str, attn: str):
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Loading weights" bars on every command are noise
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, attn_implementation=attn)
    except OSError as err:
        raise MCSDError(
            f"cannot load model {name!r}: {err}. Pass a local model folder or a hub name "
            f"reachable from this machine"
        ) from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    from mcsd_runtime.distill.feature import attach_feature_input
    from mcsd_runtime.distill.head import attach_reduced_head

    model = attach_reduced_head(model, name)  # a distilled draft's reduced head, if it has one
    model = attach_feature_input(model, name)  # a feature draft's input projection, if it has one
    return model.to(device)


def load_pair(target: str | Path, draft: str | Path | None = None, device: str = "auto",
              dtype: str | torch.dtype = "auto", attn_implementation: str = ATTENTION,
              build: bool = False) -> Pair:
    """Load a target/draft pair, refusing mismatched vocabularies before any weights are loaded.

    `target` and `draft` are hub names, local folders or `.gguf` files; `load_pair("toy:tiny")`
    is the tiny embedded toy pair, built on first use (in seconds) into the user cache
    (`mcsd_runtime.paths`), and `load_pair("toy")` the default one; `load_pair("smollm2")` is
    SmolLM2-135M-Instruct with its distilled draft (`pair_names` says how every name resolves).
    `attn_implementation`: a name transformers knows, or `mcsd_sdpa` (the default: `sdpa` with
    grouped-query heads packed under tree masks, `models.attention`).

    `build`: build what the names need and is not built yet (a distilled draft, the default
    toy pair: minutes to tens of minutes, said on stderr). Without it a library call never
    starts such a build: a pair not built yet raises MCSDError naming the command that builds
    it (`mcsd draft distill --target T --recipe R`, `mcsd toy build`).

    `dtype`: `auto` (the default) keeps the target checkpoint's own dtype, as transformers'
    `dtype="auto"` does (its config's dtype, else its weights'), and loads the draft in that
    dtype too: a pair runs in one dtype. A name (fp32, bf16, fp16, ...) or a torch.dtype casts
    both: bf16 on a CPU with native bf16 matmuls is such a choice (the commands make it for
    their `--dtype auto`: `models.device.command_dtype`)."""
    check_attention(attn_implementation)
    target, draft = pair_names(target, draft, build)
    t_tok, d_tok = _load_tokenizer(target), _load_tokenizer(draft)
    check_same_vocab(t_tok, d_tok, target, draft)
    dev = pick_device(device)
    dt = "auto" if dtype == "auto" else pick_dtype(dtype, dev)
    t_model = _load_model(target, dev, dt, attn_implementation)
    d_model = _load_model(draft, dev, t_model.dtype, attn_implementation)
    return Pair(t_model, d_model, t_tok, target_name=target, draft_name=draft)


NO_DRAFT = "none"  # draft_name of a pair loaded for methods that draft nothing


def load_target(target: str | Path, device: str = "auto", dtype: str | torch.dtype = "auto",
                attn_implementation: str = ATTENTION, build: bool = False) -> Pair:
    """A pair of `target` alone, for methods that draft nothing (AR, generate(), prompt lookup
    alone): its draft is the target itself, named `NO_DRAFT`, so that no draft is built or
    loaded (a distilled draft takes minutes to tens of minutes to build)."""
    check_attention(attn_implementation)
    name = target_folder(target, build=build)
    dev = pick_device(device)
    dt = "auto" if dtype == "auto" else pick_dtype(dtype, dev)
    model = _load_model(name, dev, dt, attn_implementation)
    return Pair(model, model, _load_tokenizer(name), target_name=name, draft_name=NO_DRAFT)
