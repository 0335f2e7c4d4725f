"""Extra toy drafts distilled from a built toy target: layer picking, the build and its card,
the cache, loading by name (`toy-draft:NAME`), user errors, and `mcsd eval --drafts`."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mcsd_runtime import cli
from mcsd_runtime.cli.eval import register as eval_register
from mcsd_runtime.cli.toy import register as toy_register
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.pair import load_pair, pair_names
from mcsd_runtime.paths import file_sha256
from mcsd_runtime.toy import build as toy_build
from mcsd_runtime.toy import drafts
from mcsd_runtime.toy.draft_recipe import get_draft_recipe
from mcsd_runtime.toy.drafts import (
    build_draft,
    copy_target_layers,
    target_layer_indices,
    verify_draft,
)


def mcsd(argv: list[str]) -> int:
    return cli.run_parser(cli.build_parser([toy_register, eval_register]), argv)


@pytest.fixture(autouse=True)
def short_latency(monkeypatch):
    """Latency figures are not under test; on a busy CPU measuring them can take seconds."""
    monkeypatch.setattr(toy_build, "LATENCY_MAX_SECONDS", 0.5)


@pytest.fixture(scope="module")
def tiny_draft(toy_tiny, tmp_path_factory) -> Path:
    """The tiny-l1 draft distilled from the session's tiny pair, into a folder of its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(toy_build, "LATENCY_MAX_SECONDS", 0.5)
        return build_draft("tiny-l1", target_root=toy_tiny,
                           out=tmp_path_factory.mktemp("draft") / "tiny-l1", progress=False)


def test_target_layers_are_evenly_spaced():
    assert target_layer_indices(16, 2) == [0, 15]
    assert target_layer_indices(16, 4) == [0, 5, 10, 15]
    assert target_layer_indices(16, 1) == [0]
    assert target_layer_indices(3, 3) == [0, 1, 2]
    for bad in (0, 17):
        with pytest.raises(MCSDError, match="needs 1 to 16 layers"):
            target_layer_indices(16, bad)


