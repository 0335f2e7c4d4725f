"""Training of the toy pair with Lightning: a joint phase (target CE, draft distilled on the same
batches) and a draft-only phase distilling from the frozen target. Step-counted and seeded."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
import warnings
from collections.abc import Iterator

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from mcsd_runtime.progress import DEFAULT_INTERVAL
from mcsd_runtime.toy.recipe import ModelShape, Recipe

# Training runs on this many torch threads (see `train_pair`); recorded in the pair's card.
TRAIN_THREADS = 1
# Seconds between two progress lines when stdout is not a terminal.
PROGRESS_INTERVAL = DEFAULT_INTERVAL


def make_model(shape: ModelShape, vocab_size: int, tokenizer: PreTrainedTokenizerFast,
               max_positions: int) -> LlamaForCausalLM:
    """A freshly initialised Llama causal LM of `shape` (tied embeddings, sdpa attention)."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def token_stream(texts: list[str], tokenizer: PreTrainedTokenizerFast) -> torch.Tensor:
    """All texts encoded and joined, each followed by EOS, as one int64 tensor."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    flat: list[int] = []
    for doc in ids:
        flat.extend(doc)
        flat.append(eos)
    return torch.tensor(flat, dtype=torch.long)


class WindowDataset(Dataset):
    """Fixed windows of a token stream, each prefixed with BOS: `seq_len + 1` tokens (inputs and
    shifted labels). Window starts are drawn once from a seeded generator, so the data order is
    a pure function of the seed."""

    def __init__(self, stream: torch.Tensor, seq_len: int, count: int, bos_id: int, seed: int):
        if stream.numel() <= seq_len + 1:
            raise ValueError("token stream shorter than one training window")
        gen = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(0, stream.numel() - seq_len, (count,), generator=gen)
        self.stream, self.seq_len, self.bos = stream, seq_len, bos_id

    def __len__(self) -> int:
        return self.starts.numel()

    def __getitem__(self, i: int) -> torch.Tensor:
        s = int(self.starts[i])
        body = self.stream[s : s + self.seq_len]
        return torch.cat([torch.tensor([self.bos]), body])


def eval_windows(stream: torch.Tensor, seq_len: int, count: int, bos_id: int) -> torch.Tensor:
    """`count` evenly spaced, non-overlapping held-out windows (BOS + seq_len tokens)."""
    n = min(count, stream.numel() // seq_len)
    stride = stream.numel() // max(n, 1)
    rows = [torch.cat([torch.tensor([bos_id]), stream[i * stride : i * stride + seq_len]])
            for i in range(n)]
    return torch.stack(rows)


def _kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(teacher || student)."""
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    log_p = F.log_softmax(teacher_logits.float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def _ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1))


def _warmup_cosine(total: int, warmup_frac: float, floor: float = 0.1):
    warm = max(1, int(total * warmup_frac))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, total - warm))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class JointModule(pl.LightningModule):
    """Target trained on next-token CE; the draft, on the same batch, on KL to the target's
    detached distribution plus `ce_weight` times its own CE. `train_target=False` freezes the
    target (the draft-only distillation phase)."""

    def __init__(self, target: LlamaForCausalLM, draft: LlamaForCausalLM, *, steps: int,
                 target_lr: float, draft_lr: float, ce_weight: float, warmup_frac: float,
                 train_target: bool):
        super().__init__()
        self.target, self.draft = target, draft
        self.steps, self.target_lr, self.draft_lr = steps, target_lr, draft_lr
        self.ce_weight, self.warmup_frac, self.train_target = ce_weight, warmup_frac, train_target
        self.target.requires_grad_(train_target)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        inputs, labels = batch[:, :-1], batch[:, 1:]
        if self.train_target:
            t_logits = self.target(input_ids=inputs).logits
            t_loss = _ce(t_logits, labels)
        else:
            self.target.eval()
            with torch.no_grad():
                t_logits = self.target(input_ids=inputs).logits
            t_loss = torch.zeros((), device=batch.device)
        d_logits = self.draft(input_ids=inputs).logits
        kl = _kl(d_logits, t_logits.detach())
        d_ce = _ce(d_logits, labels)
        loss = t_loss + kl + self.ce_weight * d_ce
        bar = {"kl": kl.detach(), "draft_ce": d_ce.detach()}
        if self.train_target:
            bar["target_ce"] = t_loss.detach()
        self.log_dict(bar, prog_bar=True, on_step=True, logger=False)
        return loss

    def configure_optimizers(self):
        groups = [{"params": list(self.draft.parameters()), "lr": self.draft_lr}]
        if self.train_target:
            groups.append({"params": list(self.target.parameters()), "lr": self.target_lr})
        opt = torch.optim.AdamW(groups, betas=(0.9, 0.95), weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine(self.steps, self.warmup_frac))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _fit(module: JointModule, data: WindowDataset, batch_size: int, steps: int, precision: str,
         progress: bool, desc: str = "training", device: torch.device | None = None) -> float:
    """Run `steps` optimizer steps (one pass over `data`) on `device` (default the CPU;
    elsewhere an op with no deterministic version warns rather than fails); returns seconds
    taken. With `progress`, the steps are shown on stdout (a bar on a terminal, else a line
    every PROGRESS_INTERVAL seconds with steps done, losses, elapsed and estimated time left)."""
    from mcsd_runtime.progress import lightning_progress

    loader = DataLoader(data, batch_size=batch_size, shuffle=False, num_workers=0)
    callbacks = [lightning_progress(desc, metrics=("target_ce", "draft_ce", "kl"),
                                    file=sys.stdout, min_interval=PROGRESS_INTERVAL)
                 ] if progress else []
    kind = "cpu" if device is None else device.type
    trainer = pl.Trainer(
        accelerator={"cuda": "gpu"}.get(kind, kind),
        devices=[device.index or 0] if kind == "cuda" else 1,
        max_steps=steps,
        max_epochs=1,
        precision=precision,
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        callbacks=callbacks,
        num_sanity_val_steps=0,
        deterministic=True if kind == "cpu" else "warn",
        default_root_dir=None,
    )
    start = time.perf_counter()
    trainer.fit(module, loader)
    return time.perf_counter() - start


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with `n` intra-op threads, restoring the previous count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_pair(recipe: Recipe, tokenizer: PreTrainedTokenizerFast, stream: torch.Tensor,
               progress: bool = True) -> tuple[LlamaForCausalLM, LlamaForCausalLM, dict]:
    """Build and train the target and draft of `recipe` on `stream`; returns both (in eval mode)
    and the seconds per phase.

    Training runs on one CPU thread: the weights then do not depend on the machine's core count,
    and on a shared machine a busy core does not stall every kernel (with two threads on two
    busy cores, small kernels ran 2-3x slower than on one thread).
    """
    with torch_threads(TRAIN_THREADS):
        return _train_pair(recipe, tokenizer, stream, progress)


