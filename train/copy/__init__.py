"""`mcsd train --decision copy`: a learned prompt-lookup copy length (`train.copy.trainer`)."""

from train.copy.config import CopyConfig
from train.copy.trainer import CopyTrainer

__all__ = ["CopyConfig", "CopyTrainer"]
