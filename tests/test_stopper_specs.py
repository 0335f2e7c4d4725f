"""One parser for stopper specs: the decoder (`make_stopper`), `mcsd eval`'s method check and
`generate(custom_generate=...)` read `static:4`, `stopper:PATH` and bare folders by the same
rules and refuse with the same message."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from mcsd_runtime.decisions.builtin import (
    HeuristicStopper,
    StaticStopper,
    UnknownStopperError,
    make_stopper,
    parse_stopper_spec,
)
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate.methods import check_method
from mcsd_runtime.integrations.hf import _stopper

ARTIFACT = Path(__file__).parent / "fixtures" / "stoppers-b8df3aa" / "lightgbm"


def test_builtins_and_folders_parse_by_one_set_of_rules(tmp_path):
    spec = parse_stopper_spec("confidence:0.3")
    assert (spec.name, spec.args, spec.learned) == ("confidence", ("0.3",), False)
    assert parse_stopper_spec("heuristic").args == ()
    for text in (f"stopper:{ARTIFACT}", str(ARTIFACT)):
        spec = parse_stopper_spec(text)
        assert spec.learned and spec.folder == ARTIFACT
    assert isinstance(make_stopper("static:2"), StaticStopper)
    assert isinstance(make_stopper(None), StaticStopper)
    assert isinstance(_stopper("heuristic"), HeuristicStopper)
    assert _stopper(f"stopper:{ARTIFACT}") is _stopper(f"stopper:{ARTIFACT}")  # loaded once
    check_method(f"hf-generate:stopper:{ARTIFACT}")
    check_method(str(ARTIFACT))


@pytest.mark.parametrize("where", ["make_stopper", "generate", "eval"])
def test_every_reader_refuses_alike(tmp_path, where):
    plain = tmp_path / "plain"
    plain.mkdir()
    read = {"make_stopper": make_stopper, "generate": _stopper,
            "eval": lambda s: check_method(f"hf-generate:{s}")}[where]
    for text, message in ((f"stopper:{tmp_path / 'nope'}", "is not a stopper artifact"),
                          (str(plain), f"{plain} is not a stopper artifact: no stopper.json"),
                          (f"stopper:{ARTIFACT / 'stopper.json'}", "is not a stopper artifact"),
                          ("confidence:high", "parameters must be numbers")):
        with pytest.raises(MCSDError, match=message):
            read(text)
    with pytest.raises(MCSDError, match="unknown (stopper|method)"):
        read("warp-drive")
    with pytest.raises(UnknownStopperError, match="unknown stopper 'warp-drive'"):
        parse_stopper_spec("warp-drive")


def test_ar_decoder_keeps_every_other_setting(monkeypatch):
    """ARDecoder derives its config with dataclasses.replace: a field added to DecodeConfig is
    carried over without being listed."""
    seen = []
    monkeypatch.setattr(MCSDDecoder, "__init__", lambda self, pair, config: seen.append(config))
    base = DecodeConfig(k_config=(2, 1), temperature=0.5, max_new_tokens=7, seed=3)
    ARDecoder(None, base)
    assert seen == [replace(base, k_config=(), init="draft")]
