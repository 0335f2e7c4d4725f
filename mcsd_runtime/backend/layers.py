"""A draft cut from its target: the target's embeddings, final norm and some of its layers.

Works for any decoder whose model holds `model.embed_tokens`, `model.layers` and `model.norm`
(Llama, Mistral, Qwen2 and their kin in transformers).
"""

from __future__ import annotations

import copy

import torch

from mcsd_runtime.errors import MCSDError

# Per-layer config lists that follow the layers (a cut draft keeps its layers' entries).
PER_LAYER_CONFIG = ("layer_types",)


def target_layer_indices(target_layers: int, draft_layers: int) -> list[int]:
    """`draft_layers` of `target_layers` evenly spaced from the first to the last (one: the
    first)."""
    if not 0 < draft_layers <= target_layers:
        raise MCSDError(f"a draft initialised from the target's layers needs 1 to "
                        f"{target_layers} layers, got {draft_layers}")
    if draft_layers == 1:
        return [0]
    step = (target_layers - 1) / (draft_layers - 1)
    return [round(i * step) for i in range(draft_layers)]


def check_layer_ids(layer_ids: list[int] | tuple[int, ...], target_layers: int) -> list[int]:
    """`layer_ids` as a list of layer numbers (a negative id counts from the end: -1 is the
    last layer), refused unless strictly increasing within the target's layers."""
    given = [int(i) for i in layer_ids]
    ids = [i + target_layers if i < 0 else i for i in given]
    if not ids or any(i < 0 or i >= target_layers for i in ids):
        raise MCSDError(f"layer ids must lie in 0..{target_layers - 1} or -{target_layers}..-1 "
                        f"(the target has {target_layers} layers), got {given}")
    if any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
        raise MCSDError(f"layer ids must be strictly increasing, got {ids}")
    return ids


@torch.no_grad()
def copy_target_layers(target: torch.nn.Module, draft: torch.nn.Module,
                       picked: list[int] | None = None) -> list[int]:
    """Copy the target's embeddings, final norm and layers `picked` (default: evenly spaced,
    as many as the draft has) into `draft` (same width, heads and MLP size); returns the target
    layers copied."""
    tc, dc = target.config, draft.config
    for key in ("hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "vocab_size"):
        if getattr(tc, key) != getattr(dc, key):
            raise MCSDError(f"a draft initialised from the target's layers needs the target's "
                            f"{key} ({getattr(tc, key)}), got {getattr(dc, key)}; use "
                            f"init='random' or the target's width")
    if picked is None:
        picked = target_layer_indices(tc.num_hidden_layers, dc.num_hidden_layers)
    if len(picked) != dc.num_hidden_layers:
        raise MCSDError(f"{len(picked)} target layers for a draft of {dc.num_hidden_layers}")
    draft.model.embed_tokens.load_state_dict(target.model.embed_tokens.state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    for mine, theirs in zip(draft.model.layers, picked, strict=True):
        mine.load_state_dict(target.model.layers[theirs].state_dict())
    if not dc.tie_word_embeddings:
        draft.lm_head.load_state_dict(target.lm_head.state_dict())
    return picked


def cut_draft(target: torch.nn.Module, layer_ids: list[int]) -> torch.nn.Module:
    """A new model of the target's class and config, with only the target layers `layer_ids`
    (copied, with the embeddings, final norm and output head), in float32."""
    from transformers import AutoModelForCausalLM

    ids = check_layer_ids(layer_ids, target.config.num_hidden_layers)
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(ids)
    for key in PER_LAYER_CONFIG:
        values = getattr(config, key, None)
        if isinstance(values, list) and len(values) == target.config.num_hidden_layers:
            setattr(config, key, [values[i] for i in ids])
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    copy_target_layers(target, draft, ids)
    return draft.eval()
