"""`mcsd_sdpa`: transformers' SDPA attention, with grouped-query heads packed under a tree mask.

transformers' `sdpa` attention repeats every key/value head for each query head that shares it
(`repeat_kv`) whenever a step has more than one new token and a mask, which is every tree
verification: a copy of the whole cache per layer and step, then an attention over three times
the heads. It packs the query heads of a key/value head into one head only for a single new token
(`pack_gqa`). This function packs them for more new tokens too when the mask is one for all
heads (the decoder's 4D tree masks are): queries [B, H, n, D] become [B, H_kv, g * n, D] and the
mask [B, 1, n, L] is tiled g times, so attention reads each cached key once. The arithmetic is
the same, per query row, as after `repeat_kv`: SmolLM2-135M's logits in bf16 on a CPU came out
identical, and its verification forward over 5-9 tokens took 0-5% less time after 200 cached
tokens, 5-7% less after 400 and 11-15% after 800-1600 (`mcsd attention-bench`). On other
devices, and for calls it does not cover (one new token, no mask, a per-head mask, no grouped
heads, attention bias or soft-capping), it is `sdpa` itself.

It also serves the engine's ragged forwards (`mcsd_runtime.decode.ragged`): every row's new
tokens packed into one sequence, put back into their rows for attention.

`load_pair` loads models with it by default (`attn_implementation="mcsd_sdpa"`); `register()`
makes the name known to transformers, once per process.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from mcsd_runtime.errors import MCSDError

NAME = "mcsd_sdpa"
_registered = False


def packed_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, attention_mask: torch.Tensor | None,
                        dropout: float = 0.0, scaling: float | None = None, ragged=None,
                        **kwargs):
    """transformers' attention-function signature: (output [B, n, H, D], None). With a
    `ragged` layout (`mcsd_runtime.decode.ragged`) the queries [1, H, total, D] go back into
    their rows' grid for attention and the output is packed again ([1, total, H, D])."""
    if ragged is not None:
        out, _ = packed_sdpa_forward(module, ragged.unpack_heads(query), key, value,
                                     attention_mask, dropout, scaling, **kwargs)
        return ragged.pack(out), None
    groups = getattr(module, "num_key_value_groups", 1)
    if (groups == 1 or query.shape[2] == 1 or attention_mask is None or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1 or query.device.type != "cpu" or dropout
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    b, heads, n, dim = query.shape
    packed = query.reshape(b, heads // groups, groups * n, dim)  # heads h*g+j -> rows j*n+i
    mask = attention_mask.repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask,
                                                           scale=scaling)
    return out.reshape(out.shape[0], heads, n, value.shape[-1]).transpose(1, 2).contiguous(), None


def check_attention(name: str) -> str:
    """`name` if transformers knows it as an attention implementation (after `register`), else
    MCSDError naming the known ones."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    register()
    known = ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]
    if name not in known and name.removeprefix("paged|") not in known:
        raise MCSDError(f"unknown attention implementation {name!r}: use one of "
                        f"{', '.join(k for k in known if '|' not in k)}")
    return name


def register() -> str:
    """Make `mcsd_sdpa` an attention implementation transformers can load models with (its
    masks are `sdpa`'s); returns the name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(NAME, packed_sdpa_forward)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        _registered = True
    return NAME
