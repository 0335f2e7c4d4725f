"""Distilling a draft from its target's stored top-k distributions (the target is not run).

Sequences are packed into rows of `seq_len` tokens, each sequence attending only to itself (a
block-diagonal causal mask, positions restarting per sequence), so the draft sees exactly the
context the target scored. The loss, at every trained position: cross-entropy to the target's
top-k distribution (renormalised over the tokens the draft's head has) plus `ce_weight` times
the cross-entropy of the target's greedy token. Lightning owns the loop (`toy.training._fit`).
"""

from __future__ import annotations

import warnings

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from mcsd_runtime.distill.data import Sequence
from mcsd_runtime.distill.head import ReducedHead


def pack(seqs: list[Sequence], seq_len: int, pad_id: int, top_k: int) -> dict[str, torch.Tensor]:
    """Sequences packed first-fit (longest first) into rows of `seq_len` tokens; a sequence
    longer than a row keeps its first `seq_len` tokens. Returns stacked tensors: `input_ids`,
    `position_ids`, `segment` (0 on padding, then 1, 2, ... per sequence) [R, L], `trained`
    [R, L] (position p holds the target's distribution of token p + 1), `top_ids` (int32) and
    `top_logp` (float16) [R, L, k]."""
    order = sorted(range(len(seqs)), key=lambda i: -min(seqs[i].tokens.numel(), seq_len))
    rows: list[list[Sequence]] = []
    room: list[int] = []
    for i in order:
        n = min(seqs[i].tokens.numel(), seq_len)
        for r, free in enumerate(room):
            if free >= n:
                rows[r].append(seqs[i])
                room[r] -= n
                break
        else:
            rows.append([seqs[i]])
            room.append(seq_len - n)
    count = len(rows)
    out = {"input_ids": torch.full((count, seq_len), pad_id, dtype=torch.long),
           "position_ids": torch.zeros((count, seq_len), dtype=torch.long),
           "segment": torch.zeros((count, seq_len), dtype=torch.long),
           "trained": torch.zeros((count, seq_len), dtype=torch.bool),
           "top_ids": torch.zeros((count, seq_len, top_k), dtype=torch.int32),
           "top_logp": torch.zeros((count, seq_len, top_k), dtype=torch.float16)}
    for r, members in enumerate(rows):
        at = 0
        for s_no, s in enumerate(members, 1):
            n = min(s.tokens.numel(), seq_len)
            out["input_ids"][r, at : at + n] = s.tokens[:n]
            out["position_ids"][r, at : at + n] = torch.arange(n)
            out["segment"][r, at : at + n] = s_no
            m = n - s.start  # trained positions kept: start - 1 .. n - 2
            if m > 0:
                lo = at + s.start - 1
                out["trained"][r, lo : lo + m] = True
                out["top_ids"][r, lo : lo + m] = s.top_ids[:m, :top_k]
                out["top_logp"][r, lo : lo + m] = s.top_logp[:m, :top_k]
            at += n
    return out


