"""Training a feature draft (`distill.feature`) on its target's stored distributions and states.

Teacher-forced on the target's stored top-k distributions (as the cut draft, `distill.train`)
and on its final states (`target_features`, computed once per build): the same losses as the cut
draft's, plus a smooth-L1 pull of the draft's state toward the target's, plus a second pass whose
inputs are the draft's own states from the first (what it reads at depth 2 and beyond).
"""

from __future__ import annotations

import time

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from mcsd_runtime.distill.feature import FeatureDraft
from mcsd_runtime.distill.train import (
    DistillModule,
    block_mask,
    distill_losses,
    head_logits,
    pack,
)


def shifted(states: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Each position's previous state within its sequence (zeros where a sequence starts)."""
    prev = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], 1)
    return prev.masked_fill((position_ids == 0)[..., None], 0.0)


@torch.no_grad()
def target_features(target: nn.Module, packed: dict[str, torch.Tensor], batch: int = 8,
                    dtype: torch.dtype = torch.bfloat16, bar=None) -> torch.Tensor:
    """The target's final normed hidden state at every position of the packed rows
    (`train.pack`), [R, L, H] in `dtype`, each sequence attending to itself only."""
    rows = packed["input_ids"].shape[0]
    model_dtype = next(target.parameters()).dtype
    dev = next(target.parameters()).device
    out = torch.empty(rows, packed["input_ids"].shape[1], target.config.hidden_size,
                      dtype=dtype)
    base = target.get_decoder()
    for r in range(0, rows, batch):
        sl = slice(r, r + batch)
        mask = block_mask(packed["segment"][sl].to(dev), model_dtype)
        h = base(input_ids=packed["input_ids"][sl].to(dev),
                 position_ids=packed["position_ids"][sl].to(dev), attention_mask=mask,
                 use_cache=False).last_hidden_state
        out[sl] = h.to("cpu", dtype)
        if bar is not None:
            bar.update(min(batch, rows - r))
    return out


