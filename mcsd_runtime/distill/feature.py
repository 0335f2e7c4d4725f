"""A feature draft: one decoder layer that reads the target's own hidden states.

A draft cut from the target's layers (`layers.cut_draft`) sees tokens only. A feature draft
also reads, at each position p, the target's final hidden state (after its last norm, the
vector its output head reads) at position p - 1: its input is `fc([embed(x_p); h_{p-1}])`, one
decoder layer and a norm turn that into its guess at the target's hidden state at p, and the
head scores the next token from it. Where h_{p-1} is not known yet (a drafted token whose parent
the target has not verified), the draft's own guess at p - 1 stands in. The target computes
these states anyway when it verifies, so the draft costs one layer and its head, and reads what
the target already knows about the context.

On disk: a model of the target's kind (`save_pretrained`) plus `feature_fc.safetensors`
(the input projection) next to its `config.json`; `attach_feature_input(model, folder)` wraps a
loaded model in `FeatureDraft` when that file is there, as `head.attach_reduced_head` swaps in a
reduced head.

Training: `distill.feature_train`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from mcsd_runtime.backend.compat import cache_kwargs
from mcsd_runtime.errors import MCSDError

FC_FILE = "feature_fc.safetensors"


class FeatureDraft(nn.Module):
    """A causal LM `lm` whose input at each position is `fc([embed(token); prev_hidden])`.

    `forward` takes what a Hugging Face causal LM takes, plus `prev_hidden` [B, n, H] (zeros
    when absent); its `hidden_states` are `(state,)`: the normed state its head reads, which the
    decoder feeds back as the next position's `prev_hidden` while drafting. Every attribute it
    lacks is the wrapped model's (config, device, dtype, output embeddings, ...)."""

    is_feature_draft = True

    def __init__(self, lm: nn.Module, fc: nn.Linear) -> None:
        super().__init__()
        self.lm, self.fc = lm, fc

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.lm, name)

    def generate(self, *args, **kwargs):
        """Refused: `generate()` would run the wrapped model without the target's states."""
        raise MCSDError("a feature draft reads the target's states, which generate() does not "
                        "give it: decode with mcsd_runtime's MCSDDecoder")

    def inputs(self, input_ids: torch.Tensor, prev_hidden: torch.Tensor | None) -> torch.Tensor:
        emb = self.lm.get_input_embeddings()(input_ids)
        if prev_hidden is None:
            prev_hidden = torch.zeros_like(emb)
        return self.fc(torch.cat([emb, prev_hidden.to(emb.dtype)], -1))

    def states(self, input_ids: torch.Tensor, prev_hidden: torch.Tensor | None, **kw):
        """The base model's output (normed states in `last_hidden_state`)."""
        cache = kw.pop("cache", None)
        if cache is None:
            cache = kw.pop("past_key_values", None)
        else:
            kw.pop("past_key_values", None)
        base = self.lm.get_decoder() if hasattr(self.lm, "get_decoder") else self.lm.model
        if cache is not None:
            kw.update(cache_kwargs(base, cache))
        return base(inputs_embeds=self.inputs(input_ids, prev_hidden), **kw)

    def forward(self, input_ids: torch.Tensor, prev_hidden: torch.Tensor | None = None,
                logits_to_keep: int = 0, output_hidden_states: bool = False,
                **kw) -> CausalLMOutputWithPast:
        kw.pop("return_dict", None)
        out = self.states(input_ids, prev_hidden, **kw)
        state = out.last_hidden_state
        logits = self.lm.get_output_embeddings()(state[:, -logits_to_keep:])
        # the cache object is updated in place (the caller holds it); not returned
        return CausalLMOutputWithPast(logits=logits,
                                      hidden_states=(state,) if output_hidden_states else None)


def is_feature_draft(model: nn.Module) -> bool:
    return bool(getattr(model, "is_feature_draft", False))


def with_feature_input(draft: nn.Module) -> FeatureDraft:
    """`draft` (e.g. `layers.cut_draft`) wrapped to read the target's states too, with an
    input projection that starts by passing the embedding through: at first it is `draft`."""
    h = draft.config.hidden_size
    fc = nn.Linear(2 * h, h, bias=True)
    with torch.no_grad():
        fc.weight.normal_(0.0, 0.02 / (2 * h) ** 0.5)
        fc.weight[:, :h] += torch.eye(h)
        fc.bias.zero_()
    emb = draft.get_input_embeddings().weight
    return FeatureDraft(draft, fc.to(device=emb.device, dtype=emb.dtype))


def save_feature_draft(draft: FeatureDraft, folder: str | Path) -> None:
    """The wrapped model (`save_pretrained`) and `FC_FILE` into `folder`."""
    from safetensors.torch import save_file

    folder = Path(folder)
    draft.lm.save_pretrained(folder)
    save_file({"weight": draft.fc.weight.detach().cpu().contiguous(),
               "bias": draft.fc.bias.detach().cpu().contiguous()},
              str(folder / FC_FILE), metadata={"format": "mcsd-feature-input"})


def attach_feature_input(model: nn.Module, name: str | Path) -> nn.Module:
    """`model` wrapped in `FeatureDraft` with the input projection saved in folder `name`, in
    the model's dtype and device; `model` unchanged when `name` holds none."""
    from safetensors import safe_open

    path = Path(str(name)).expanduser() / FC_FILE
    if not path.is_file():
        return model
    try:
        with safe_open(str(path), framework="pt") as f:
            weight, bias = f.get_tensor("weight"), f.get_tensor("bias")
    except (OSError, KeyError, RuntimeError) as err:
        raise MCSDError(f"the feature input {path} is unreadable ({err}); rebuild the draft "
                        f"or delete the folder") from None
    h = model.config.hidden_size
    if tuple(weight.shape) != (h, 2 * h) or tuple(bias.shape) != (h,):
        raise MCSDError(f"the feature input {path} is for width {weight.shape[0]}, the model "
                        f"has {h}")
    fc = nn.Linear(2 * h, h, bias=True)
    with torch.no_grad():
        fc.weight.copy_(weight)
        fc.bias.copy_(bias)
    emb = model.get_input_embeddings().weight
    return FeatureDraft(model, fc.to(device=emb.device, dtype=emb.dtype))
