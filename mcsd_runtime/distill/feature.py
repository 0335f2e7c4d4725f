"""A feature draft: one decoder layer that reads the target's own hidden states.

A draft cut from the target's layers (`layers.cut_draft`) sees tokens only. A feature draft
also reads, at each position p, the target's final hidden state (after its last norm, the
vector its output head reads) at position p - 1: its input is `fc([embed(x_p); h_{p-1}])`, one
decoder layer and a norm turn that into its guess at the target's hidden state at p, and the
head scores the next token from it. Where h_{p-1} is not known yet (a drafted token whose parent
the target has not verified), the draft's own guess at p - 1 stands in. The target computes
these states anyway when it verifies, so the draft costs one layer and its head, and reads what
the target already knows about the context.

On disk: a one-layer model of the target's kind (`save_pretrained`) plus `feature_fc.safetensors`
(the input projection) next to its `config.json`; `attach_feature_input(model, folder)` wraps a
loaded model in `FeatureDraft` when that file is there, as `head.attach_reduced_head` swaps in a
reduced head.

Training (`FeatureDistillModule`): teacher-forced on the target's stored top-k distributions
and its hidden states (`target_features`), with the same losses as the cut draft's, plus a
smooth-L1 pull of the draft's state toward the target's, plus a second pass whose inputs are
the draft's own states from the first (what it reads at depth 2 and beyond).
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.compat import cache_kwargs

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


def feature_draft_from(target: nn.Module, layer: int | None = None) -> FeatureDraft:
    """A feature draft of one decoder layer shaped like the target's: the target's embeddings,
    final norm and output head, its layer `layer` (default the last) as the start of the one
    layer, and an input projection that starts by passing the target's state through."""
    import copy

    from transformers import AutoModelForCausalLM

    from mcsd_runtime.distill.layers import PER_LAYER_CONFIG

    cfg = copy.deepcopy(target.config)
    n = cfg.num_hidden_layers
    layer = n - 1 if layer is None else layer
    if not 0 <= layer < n:
        raise MCSDError(f"the target has layers 0..{n - 1}, got {layer}")
    cfg.num_hidden_layers = 1
    for key in PER_LAYER_CONFIG:
        value = getattr(cfg, key, None)
        if isinstance(value, list) and len(value) == n:
            setattr(cfg, key, [value[layer]])
    lm = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        base, tbase = lm.get_decoder(), target.get_decoder()
        base.embed_tokens.load_state_dict(tbase.embed_tokens.state_dict())
        base.norm.load_state_dict(tbase.norm.state_dict())
        base.layers[0].load_state_dict(tbase.layers[layer].state_dict())
        if not cfg.tie_word_embeddings:
            lm.get_output_embeddings().load_state_dict(
                target.get_output_embeddings().state_dict())
    h = cfg.hidden_size
    fc = nn.Linear(2 * h, h, bias=True)
    with torch.no_grad():
        fc.weight.normal_(0.0, 0.02 / (2 * h) ** 0.5)
        fc.weight[:, h:] += torch.eye(h)
        fc.bias.zero_()
    return FeatureDraft(lm.float(), fc)


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


@torch.no_grad()
def target_features(target: nn.Module, packed: dict[str, torch.Tensor], batch: int = 8,
                    dtype: torch.dtype = torch.bfloat16, bar=None) -> torch.Tensor:
    """The target's final normed hidden state at every position of the packed rows
    (`train.pack`), [R, L, H] in `dtype`, each sequence attending to itself only."""
    from mcsd_runtime.distill.train import block_mask

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


def shifted(states: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Each position's previous state within its sequence (zeros where a sequence starts)."""
    prev = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], 1)
    return prev.masked_fill((position_ids == 0)[..., None], 0.0)


def feature_losses(draft: FeatureDraft, head, batch: dict[str, torch.Tensor], lut,
                   reg_weight: float, second_weight: float, ce_weight: float
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The training loss on one batch of packed rows with their target `feats`, and its parts."""
    from mcsd_runtime.distill.train import block_mask, distill_losses, head_logits

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


class FeatureDistillModule(pl.LightningModule):
    """A feature draft (and its reduced head) trained on the target's stored distributions and
    states (`feature_losses`)."""

    def __init__(self, draft: FeatureDraft, head, *, steps: int, lr: float,
                 warmup_frac: float, ce_weight: float, reg_weight: float = 0.5,
                 second_weight: float = 0.5) -> None:
        super().__init__()
        from mcsd_runtime.distill.train import lookup_table

        self.draft, self.head = draft, head
        self.steps, self.lr, self.warmup_frac = steps, lr, warmup_frac
        self.ce_weight, self.reg_weight, self.second_weight = ce_weight, reg_weight, second_weight
        self.draft.lm.get_input_embeddings().requires_grad_(False)
        if head is None:
            self.draft.lm.get_output_embeddings().requires_grad_(False)
        self.lut = lookup_table(head, draft.config.vocab_size)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, parts = feature_losses(self.draft, self.head, batch, self.lut, self.reg_weight,
                                     self.second_weight, self.ce_weight)
        self.log_dict(parts, prog_bar=True, on_step=True, logger=False)
        return loss

    def configure_optimizers(self):
        from mcsd_runtime.toy.training import _warmup_cosine

        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.lr, betas=(0.9, 0.95), weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine(self.steps,
                                                                      self.warmup_frac))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


@torch.inference_mode()
def feature_agreement(draft: FeatureDraft, target: nn.Module, seqs, seq_len: int, pad_id: int,
                      batch: int = 8) -> dict:
    """Held-out greedy agreement of a feature draft with the target, teacher-forced: `top1`
    reads the target's state at p - 1 (depth 1 of a decode step), `top1_own` the draft's own
    state there (what depth 2 and beyond read)."""
    from mcsd_runtime.distill.train import block_mask, pack

    if not seqs:
        return {"top1": None, "top1_own": None, "positions": 0}
    packed = pack(seqs, seq_len, pad_id, seqs[0].top_ids.shape[1])
    feats = target_features(target, packed, batch, dtype=next(draft.parameters()).dtype)
    dtype = next(draft.parameters()).dtype
    hits = own = count = 0
    for i in range(0, packed["input_ids"].shape[0], batch):
        rows = {key: v[i : i + batch] for key, v in packed.items()}
        pos, trained = rows["position_ids"], rows["trained"]
        mask = block_mask(rows["segment"], dtype)
        want = rows["top_ids"][trained][:, 0].long()
        out = draft(input_ids=rows["input_ids"], prev_hidden=shifted(feats[i : i + batch], pos),
                    position_ids=pos, attention_mask=mask, use_cache=False,
                    output_hidden_states=True)
        hits += int((out.logits[trained].argmax(-1) == want).sum())
        again = draft(input_ids=rows["input_ids"], prev_hidden=shifted(out.hidden_states[0], pos),
                      position_ids=pos, attention_mask=mask, use_cache=False)
        own += int((again.logits[trained].argmax(-1) == want).sum())
        count += int(trained.sum())
    return {"top1": round(hits / count, 4), "top1_own": round(own / count, 4),
            "positions": count}