def test_a_draft_with_every_target_layer_is_the_target(toy_pair):
    """Copying all of a target's layers reproduces it exactly; fewer layers do not; another
    width is refused."""
    from mcsd_runtime.toy.recipe import ModelShape
    from mcsd_runtime.toy.training import make_model

    target, tok = toy_pair.target, toy_pair.tokenizer
    c = target.config
    shape = ModelShape(c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
                       c.intermediate_size)
    same = make_model(shape, c.vocab_size, tok, c.max_position_embeddings).eval()
    assert copy_target_layers(target, same) == list(range(c.num_hidden_layers))
    x = torch.tensor([[1, 40, 41, 42, 43]])
    with torch.no_grad():
        assert torch.equal(same(input_ids=x).logits, target(input_ids=x).logits)
        fewer = make_model(replace(shape, layers=1), c.vocab_size, tok,
                           c.max_position_embeddings).eval()
        copy_target_layers(target, fewer)
        assert not torch.allclose(fewer(input_ids=x).logits, target(input_ids=x).logits)
    narrow = make_model(ModelShape(1, c.hidden_size // 2, 2, 32), c.vocab_size, tok,
                        c.max_position_embeddings)
    with pytest.raises(MCSDError, match="needs the target's hidden_size"):
        copy_target_layers(target, narrow)


def test_draft_card_and_reload(tiny_draft, toy_tiny):
    card = verify_draft(tiny_draft, toy_tiny)
    pair_card = json.loads((toy_tiny / "card.json").read_text())
    assert card["format"] == "mcsd-toy-draft" and card["recipe"]["name"] == "tiny-l1"
    assert card["target"]["weights_sha256"] == pair_card["files"]["target/model.safetensors"]
    assert card["target"]["heldout_nll"] == pytest.approx(pair_card["target"]["heldout_nll"],
                                                          abs=1e-3)  # the same windows
    assert 0 < card["agreement"] <= 1 and card["latency_ratio_1thread"] > 0
    assert 0 < card["draft"]["heldout_nll"] < 10 and card["draft"]["params"] > 0
    assert {"draft/model.safetensors", "draft/config.json", "draft/tokenizer.json"} <= set(
        card["files"])
    # distilled, not copied: the weights moved away from the target layer they started from
    pair = load_pair(toy_tiny / "target", tiny_draft / "draft", device="cpu", dtype="float32")
    assert pair.draft.config.num_hidden_layers == 1
    start = pair.target.model.layers[0].mlp.up_proj.weight
    assert not torch.equal(pair.draft.model.layers[0].mlp.up_proj.weight, start)
    # the target was not touched
    assert file_sha256(toy_tiny / "target/model.safetensors") == \
        pair_card["files"]["target/model.safetensors"]


def test_a_built_draft_is_reused_and_checked(tiny_draft, toy_tiny, tmp_path, monkeypatch):
    def no_rebuild(*_, **__):
        raise AssertionError("a valid draft was rebuilt")

    monkeypatch.setattr(drafts, "_build_into", no_rebuild)
    assert build_draft("tiny-l1", target_root=toy_tiny, out=tiny_draft,
                       progress=False) == tiny_draft
    # a damaged file is found
    broken = tmp_path / "broken"
    shutil.copytree(tiny_draft, broken)
    (broken / "draft/config.json").write_text("{}")
    with pytest.raises(MCSDError, match="does not match its checksum"):
        verify_draft(broken)
    # a draft of another target build is refused, naming the fix
    other = tmp_path / "other-target"
    other.mkdir()
    card = json.loads((toy_tiny / "card.json").read_text())
    card["files"]["target/model.safetensors"] = "0" * 64
    (other / "card.json").write_text(json.dumps(card))
    with pytest.raises(MCSDError, match="another build of the target.*--force"):
        verify_draft(tiny_draft, other)
    # a folder holding another recipe's draft
    with pytest.raises(MCSDError, match="another recipe"):
        build_draft("tiny-l1", target_root=toy_tiny, out=tiny_draft, progress=False,
                    recipe=get_draft_recipe("tiny-l1", steps=3))


@pytest.mark.parametrize(("target", "draft", "message"), [
    ("toy:tiny", "toy-draft:l2", "distilled from the 'default' toy target: pass --target toy,"),
    ("toy", "toy-draft:tiny-l1", "pass --target toy:tiny"),
    ("org/model", "toy-draft:l2", "distilled from the embedded toy target"),
    ("toy", "toy-draft:nope", "unknown toy draft 'nope'; use one of tiny-l1, l2, l4"),
    ("toy", "toy-draft:", "bad toy draft spec"),
])
def test_draft_names_refused_before_anything_builds(target, draft, message, monkeypatch):
    def no_build(*_, **__):
        raise AssertionError("something was built")

    monkeypatch.setattr(toy_build, "build_pair", no_build)
    monkeypatch.setattr(drafts, "build_draft", no_build)
    with pytest.raises(MCSDError, match=message.replace("(", r"\(")):
        pair_names(target, draft)


def test_toy_pairs_that_train_for_minutes_build_only_when_asked(tmp_path, monkeypatch,
                                                                 capsys):
    """`pair_names("toy")` (the default pair, about 15 minutes) and a draft of it build only
    with build=True, saying so on stderr; otherwise the error names the command that builds
    them. The tiny pair, built in seconds, builds on first use either way."""
    monkeypatch.setenv("MCSD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MCSD_DATA", str(tmp_path / "data"))
    built = []

    def build_pair(preset, seed=0, **_):
        built.append(preset)
        return tmp_path / preset

    def build_draft(name, seed=0, **_):
        built.append(name)
        return tmp_path / name

    monkeypatch.setattr(toy_build, "build_pair", build_pair)
    monkeypatch.setattr(drafts, "build_draft", build_draft)
    with pytest.raises(MCSDError, match="the toy pair toy is not built yet .*"
                                        "`mcsd toy build --recipe default`.*or pass build=True"):
        pair_names("toy")
    with pytest.raises(MCSDError, match="`mcsd toy draft l2 --seed 1`.*or pass build=True"):
        load_pair("toy:default:1", "toy-draft:l2")
    assert built == [] and "note:" not in capsys.readouterr().err
    default = tmp_path / "default"
    assert pair_names("toy", build=True) == (str(default / "target"), str(default / "draft"))
    assert pair_names("toy", "toy-draft:l2", build=True) == (str(default / "target"),
                                                             str(tmp_path / "l2" / "draft"))
    assert built == ["default", "default", "l2"]
    err = capsys.readouterr().err
    assert "note: building the toy pair toy on first use" in err
    assert "note: building the toy draft toy-draft:l2 on first use" in err
    assert pair_names("toy:tiny") == (str(tmp_path / "tiny" / "target"),
                                      str(tmp_path / "tiny" / "draft"))
    assert pair_names("toy:tiny", "toy-draft:tiny-l1")[1] == str(tmp_path / "tiny-l1" / "draft")
    assert built[3:] == ["tiny", "tiny", "tiny-l1"] and "note:" not in capsys.readouterr().err


def test_drafts_load_by_name_from_the_cache(toy_tiny, tmp_path, monkeypatch, capsys):
    """`toy-draft:tiny-l1` with `--target toy:tiny`: distilled from the cached tiny target on
    first use into the cache, found there afterwards, listed by `mcsd toy draft --list`."""
    monkeypatch.setenv("MCSD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MCSD_DATA", str(tmp_path / "data"))
    cached_pair = toy_build.pair_dir("tiny")
    shutil.copytree(toy_tiny, cached_pair)
    assert mcsd(["toy", "draft", "--list"]) == 0
    assert "toy-draft:tiny-l1  1 layer, d=64, for the tiny target" in capsys.readouterr().out
    pair = load_pair("toy:tiny", "toy-draft:tiny-l1", device="cpu")
    folder = drafts.draft_dir("tiny-l1")
    assert folder.parent == tmp_path / "cache" / "models"
    assert folder.name.startswith("toy-draft-tiny-l1-")
    assert (pair.target_name, pair.draft_name) == (str(cached_pair / "target"),
                                                   str(folder / "draft"))
    assert mcsd(["toy", "draft", "--list"]) == 0
    assert str(folder) in capsys.readouterr().out
    assert mcsd(["toy", "draft", "tiny-l1"]) == 0  # already built: its summary
    out = capsys.readouterr().out
    assert "toy draft tiny-l1 (1 layer, d=64" in out and "greedy agreement" in out
    assert "distilling" not in out


@pytest.mark.parametrize(("argv", "message"), [
    (["toy", "draft"], "name the drafts to build"),
    (["toy", "draft", "l2", "nope"], "unknown toy draft 'nope'"),
    (["toy", "draft", "l2", "l4", "--out", "x"], "--out takes one draft"),
    (["eval", "--drafts", "toy,toy", "--out", "x"], "--drafts names a draft twice"),
    (["eval", "--drafts", ",", "--out", "x"], "--drafts names no draft"),
    (["eval", "--drafts", "toy", "--draft", "toy", "--out", "x"], "list every draft in --drafts"),
    (["eval", "--drafts", "toy", "--runs", "a", "--out", "x"], "--drafts decodes"),
    (["eval", "--drafts", "toy", "--methods", "ar,mcsd", "--batch-size", "4", "--out", "x"],
     "--drafts decodes one sequence at a time"),
])
def test_cli_errors(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)

    def no_build(*_, **__):
        raise AssertionError("something was built")

    monkeypatch.setattr(toy_build, "build_pair", no_build)
    assert mcsd(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "x").exists()


def test_eval_with_several_drafts(toy_tiny, tiny_draft, tmp_path, capsys):
    """`mcsd eval --drafts`: ar once, every other method once per draft, interleaved on the same
    prompts; drafts.md / drafts.json with the drafts' cards, lossless rows equal to ar (output
    and NLL), target-init paired with lossless MCSD of the same draft."""
    out = tmp_path / "run"
    drafts_ = [str(toy_tiny / "draft"), str(tiny_draft / "draft")]
    assert mcsd(["eval", "--target", str(toy_tiny / "target"), "--drafts", ",".join(drafts_),
                 "--methods", "ar,mcsd,mcsd-target-init", "--prompts", "toy-code,pkg-prose",
                 "--limit", "2", "--max-new-tokens", "10", "--k-config", "2,1",
                 "--out", str(out)]) == 0
    assert "| draft | layers |" in capsys.readouterr().out
    result = json.loads((out / "drafts.json").read_text())
    rows = result["rows"]
    labels = ["ar"] + [f"{m}@{d}" for m in ("mcsd:2,1", "mcsd-target-init:2,1") for d in drafts_]
    for domain in ("toy-code", "pkg-prose"):
        mine = {r["label"]: r for r in rows if r["domain"] == domain}
        assert list(mine) == labels
        records = [json.loads(x) for x in
                   (out / domain / "per_prompt.jsonl").read_text().splitlines()]
        assert len(records) == 2 * len(labels)
        for d in drafts_:
            lossless, lossy = mine[f"mcsd:2,1@{d}"], mine[f"mcsd-target-init:2,1@{d}"]
            assert lossless["ar_equal_share"] == 1.0
            assert lossless["target_nll"] == mine["ar"]["target_nll"]
            assert lossless["target_nll_vs_ar"] == 0.0
            assert lossless["target_top1_share"] == mine["ar"]["target_top1_share"]
            assert lossy["lossless_twin"] == f"mcsd:2,1@{d}" and lossy["vs_lossless"] > 0
            assert lossless["lossless_twin"] is None and lossless["draft"] == d
        assert mine["ar"]["draft"] is None
    cards = result["cards"]
    assert cards[drafts_[0]]["layers"] == 1 and cards[drafts_[1]]["layers"] == 1
    assert cards[drafts_[1]]["agreement"] == verify_draft(tiny_draft)["agreement"]
    text = (out / "drafts.md").read_text()
    assert f"| toy-code | mcsd-target-init:2,1 | {drafts_[1]} |" in text
    assert (out / "toy-code" / "report.md").is_file()
