"""The shared command-line arguments: one `--threads`, the runtime's choices, one pair resolver."""

from __future__ import annotations

import argparse

import pytest
import torch

from mcsd_runtime.cli import build_parser
from mcsd_runtime.cli.args import add_decode_args, apply_threads, pair_paths
from mcsd_runtime.constants import DEFAULT_K_CONFIG, INITS, VERIFIERS
from mcsd_runtime.errors import MCSDError


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_has_the_same_threads_option():
    from collect.overhead import build_parser as collect_overhead_parser

    parsers = {name: p for name, p in _subcommands().items() if "--threads" in _options(p)}
    assert set(parsers) == {"attention-bench", "bench", "collect", "drift", "eval", "profile",
                            "ragged-bench", "step-breakdown", "train"}
    parsers["collect.overhead"] = collect_overhead_parser()
    threads = {name: _options(p)["--threads"] for name, p in parsers.items()}
    assert {(a.default, a.type, a.help) for a in threads.values()} == {
        (1, int, threads["eval"].help)}


def test_apply_threads_sets_torch_and_zero_keeps_it():
    before = torch.get_num_threads()
    try:
        apply_threads(argparse.Namespace(threads=2))
        assert torch.get_num_threads() == 2
        apply_threads(argparse.Namespace(threads=0))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_decode_choices_and_default_tree_come_from_the_constants():
    p = argparse.ArgumentParser()
    add_decode_args(p)
    opts = _options(p)
    assert tuple(opts["--init"].choices) == INITS and tuple(opts["--verify"].choices) == VERIFIERS
    assert opts["--k-config"].default == ",".join(map(str, DEFAULT_K_CONFIG))
    with pytest.raises(SystemExit):
        p.parse_args(["--verify", "exact"])


def test_pair_paths_resolves_toy_specs_once(monkeypatch):
    """...and, as a command, asks for what is not built yet to be built (build=True)."""
    from mcsd_runtime.toy import build

    asked = []

    def fake_resolve(spec, build=False):
        assert build
        asked.append(spec)
        return ("/t", "/d")

    monkeypatch.setattr(build, "resolve_toy", fake_resolve)

    def ns(target, draft=None):
        return argparse.Namespace(target=target, draft=draft)

    assert pair_paths(ns("toy:tiny:3")) == ("/t", "/d")
    assert pair_paths(ns("toy", "toy")) == ("/t", "/d")
    assert pair_paths(ns("toy", "toy:default:0")) == ("/t", "/d")  # the same pair, spelt out
    assert asked == ["toy:tiny:3", "toy", "toy"]
    assert pair_paths(ns("org/target", "org/draft")) == ("org/target", "org/draft")
    assert pair_paths(ns("toy", "org/draft")) == ("/t", "org/draft")  # a real draft is kept
    asked.clear()
    for target in ("org/target", "toyota/model"):  # "toyota/..." is no toy spec
        with pytest.raises(MCSDError, match="draft model is required"):
            pair_paths(ns(target))
    # another toy pair's draft is refused, not ignored
    with pytest.raises(MCSDError, match=r"pass the target 'toy:tiny' alone"):
        pair_paths(ns("toy", "toy:tiny"))
    with pytest.raises(MCSDError, match="toy pair's draft"):
        pair_paths(ns("org/target", "toy"))
    # a local-looking path that does not exist fails at once, before any toy pair or hub
    with pytest.raises(MCSDError, match=r"no model folder at /no/such/folder \(the draft\)"):
        pair_paths(ns("toy", "/no/such/folder"))
    with pytest.raises(MCSDError, match=r"no model folder at ./missing \(the target\)"):
        pair_paths(ns("./missing", "org/draft"))
    assert asked == []


def test_collect_run_name_keeps_toy_presets():
    from collect.cli import add_collect_args, default_run_name

    p = argparse.ArgumentParser()
    add_collect_args(p)
    assert default_run_name(p.parse_args(["--target", "toy:tiny"])).startswith(
        "collect-toy-tiny-toy-code-collect-k4.2.2.1-draft-T0-m128")
    assert "-llama-" in default_run_name(p.parse_args(["--target", "org/llama/", "--draft", "d"]))


COMMANDS = ["bench", "collect", "eval", "profile", "train"]


def _run(argv: list[str], capsys) -> tuple[int, str]:
    """`mcsd ARGV` (or `python -m collect.overhead` for "collect.overhead"): exit code, stderr."""
    from collect.overhead import main as collect_overhead
    from mcsd_runtime.cli import main

    code = collect_overhead(argv[1:]) if argv[0] == "collect.overhead" else main(argv)
    return code, capsys.readouterr().err


@pytest.fixture
def no_pair(monkeypatch):
    """Loading a pair, or building the toy one, fails the test: bad options fail first."""
    from mcsd_runtime.models import pair
    from mcsd_runtime.toy import build

    def refuse(*_, **__):
        raise AssertionError("a pair was loaded or built")

    monkeypatch.setattr(pair, "load_pair", refuse)
    monkeypatch.setattr(build, "resolve_toy", refuse)


@pytest.mark.parametrize("command", [*COMMANDS, "collect.overhead"])
def test_negative_threads_is_a_clear_error(command, tmp_path, capsys, no_pair):
    before = torch.get_num_threads()
    try:
        code, err = _run([command, "--threads", "-1", *_out(command, tmp_path)], capsys)
    finally:
        torch.set_num_threads(before)
    assert code == 2 and "Traceback" not in err
    assert "--threads must be 0 (torch's own default) or a positive count, got -1" in err
    assert len(err.strip().splitlines()) == 1


def _out(command: str, tmp_path) -> list[str]:
    wants_out = command in ("collect", "eval", "profile", "train")
    return ["--out", str(tmp_path / "out")] if wants_out else []


@pytest.mark.parametrize("command", ["bench", "collect", "eval", "profile", "collect.overhead"])
@pytest.mark.parametrize(("device", "message"), [
    ("bogus", "unknown device 'bogus': use auto, cpu, cuda, cuda:N or mps"),
    ("cuda", "device 'cuda': this torch has no CUDA device"),
    ("cuda:3", "device 'cuda:3': this torch has no CUDA device"),
    ("meta", "unsupported device 'meta'"),
])
def test_bad_device_is_a_clear_error(command, device, message, tmp_path, capsys, no_pair,
                                     monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only torch
    code, err = _run([command, "--device", device, *_out(command, tmp_path)], capsys)
    assert code == 2 and "Traceback" not in err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_pick_device_counts_cuda_devices(monkeypatch):
    from mcsd_runtime.backend.device import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(MCSDError, match=r"only 2 CUDA device\(s\) \(cuda:0..cuda:1\)"):
        pick_device("cuda:2")
    assert pick_device("cpu") == torch.device("cpu")
