"""Building a folder beside its destination and renaming it into place (`mcsd_runtime.paths`)."""

from __future__ import annotations

import os

import pytest

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import build_folder, install_folder, tmp_beside


def _built(staging, text="new"):
    (staging / "f.txt").write_text(text)
    return text


def test_a_build_replaces_an_old_folder_or_file_and_leaves_nothing_beside(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    assert build_folder(dest, "the thing", "pass another --out", _built) == "new"
    assert sorted(p.name for p in dest.iterdir()) == ["f.txt"]
    file_dest = tmp_path / "file"
    file_dest.write_text("a file")
    build_folder(file_dest, "the thing", "pass another --out", _built)
    assert (file_dest / "f.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "out"]


def test_a_failed_build_keeps_the_old_folder_and_removes_the_staging_one(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "old.txt").write_text("old")

    def fails(staging):
        _built(staging)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_folder(dest, "the thing", "pass another --out", fails)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (dest / "old.txt").read_text() == "old"


def test_a_failed_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    staging = tmp_beside(dest, "the thing", "pass another --out")
    _built(staging)
    real = os.replace

    def no_install(src, dst):
        if os.fspath(src) == os.fspath(staging):
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", no_install)
    with pytest.raises(MCSDError, match=f"cannot move the thing to {dest}: .*No space left"):
        install_folder(staging, dest, "the thing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (dest / "old.txt").read_text() == "old"


def test_with_keep_a_folder_another_process_finished_is_kept(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "card.json").write_text("theirs")
    staging = tmp_beside(dest, "the thing", "remedy")
    _built(staging)
    install_folder(staging, dest, "the thing", keep=lambda d: (d / "card.json").is_file())
    assert sorted(p.name for p in dest.iterdir()) == ["card.json"]
    assert not staging.exists()
    (dest / "card.json").unlink()
    (dest / "junk").write_text("half of a build")  # not empty, not complete: refused
    staging = tmp_beside(dest, "the thing", "remedy")
    with pytest.raises(MCSDError, match="cannot move the thing"):
        install_folder(staging, dest, "the thing", keep=lambda d: (d / "card.json").is_file())
    assert not staging.exists()
    dest.joinpath("junk").unlink()  # an empty folder is replaced
    staging = tmp_beside(dest, "the thing", "remedy")
    _built(staging)
    install_folder(staging, dest, "the thing", keep=lambda d: (d / "card.json").is_file())
    assert (dest / "f.txt").read_text() == "new"


def test_an_unwritable_destination_names_the_remedy(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(MCSDError, match="cannot write the thing to .*not a folder; pass x"):
        build_folder(blocker / "out", "the thing", "pass x", _built)