def block_mask(segment: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive [B, 1, L, L] mask: a token sees the earlier tokens of its own sequence (a
    padding token sees itself only)."""
    same = segment[:, :, None] == segment[:, None, :]
    length = segment.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment.device).tril()
    eye = torch.eye(length, dtype=torch.bool, device=segment.device)
    allowed = (same & causal) & (segment[:, :, None] > 0) | eye
    mask = torch.zeros(allowed.shape, dtype=dtype, device=segment.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


class PackedRows(Dataset):
    """`count` items drawn from packed rows, epoch after epoch, each epoch in a seeded order."""

    def __init__(self, packed: dict[str, torch.Tensor], count: int, seed: int):
        self.packed, self.count = packed, count
        rows = packed["input_ids"].shape[0]
        gen = torch.Generator().manual_seed(seed)
        epochs = -(-count // rows)
        self.order = torch.cat([torch.randperm(rows, generator=gen) for _ in range(epochs)])

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        r = int(self.order[i])
        return {k: v[r] for k, v in self.packed.items()}


def head_logits(draft, head: ReducedHead | None, hidden: torch.Tensor) -> torch.Tensor:
    """Logits over the draft's own vocabulary: the reduced head's N tokens or the full head's."""
    return head.reduced(hidden) if head is not None else draft.get_output_embeddings()(hidden)


def lookup_table(head: ReducedHead | None, vocab_size: int) -> torch.Tensor | None:
    """[V] map from a target id to its index in the reduced head (-1 where absent)."""
    if head is None:
        return None
    lut = torch.full((vocab_size,), -1, dtype=torch.long)
    lut[head.ids] = torch.arange(head.ids.numel())
    return lut


def distill_losses(logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor,
                   lut: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(soft cross-entropy, greedy-token cross-entropy, sparse KL) at M positions, each a mean:
    `logits` [M, N] over the draft's vocabulary, the target's top-k [M, k]. Target tokens the
    draft's head lacks are dropped and the rest renormalised."""
    idx = top_ids.long()
    if lut is not None:
        idx = lut.to(idx.device)[idx]
    valid = idx >= 0
    logq = F.log_softmax(logits.float(), -1).gather(-1, idx.clamp(min=0))
    logp = top_logp.float().masked_fill(~valid, float("-inf"))
    keep = valid.any(-1)
    logp = torch.log_softmax(logp[keep], -1)
    p = logp.exp()
    lq = logq[keep]
    soft = -(p * lq.masked_fill(~valid[keep], 0.0)).sum(-1).mean()
    kl = (p * (logp.masked_fill(~valid[keep], 0.0) - lq.masked_fill(~valid[keep], 0.0))
          ).sum(-1).mean()
    greedy_ok = valid[:, 0]
    ce = -logq[greedy_ok, 0].mean() if greedy_ok.any() else soft.new_zeros(())
    return soft, ce, kl


def forward_trained(draft, head: ReducedHead | None, batch: dict[str, torch.Tensor]
                    ) -> torch.Tensor:
    """The draft's logits (its own vocabulary) at the batch's trained positions, [M, N]."""
    dtype = next(draft.parameters()).dtype
    out = draft.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                      attention_mask=block_mask(batch["segment"], dtype), use_cache=False)
    hidden = out.last_hidden_state[batch["trained"]]
    return head_logits(draft, head, hidden)


class DistillModule(pl.LightningModule):
    """The draft (and its reduced head, if any) trained on stored target distributions."""

    def __init__(self, draft, head: ReducedHead | None, *, steps: int, lr: float,
                 warmup_frac: float, ce_weight: float, train_embeddings: bool):
        super().__init__()
        self.draft, self.head = draft, head
        self.steps, self.lr, self.warmup_frac = steps, lr, warmup_frac
        self.ce_weight = ce_weight
        self.draft.model.embed_tokens.requires_grad_(train_embeddings)
        if head is None and not train_embeddings:
            self.draft.get_output_embeddings().requires_grad_(False)
        lut = lookup_table(head, draft.config.vocab_size)
        self.lut = lut

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = forward_trained(self.draft, self.head, batch)
        trained = batch["trained"]
        soft, ce, kl = distill_losses(logits, batch["top_ids"][trained],
                                      batch["top_logp"][trained], self.lut)
        self.log_dict({"kl": kl.detach(), "draft_ce": ce.detach()}, prog_bar=True,
                      on_step=True, logger=False)
        return soft + self.ce_weight * ce

    def configure_optimizers(self):
        from mcsd_runtime.toy.training import _warmup_cosine

        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.lr, betas=(0.9, 0.95), weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine(self.steps,
                                                                      self.warmup_frac))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def distill(draft, head: ReducedHead | None, seqs: list[Sequence], recipe, pad_id: int,
            progress: bool = True, device: torch.device | None = None) -> float:
    """Train `draft` (and `head`) in place on `seqs` as `recipe` says, on `device` (default the
    CPU); returns seconds."""
    from mcsd_runtime.toy.training import _fit, _quiet_lightning

    recipe = recipe.resolved()
    if recipe.steps == 0 or not seqs:
        return 0.0
    _quiet_lightning()
    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")
    pl.seed_everything(recipe.seed, workers=True, verbose=False)
    packed = pack(seqs, recipe.seq_len, pad_id, recipe.top_k)
    data = PackedRows(packed, recipe.steps * recipe.batch_size, recipe.seed + 1)
    module = DistillModule(draft.train(), head, steps=recipe.steps, lr=recipe.lr,
                           warmup_frac=recipe.warmup_frac, ce_weight=recipe.ce_weight,
                           train_embeddings=recipe.train_embeddings)
    seconds = _fit(module, data, recipe.batch_size, recipe.steps, recipe.precision, progress,
                   f"distilling the draft ({recipe.steps} steps, {packed['input_ids'].shape[0]} "
                   f"rows of {recipe.seq_len})", device=device)
    draft.requires_grad_(True).eval()
    if head is not None:
        head.eval()
    return seconds
