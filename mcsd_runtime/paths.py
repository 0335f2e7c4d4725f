"""Where generated outputs go: under `$MCSD_DATA` (default `./data`), in git-ignored folders."""

from __future__ import annotations

import os
from pathlib import Path


def data_root() -> Path:
    return Path(os.environ.get("MCSD_DATA", "data"))


def models_dir() -> Path:
    return data_root() / "models"


def runs_dir() -> Path:
    return data_root() / "runs"


def stoppers_dir() -> Path:
    return data_root() / "stoppers"