def feature_losses(draft: FeatureDraft, head, batch: dict[str, torch.Tensor], lut,
                   reg_weight: float, second_weight: float, ce_weight: float
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The training loss on one batch of packed rows with their target `feats`, and its parts."""
    dtype = next(draft.parameters()).dtype
    mask = block_mask(batch["segment"], dtype)
    pos, trained = batch["position_ids"], batch["trained"]
    feats = batch["feats"].to(dtype)
    real = batch["segment"] > 0

    def run(prev):
        return draft.states(batch["input_ids"], prev, position_ids=pos, attention_mask=mask,
                            use_cache=False).last_hidden_state

    def dist(state):
        logits = head_logits(draft, head, state[trained])
        return distill_losses(logits, batch["top_ids"][trained], batch["top_logp"][trained], lut)

    state = run(shifted(feats, pos))
    soft, ce, kl = dist(state)
    reg = F.smooth_l1_loss(state[real].float(), feats[real].float())
    loss = soft + ce_weight * ce + reg_weight * reg
    parts = {"kl": kl.detach(), "reg": reg.detach()}
    if second_weight:
        soft2, ce2, kl2 = dist(run(shifted(state, pos)))
        loss = loss + second_weight * (soft2 + ce_weight * ce2)
        parts["kl2"] = kl2.detach()
    return loss, parts


class FeatureRows(torch.utils.data.Dataset):
    """Packed rows (`train.PackedRows`) with the target's states of each row as `feats`."""

    def __init__(self, rows, feats: torch.Tensor) -> None:
        self.rows, self.feats = rows, feats

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {**self.rows[i], "feats": self.feats[int(self.rows.order[i])]}


class FeatureDistillModule(DistillModule):
    """A feature draft (and its reduced head) trained on the target's stored distributions and
    states (`feature_losses`); the embeddings stay the target's."""

    def __init__(self, draft: FeatureDraft, head, *, steps: int, lr: float,
                 warmup_frac: float, ce_weight: float, reg_weight: float = 0.5,
                 second_weight: float = 0.5) -> None:
        super().__init__(draft, head, steps=steps, lr=lr, warmup_frac=warmup_frac,
                         ce_weight=ce_weight, train_embeddings=False)
        self.reg_weight, self.second_weight = reg_weight, second_weight

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, parts = feature_losses(self.draft, self.head, batch, self.lut, self.reg_weight,
                                     self.second_weight, self.ce_weight)
        self.log_dict(parts, prog_bar=True, on_step=True, logger=False)
        return loss


@torch.inference_mode()
def feature_agreement(draft: FeatureDraft, target: nn.Module, seqs, seq_len: int, pad_id: int,
                      batch: int = 8) -> dict:
    """Held-out greedy agreement of a feature draft with the target, teacher-forced: `top1`
    reads the target's state at p - 1 (depth 1 of a decode step), `top1_own` the draft's own
    state there (what depth 2 and beyond read)."""
    if not seqs:
        return {"top1": None, "top4": None, "top1_own": None, "positions": 0}
    packed = pack(seqs, seq_len, pad_id, seqs[0].top_ids.shape[1])
    feats = target_features(target, packed, batch, dtype=next(draft.parameters()).dtype)
    dtype = next(draft.parameters()).dtype
    hits = hits4 = own = count = 0
    for i in range(0, packed["input_ids"].shape[0], batch):
        rows = {key: v[i : i + batch] for key, v in packed.items()}
        pos, trained = rows["position_ids"], rows["trained"]
        mask = block_mask(rows["segment"], dtype)
        want = rows["top_ids"][trained][:, 0].long()
        out = draft(input_ids=rows["input_ids"], prev_hidden=shifted(feats[i : i + batch], pos),
                    position_ids=pos, attention_mask=mask, use_cache=False,
                    output_hidden_states=True)
        logits = out.logits[trained]
        hits += int((logits.argmax(-1) == want).sum())
        hits4 += int((logits.topk(4, -1).indices == want[:, None]).any(-1).sum())
        again = draft(input_ids=rows["input_ids"], prev_hidden=shifted(out.hidden_states[0], pos),
                      position_ids=pos, attention_mask=mask, use_cache=False)
        own += int((again.logits[trained].argmax(-1) == want).sum())
        count += int(trained.sum())
    return {"top1": round(hits / count, 4), "top4": round(hits4 / count, 4),
            "top1_own": round(own / count, 4), "positions": count}


def distill_features(draft: FeatureDraft, head, target: nn.Module, seqs, recipe, pad_id: int,
                     progress: bool = True, device: torch.device | None = None) -> float:
    """Train `draft` (and `head`) in place on `seqs` and the target's states over them, as
    `recipe` says, on `device` (default the CPU); returns seconds (the states included). The
    states come from the target in the dtype it decodes in there (`models.device.pick_dtype`)."""
    import copy
    import warnings

    from mcsd_runtime.backend.device import pick_dtype
    from mcsd_runtime.distill.train import PackedRows
    from mcsd_runtime.progress import progress as bar_of
    from mcsd_runtime.toy.training import _fit, _quiet_lightning

    recipe = recipe.resolved()
    if recipe.steps == 0 or not seqs:
        return 0.0
    start = time.perf_counter()
    _quiet_lightning()
    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")
    pl.seed_everything(recipe.seed, workers=True, verbose=False)
    packed = pack(seqs, recipe.seq_len, pad_id, recipe.top_k)
    dev = device or torch.device("cpu")
    scorer = copy.deepcopy(target).to(dev, pick_dtype("auto", dev)).eval()
    rows = packed["input_ids"].shape[0]
    with bar_of(total=rows, desc="target states", unit="row", disable=not progress) as bar:
        feats = target_features(scorer, packed, bar=bar)
    del scorer
    data = FeatureRows(PackedRows(packed, recipe.steps * recipe.batch_size, recipe.seed + 1),
                       feats)
    module = FeatureDistillModule(draft.train(), head, steps=recipe.steps, lr=recipe.lr,
                                  warmup_frac=recipe.warmup_frac, ce_weight=recipe.ce_weight)
    _fit(module, data, recipe.batch_size, recipe.steps, recipe.precision, progress,
         f"distilling the feature draft ({recipe.steps} steps, {rows} rows of "
         f"{recipe.seq_len})", device=device)
    draft.eval()
    if head is not None:
        head.eval()
    return time.perf_counter() - start