def _train_pair(recipe: Recipe, tokenizer: PreTrainedTokenizerFast, stream: torch.Tensor,
                progress: bool) -> tuple[LlamaForCausalLM, LlamaForCausalLM, dict]:
    _quiet_lightning()
    pl.seed_everything(recipe.seed, workers=True, verbose=False)
    max_pos = recipe.seq_len + 1024
    target = make_model(recipe.target, len(tokenizer), tokenizer, max_pos)
    draft = make_model(recipe.draft, len(tokenizer), tokenizer, max_pos)
    bos = tokenizer.bos_token_id
    seconds = {}
    if recipe.joint_steps:
        data = WindowDataset(stream, recipe.seq_len, recipe.joint_steps * recipe.batch_size, bos,
                             recipe.seed)
        module = JointModule(target, draft, steps=recipe.joint_steps, target_lr=recipe.target_lr,
                             draft_lr=recipe.draft_lr, ce_weight=recipe.joint_ce,
                             warmup_frac=recipe.warmup_frac, train_target=True)
        if progress:
            print(f"training target + draft: {recipe.joint_steps} steps", flush=True)
        seconds["joint"] = _fit(module, data, recipe.batch_size, recipe.joint_steps,
                                recipe.precision, progress, "training target + draft")
    if recipe.draft_steps:
        data = WindowDataset(stream, recipe.seq_len, recipe.draft_steps * recipe.batch_size, bos,
                             recipe.seed + 1)
        module = JointModule(target, draft, steps=recipe.draft_steps, target_lr=0.0,
                             draft_lr=recipe.draft_lr / 3, ce_weight=recipe.draft_ce,
                             warmup_frac=recipe.warmup_frac, train_target=False)
        if progress:
            print(f"distilling draft from the frozen target: {recipe.draft_steps} steps",
                  flush=True)
        seconds["draft"] = _fit(module, data, recipe.batch_size, recipe.draft_steps,
                                recipe.precision, progress, "distilling draft")
    target.requires_grad_(True)
    return target.eval(), draft.eval(), seconds


@torch.inference_mode()
def heldout_metrics(target: torch.nn.Module, draft: torch.nn.Module, windows: torch.Tensor,
                    batch_size: int = 8) -> dict:
    """Mean NLL per token of each model on held-out windows (fp32) and the fraction of positions
    where their greedy (argmax) next tokens agree."""
    nll_t = nll_d = agree = count = 0.0
    for i in range(0, windows.size(0), batch_size):
        batch = windows[i : i + batch_size]
        inputs, labels = batch[:, :-1], batch[:, 1:]
        t_logits = target(input_ids=inputs).logits.float()
        d_logits = draft(input_ids=inputs).logits.float()
        n = labels.numel()
        nll_t += _ce(t_logits, labels).item() * n
        nll_d += _ce(d_logits, labels).item() * n
        agree += (t_logits.argmax(-1) == d_logits.argmax(-1)).sum().item()
        count += n
    return {
        "target_nll": nll_t / count,
        "draft_nll": nll_d / count,
        "agreement": agree / count,
        "tokens": int(count),
    }


def _quiet_lightning() -> None:
    """Keep Lightning's hardware and tips chatter out of the build output."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda",
                 "lightning.fabric.utilities.seed", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*You called `self.log.*logger=False.*")
    warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
    warnings.filterwarnings("ignore", message=".*TPU available but not used.*")
