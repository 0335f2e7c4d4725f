"""The repository tracks source, prompts and small fixtures, never stray run artifacts: no
pickles, checkpoints, model weights or Parquet shards outside the fixtures listed here, and no
other binary files. Generated outputs belong under the ignored data/ folders (see .gitignore)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]

# suffixes of run artifacts: pickled objects, torch checkpoints, weights, GGUF files, shards
ARTIFACT_SUFFIXES = {".pkl", ".pickle", ".pt", ".pth", ".ckpt", ".bin", ".safetensors",
                     ".gguf", ".parquet", ".arrow", ".npy", ".npz", ".joblib", ".onnx"}

# tracked on purpose: the frozen stopper artifacts that tests/fixtures/make_stopper_fixtures.py
# writes and tests/test_artifact.py loads back
ALLOWED = {"tests/fixtures/stoppers-b8df3aa/mlp/model.safetensors"}

# bytes read from the start of a file to decide whether it is binary
SNIFF_BYTES = 8192


def tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT,
                            capture_output=True, text=True)
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip("not a git checkout (an unpacked sdist, say): nothing to check")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [name for name in out.stdout.decode().split("\0") if name]


def test_allowed_artifacts_are_still_tracked() -> None:
    # an allowance that no longer names a tracked file is a stale exception: drop it
    assert not ALLOWED - set(tracked_files())


def test_no_artifacts_are_tracked() -> None:
    stray = sorted(name for name in tracked_files()
                   if PurePosixPath(name).suffix.lower() in ARTIFACT_SUFFIXES
                   and name not in ALLOWED)
    assert not stray, (f"run artifacts tracked by git: {stray}; `git rm --cached` them (and "
                       f"ignore them in .gitignore), or add a real fixture to ALLOWED")


def test_no_other_binary_files_are_tracked() -> None:
    binary = []
    for name in tracked_files():
        path = ROOT / name
        if name in ALLOWED or not path.is_file():  # deleted in the working tree: not ours
            continue
        with path.open("rb") as f:
            if b"\0" in f.read(SNIFF_BYTES):
                binary.append(name)
    assert not binary, f"binary files tracked by git: {sorted(binary)}"
