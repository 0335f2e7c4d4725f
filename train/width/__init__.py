"""`mcsd train --decision width`: a learned width of the first depth (`train.width.trainer`)."""

from train.width.config import WidthConfig
from train.width.trainer import WidthTrainer

__all__ = ["WidthConfig", "WidthTrainer"]
