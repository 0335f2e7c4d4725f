"""Bad command lines end in one line naming the problem and its fix, exit code 2, no traceback,
and before any model pair loads."""

from __future__ import annotations

import pytest

from mcsd_runtime.cli import main


@pytest.fixture(autouse=True)
def no_pair(monkeypatch):
    """Loading a pair, or building the toy one, fails the test: bad options fail first."""
    from mcsd_runtime.models import pair
    from mcsd_runtime.toy import build

    def refuse(*_, **__):
        raise AssertionError("a pair was loaded or built")

    monkeypatch.setattr(pair, "load_pair", refuse)
    monkeypatch.setattr(build, "resolve_toy", refuse)


@pytest.fixture
def pair_args(tmp_path) -> list[str]:
    """--target and --draft naming existing (empty) folders: never loaded here."""
    for name in ("target", "draft"):
        (tmp_path / name).mkdir()
    return ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft")]


def refused(argv: list[str], capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_eval_reference_must_be_a_method_that_runs(tmp_path, capsys, pair_args):
    err = refused(["eval", *pair_args, "--methods", "ar,mcsd", "--reference", "heuristic",
                   "--out", str(tmp_path / "out")], capsys)
    assert "--reference 'heuristic' is not among --methods; add it there" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--save-hidden", "--init", "target"], "--save-hidden needs --init draft"),
    (["--shard-prompts", "0"], "--shard-prompts must be >= 1"),
    (["--run-id", "a/b"], "--run-id 'a/b': a run id may not contain '/'"),
])
def test_collect_refuses_bad_options(argv, message, tmp_path, capsys, pair_args):
    err = refused(["collect", *pair_args, "--out", str(tmp_path / "run"), *argv], capsys)
    assert message in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["collect", "eval"])
def test_unwritable_out_is_refused(command, tmp_path, capsys, pair_args):
    """An --out that cannot be created (inside a file: refused to root too, as CI runs)."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    out = blocker / "out"
    err = refused([command, *pair_args, "--out", str(out)], capsys)
    fix = {"collect": f"cannot lock the run folder {out}",
           "eval": f"cannot write to {out}: Not a directory; pass a writable --out"}[command]
    assert fix in err
    assert blocker.read_text() == "not a folder"
