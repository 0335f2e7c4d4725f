"""A reduced-vocabulary output head: the draft scores only a subset of the target's tokens.

A small draft's output head is a large share of its cost (SmolLM2's 49152 x 576 head is ~10 ms
of a one-token fp32 forward on one CPU thread). `ReducedHead` keeps only the rows of `N` tokens
(the most frequent in the target's own answers and text, plus its special tokens) and returns
full-vocabulary logits with every other token at the dtype's lowest finite value: its softmax
there is exactly 0, so the draft never proposes those tokens, speculative verification stays
exact (a token the draft gives probability 0 is never drafted, and the residual distribution
is the target's where the draft is 0), and entropies stay finite (0 * log 0 = 0 in `entr`).

On disk: `draft_vocab.safetensors` next to the draft's `config.json`, holding `ids` [N] (target
token ids, int64) and `rows` [N, d] (the head's weights). `attach_reduced_head(model, folder)`
swaps it in after `from_pretrained` and does nothing for a folder without that file.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mcsd_runtime.errors import MCSDError

HEAD_FILE = "draft_vocab.safetensors"


class ReducedHead(nn.Module):
    """Logits over `vocab_size` tokens from the weights of `ids` only (`rows`, [N, d]); every
    other token gets the dtype's lowest finite value (probability exactly 0 after softmax)."""

    def __init__(self, ids: torch.Tensor, rows: torch.Tensor, vocab_size: int):
        super().__init__()
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.ndim != 1 or rows.ndim != 2 or rows.shape[0] != ids.numel():
            raise MCSDError(f"a reduced head needs ids [N] and rows [N, d], got "
                            f"{tuple(ids.shape)} and {tuple(rows.shape)}")
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise MCSDError(f"reduced-head token ids must lie in [0, {vocab_size})")
        if torch.unique(ids).numel() != ids.numel():
            raise MCSDError("reduced-head token ids repeat")
        # the parameter is not named `weight`: transformers' weight tying must not replace it
        self.rows = nn.Parameter(rows.detach().clone())
        self.register_buffer("ids", ids.clone())
        self.vocab_size = int(vocab_size)

    def reduced(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the N kept tokens only ([..., N], in `ids` order)."""
        return F.linear(hidden, self.rows)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        small = self.reduced(hidden)
        out = small.new_full((*small.shape[:-1], self.vocab_size), torch.finfo(small.dtype).min)
        return out.index_copy_(-1, self.ids, small)

    def extra_repr(self) -> str:
        return f"{self.ids.numel()} of {self.vocab_size} tokens, d={self.rows.shape[1]}"


def reduced_head_from(model: nn.Module, ids: torch.Tensor) -> ReducedHead:
    """A reduced head over `ids` initialised from `model`'s own output head rows."""
    weight = model.get_output_embeddings().weight
    ids = torch.as_tensor(ids, dtype=torch.long)
    return ReducedHead(ids, weight.detach()[ids.to(weight.device)].float(),
                       model.config.vocab_size)


def save_reduced_head(head: ReducedHead, folder: str | Path) -> Path:
    """Write `head` as `folder/draft_vocab.safetensors`."""
    from safetensors.torch import save_file

    path = Path(folder) / HEAD_FILE
    save_file({"ids": head.ids.detach().cpu().contiguous(),
               "rows": head.rows.detach().float().cpu().contiguous()}, str(path),
              metadata={"vocab_size": str(head.vocab_size), "format": "mcsd-reduced-head"})
    return path


def load_reduced_head(folder: str | Path) -> ReducedHead | None:
    """The reduced head saved in `folder`, or None when it holds none."""
    from safetensors import safe_open

    path = Path(folder) / HEAD_FILE
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            ids, rows = f.get_tensor("ids"), f.get_tensor("rows")
        return ReducedHead(ids, rows, int(meta["vocab_size"]))
    except (OSError, KeyError, ValueError, RuntimeError) as err:
        raise MCSDError(f"the reduced head {path} is unreadable ({err}); rebuild the draft "
                        f"or delete the file") from None


def attach_reduced_head(model: nn.Module, name: str | Path) -> nn.Module:
    """`model` with its output head replaced by the reduced head saved in folder `name`, in the
    model's dtype and device; `model` unchanged when `name` is not a folder holding one."""
    folder = Path(str(name)).expanduser()
    if not folder.is_dir():
        return model
    head = load_reduced_head(folder)
    if head is None:
        return model
    if head.vocab_size != model.config.vocab_size or \
            head.rows.shape[1] != model.config.hidden_size:
        raise MCSDError(f"the reduced head in {folder} is for {head.vocab_size} tokens of width "
                        f"{head.rows.shape[1]}, the model has {model.config.vocab_size} of width "
                        f"{model.config.hidden_size}")
    old = model.get_output_embeddings()
    model.set_output_embeddings(head.to(device=old.weight.device, dtype=old.weight.dtype))
    return model


def head_of(model: nn.Module) -> ReducedHead | None:
    """The model's reduced head, if it has one."""
    head = model.get_output_embeddings()
    return head if isinstance(head, ReducedHead) else None


def pick_vocab(seqs, size: int, vocab_size: int, keep: list[int]) -> torch.Tensor:
    """The `size` token ids a reduced head keeps, sorted: `keep` (special and end tokens), then
    the tokens most often the target's greedy choice over `seqs` (Sequences), then those most
    often in its top-k lists, then the lowest ids."""
    if not len(keep) <= size <= vocab_size:
        raise MCSDError(f"a reduced head needs {len(keep)} to {vocab_size} tokens (the special "
                        f"tokens at least), got {size}")
    greedy = torch.zeros(vocab_size, dtype=torch.float64)
    listed = torch.zeros(vocab_size, dtype=torch.float64)
    for s in seqs:
        greedy.index_add_(0, s.top_ids[:, 0].long(), torch.ones(s.top_ids.shape[0],
                                                                dtype=torch.float64))
        flat = s.top_ids.reshape(-1).long()
        listed.index_add_(0, flat, torch.ones(flat.numel(), dtype=torch.float64))
    # lexicographic: greedy count, then top-k count, then lower id first
    score = greedy * 1e9 + listed - torch.arange(vocab_size, dtype=torch.float64) / vocab_size
    score[torch.as_tensor(keep, dtype=torch.long)] = float("inf")
    return score.topk(size).indices.sort().values
