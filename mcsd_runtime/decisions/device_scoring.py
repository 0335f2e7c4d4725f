"""A learned stopper's scoring on the device: the pieces `LearnedStopper.device_continue` uses
to decide where the draft's distributions already are.

- `DeviceScorer`: the node scores of the stopper's model on a device. It keeps a copy of the
  MLP there, or the LightGBM trees as tensors (`mcsd_runtime.decisions.forest`), one per device.
- `interpolate`: a `Calibration`'s knots applied as `np.interp` does them.
- `DEVICE_AGGREGATIONS`: the frontier aggregations of `mcsd_runtime.decisions.aggregation`, written
  over tensors, on the `FEATURE_NAMES` columns that `Frontier.features()` serves.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path

import torch

from mcsd_runtime.decisions.features import FEATURE_NAMES
from mcsd_runtime.decisions.forest import TensorForest

_LOG_PATH = FEATURE_NAMES.index("log_path_prob")


def _path(p: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    logw = feats[:, _LOG_PATH].double()
    w = (logw - logw.max()).exp()
    return (p * w).sum() / w.sum()


DEVICE_AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "max": lambda p, f: p.max(), "sum": lambda p, f: p.sum().clamp(max=1.0),
    "mean": lambda p, f: p.mean(), "path": _path}


@functools.cache
def _knots(x: tuple[float, ...], y: tuple[float, ...],
           device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A calibration's knots on `device`, uploaded once (not at every decision)."""
    return (torch.tensor(x, dtype=torch.float64, device=device),
            torch.tensor(y, dtype=torch.float64, device=device))


def interpolate(p: torch.Tensor, x: tuple[float, ...], y: tuple[float, ...]) -> torch.Tensor:
    """`np.interp(p, x, y)` on the device: linear between the knots (at least two, increasing:
    `Calibration` checks), flat beyond them."""
    xs, ys = _knots(x, y, p.device)
    i = torch.searchsorted(xs, p, right=True).clamp(1, len(x) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    t = ((p - x0) / (x1 - x0)).clamp(0.0, 1.0)
    return y0 + t * (y1 - y0)


class DeviceScorer:
    """A learned stopper's node scores in [0, 1] (float64) on the device of its inputs."""

    def __init__(self, kind: str, model, model_file: Path | None,
                 feature_names: tuple[str, ...]) -> None:
        self.kind, self.model, self.model_file = kind, model, model_file
        self.columns = [FEATURE_NAMES.index(n) for n in feature_names]
        self._on: dict[torch.device, tuple] = {}

    def _for(self, device: torch.device) -> tuple:
        """(model, feature columns) on `device`, made once."""
        if device not in self._on:
            if self.kind == "lightgbm":
                assert self.model_file is not None, "scored on the device only when available()"
                model = TensorForest.load(self.model_file, device)
            else:
                model = copy.deepcopy(self.model).to(device).eval()
            self._on[device] = model, torch.tensor(self.columns, device=device)
        return self._on[device]

    def available(self) -> bool:
        return self.kind != "lightgbm" or self.model_file is not None

    def __call__(self, feats: torch.Tensor, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Scores for the nodes of `feats` [n, len(FEATURE_NAMES)] (`hidden` [n, H] instead,
        for a model of the draft's hidden states)."""
        model, columns = self._for(feats.device)
        if self.kind == "lightgbm":
            return model(feats[:, columns])
        x = hidden if hidden is not None else feats[:, columns]
        return torch.sigmoid(model(x.float())).double()
