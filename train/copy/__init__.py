"""`mcsd train --decision copy`: a learned prompt-lookup copy length (`train.copy.trainer`)."""

from train.copy.trainer import CopyTrainer

__all__ = ["CopyTrainer"]
