"""`DecisionModule`: the LightningModule that trains mcsd_runtime's DecisionMLP
(`train.stop.models.fit_mlp`). A module of its own: lightning takes seconds to import, and LightGBM
runs do not need it."""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import torch
import torch.nn.functional as F

from mcsd_runtime.decisions.learned import DecisionMLP
from train.stop.config import MLP_HIDDEN, MLP_LR, MLP_WEIGHT_DECAY


class DecisionModule(L.LightningModule):
    """BCE on (soft or hard) targets. The net is built from the hyperparameters, which every
    checkpoint keeps, so `DecisionModule.load_from_checkpoint(path)` rebuilds it; its input
    normalization (mean/std) are buffers of the net, in the state dict."""

    def __init__(self, in_features: int, hidden: Sequence[int] = MLP_HIDDEN,
                 dropout: float = 0.0, lr: float = MLP_LR) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = DecisionMLP(in_features, tuple(hidden), dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(self.net(x), y)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        self.log("val_loss", self._loss(batch), on_epoch=True, prog_bar=False)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"],
                                 weight_decay=MLP_WEIGHT_DECAY)
