"""The decision models: LightGBM (native API) and MLPs (`train.stop.lightning_module.DecisionModule`
and a Trainer); their hyper-parameters live in `train.stop.config`.

Each `fit_*` returns an object whose `save(folder)` writes the artifact's model files in the form
`mcsd_runtime.decisions.learned` reads back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mcsd_runtime.decisions.features import DECISION_FEATURES
from train.stop.config import (
    LGBM_PARAMS,
    LGBM_PATIENCE,
    LGBM_ROUNDS,
    MLP_BATCH,
    MLP_EPOCHS,
    MLP_HIDDEN,
    MLP_LR,
    MLP_PATIENCE,
)


class LightGBMModel:
    def __init__(self, booster) -> None:
        self.booster = booster

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.booster.predict(x, num_iteration=self.booster.best_iteration or None)

    def save(self, folder: Path) -> None:
        self.booster.save_model(str(folder / "model.txt"),
                                num_iteration=self.booster.best_iteration or None)


def fit_lightgbm(x_train, y_train, x_val, y_val, soft: bool, seed: int = 0,
                 threads: int = 2, progress: bool = False,
                 names: tuple[str, ...] = DECISION_FEATURES) -> LightGBMModel:
    """`names`: the columns of `x_*`; `progress`: boosting rounds on stderr (see
    mcsd_runtime.progress)."""
    import lightgbm as lgb

    from mcsd_runtime.progress import progress as progress_bar

    params = LGBM_PARAMS | {"objective": "cross_entropy" if soft else "binary",
                            "metric": "cross_entropy" if soft else "binary_logloss",
                            "seed": seed, "num_threads": max(1, threads)}
    columns = list(names)
    dtrain = lgb.Dataset(x_train, y_train, feature_name=columns, free_raw_data=False)
    dval = lgb.Dataset(x_val, y_val, feature_name=columns, reference=dtrain)
    bar = progress_bar(total=LGBM_ROUNDS, desc="train lightgbm", unit="round",
                       disable=not progress)

    def show(env) -> None:  # runs before early stopping (lightgbm orders plain functions first)
        bar.set_postfix({f"{data} {metric}": value for data, metric, value, *_ in
                         env.evaluation_result_list or []}, refresh=False)
        bar.update(env.iteration + 1 - env.begin_iteration - bar.n)

    with bar:
        booster = lgb.train(params, dtrain, num_boost_round=LGBM_ROUNDS, valid_sets=[dval],
                            valid_names=["val"],
                            callbacks=[show, lgb.early_stopping(LGBM_PATIENCE, verbose=False)])
    return LightGBMModel(booster)


class MLPModel:
    def __init__(self, net) -> None:
        self.net = net.eval()

    def predict(self, x: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return torch.sigmoid(self.net(torch.from_numpy(np.asarray(x, np.float32)))).numpy()

    def save(self, folder: Path) -> None:
        import json

        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in self.net.state_dict().items()},
                  str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(self.net.config(), indent=1) + "\n")


def fit_mlp(x_train, y_train, x_val, y_val, out: Path, hidden: tuple[int, ...] = MLP_HIDDEN,
            normalize: bool = True, seed: int = 0, max_epochs: int = MLP_EPOCHS,
            progress: bool = False) -> MLPModel:
    """A Lightning Trainer owns the loop: checkpoints on val_loss, early stopping, CSV logs.
    `progress`: optimizer steps (out of `max_epochs`' worth) and losses on stderr."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    from mcsd_runtime.progress import lightning_progress
    from train.stop.lightning_module import DecisionModule

    L.seed_everything(seed, verbose=False)
    x_train = torch.from_numpy(np.asarray(x_train, np.float32))
    x_val = torch.from_numpy(np.asarray(x_val, np.float32))
    module = DecisionModule(x_train.shape[1], list(hidden), lr=MLP_LR)
    if normalize:
        module.net.set_normalization(x_train.mean(0), x_train.std(0))
    train_dl = DataLoader(TensorDataset(x_train, torch.from_numpy(np.asarray(y_train, np.float32))),
                          batch_size=MLP_BATCH, shuffle=True)
    val_dl = DataLoader(TensorDataset(x_val, torch.from_numpy(np.asarray(y_val, np.float32))),
                        batch_size=4096)
    ckpt = ModelCheckpoint(dirpath=out / "checkpoints", monitor="val_loss", save_top_k=1,
                           filename="best")
    trainer = L.Trainer(max_epochs=max_epochs, accelerator="cpu", devices=1,
                        callbacks=[ckpt, EarlyStopping("val_loss", patience=MLP_PATIENCE),
                                   *([lightning_progress("train mlp",
                                                         metrics=("train_loss", "val_loss"))]
                                     if progress else [])],
                        logger=CSVLogger(str(out), name="logs"), enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=10)
    trainer.fit(module, train_dl, val_dl)
    if ckpt.best_model_path:
        module = DecisionModule.load_from_checkpoint(ckpt.best_model_path, map_location="cpu",
                                                     weights_only=True)
    return MLPModel(module.net)
