"""Prompt lookup's chain (`mcsd_runtime.lookup` finds it) as the draft layers the engine
verifies."""

from __future__ import annotations

import torch

from mcsd_runtime.decode.step_state import DraftLayer


def chain_layers(tokens: torch.Tensor, vocab_size: int) -> list[DraftLayer]:
    """One depth per proposed token (`tokens` [n] on the device), each proposed by a one-hot
    float32 distribution (q(x) = 1, as the verifiers read it)."""
    n = tokens.shape[0]
    one_hot = torch.zeros(n, vocab_size, dtype=torch.float32, device=tokens.device)
    one_hot.scatter_(1, tokens[:, None], 1.0)
    ones, zeros = one_hot.new_ones(1), one_hot.new_zeros(1)
    return [DraftLayer(tokens[i : i + 1], one_hot[i : i + 1], None, ones, zeros, None)
            for i in range(n)]
