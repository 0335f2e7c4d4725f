"""The embedded toy pair: build, reload, determinism, cache, card, and user errors."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from mcsd_runtime import cli
from mcsd_runtime.cli.toy import register as toy_register
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.toy import build as toy_build
from mcsd_runtime.toy import build_pair, get_recipe, pair_dir, resolve_toy, toy_pair_dirs
from mcsd_runtime.toy import training as toy_train

# Smaller than tiny: for the checks that build more than once.
MICRO = dict(joint_steps=6, draft_steps=3, max_train_chars=200_000, eval_windows=2)


@pytest.fixture(autouse=True)
def short_latency(monkeypatch):
    """Latency figures are not under test; on a busy CPU measuring them can take seconds."""
    monkeypatch.setattr(toy_build, "LATENCY_MAX_SECONDS", 0.5)


def mcsd(argv: list[str]) -> int:
    """The `mcsd` CLI with only this package's commands (as `cli.main` runs them)."""
    return cli.run_parser(cli.build_parser([toy_register]), argv)


@pytest.fixture(scope="module")
def tiny(toy_tiny_build) -> tuple[Path, str]:
    """The tiny pair (conftest builds it once a session) and its build's stdout."""
    return toy_tiny_build


def weights(root: Path) -> dict[str, torch.Tensor]:
    return {f"{sub}.{k}": v for sub in ("target", "draft")
            for k, v in load_file(root / sub / "model.safetensors").items()}


def test_tiny_builds_and_reloads(tiny):
    root, _ = tiny
    tok_t = AutoTokenizer.from_pretrained(root / "target")
    tok_d = AutoTokenizer.from_pretrained(root / "draft")
    shared = [(root / sub / "tokenizer.json").read_bytes() for sub in ("target", "draft")]
    assert shared[0] == shared[1]
    assert tok_t.get_vocab() == tok_d.get_vocab()
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(tok_t, name) is not None
    ids = tok_t("def f(x):\n    return", return_tensors="pt").input_ids
    assert ids[0, 0].item() == tok_t.bos_token_id
    assert tok_t.decode(ids[0], skip_special_tokens=True) == "def f(x):\n    return"
    target = AutoModelForCausalLM.from_pretrained(root / "target")
    draft = AutoModelForCausalLM.from_pretrained(root / "draft")
    assert target.config.model_type == draft.config.model_type == "llama"
    assert target.config.vocab_size == draft.config.vocab_size == len(tok_t)
    assert target.config.num_hidden_layers > draft.config.num_hidden_layers
    out = target.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok_t.pad_token_id)
    assert out.shape[1] == ids.shape[1] + 5


def test_card_fields_are_sane(tiny):
    root = tiny[0]
    card = toy_build.read_card(root)
    assert card["recipe"]["preset"] == "tiny" and card["recipe"]["seed"] == 0
    assert card["recipe_hash"] == get_recipe("tiny").hash12()
    assert card["build_seconds"] > 0 and set(card["train_seconds"]) == {"joint", "draft"}
    for model in ("target", "draft"):
        m = card[model]
        # well below a uniform guess over 512 tokens (6.24 nats; these train to about 5.3)
        assert 0 < m["heldout_nll"] < math.log(512) - 0.5, (model, m)
        assert m["latency_ms"] > 0 and m["latency_ms_1thread"] > 0 and m["params"] > 0
    assert 0.4 < card["agreement"] <= 1  # about 0.64; an untrained draft: about 1/512
    ratio = card["target"]["latency_ms"] / card["draft"]["latency_ms"]
    assert card["latency_ratio"] == pytest.approx(ratio, rel=0.01)
    assert "target/model.safetensors" in card["files"] and "draft/tokenizer.json" in card["files"]
    # what, besides the recipe, decides the bits: precision, torch, the CPU's ISA, threads
    machine = card["build_machine"]
    assert machine["precision"] == card["recipe"]["precision"]
    assert machine["precision"] in ("bf16-mixed", "32-true")
    assert machine["torch"] == torch.__version__ == card["versions"]["torch"]
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["train_threads"] == toy_train.TRAIN_THREADS == 1
    assert "cpu_model" in machine and isinstance(machine["isa_env"], dict)
    assert "cpu_capability" in card["reproducibility_note"]


def test_build_log_shows_training_progress(tiny):
    lines = tiny[1].splitlines()
    joint = [ln for ln in lines if ln.startswith("training target + draft: ") and "/60 " in ln]
    draft = [ln for ln in lines if ln.startswith("distilling draft: ") and "/20 " in ln]
    assert len(joint) == 60 and len(draft) == 20  # interval 0: one line per optimizer step
    assert joint[0].startswith("training target + draft: 1/60 steps (2%), ")
    for part in ("elapsed ", "left ~", "target_ce ", "draft_ce ", "kl "):
        assert part in joint[0]
    assert joint[-1].startswith("training target + draft: 60/60 steps (100%), ")
    assert ", done, target_ce " in joint[-1]
    assert draft[-1].startswith("distilling draft: 20/20 steps (100%), ")
    assert "draft_ce " in draft[-1] and "target_ce" not in draft[-1]
    assert "built with" in lines[-1] and "\r" not in tiny[1]


def test_cached_pair_is_reused(tiny, tmp_path, monkeypatch, capsys):
    root = tiny[0]
    stamp = (root / "target/model.safetensors").stat().st_mtime_ns

    def no_rebuild(*_, **__):
        raise AssertionError("a valid cached pair was rebuilt")

    monkeypatch.setattr(toy_build, "_build_into", no_rebuild)
    assert build_pair("tiny", out=root, progress=False) == root
    assert (root / "target/model.safetensors").stat().st_mtime_ns == stamp
    assert mcsd(["toy", "build", "--recipe", "tiny", "--out", str(root)]) == 0
    assert "already built" in capsys.readouterr().out
    # The default location: <cache>/models/toy-tiny-<hash>, found by the API and `toy` specs.
    monkeypatch.setenv("MCSD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MCSD_DATA", str(tmp_path / "data"))
    cached = pair_dir("tiny")
    assert cached.parent == tmp_path / "cache" / "models" and cached.name.startswith("toy-tiny-")
    assert mcsd(["toy", "info", "--recipe", "tiny"]) == 2  # says where it looked
    err = capsys.readouterr().err
    assert "MCSD_CACHE" in err and str(tmp_path / "cache") in err
    shutil.copytree(root, cached)
    target, draft = toy_pair_dirs("tiny")
    assert (target, draft) == (cached / "target", cached / "draft")
    assert resolve_toy("toy:tiny") == (str(target), str(draft))
    assert resolve_toy("toy:tiny:0") == (str(target), str(draft))
    assert resolve_toy("meta-llama/Llama-2-7b-chat-hf") is None
    assert resolve_toy("toyota/model") is None
    with pytest.raises(MCSDError, match="seed must be an integer"):
        resolve_toy("toy:tiny:x")
    assert mcsd(["toy", "info", "--recipe", "tiny"]) == 0
    assert str(cached) in capsys.readouterr().out
    # From Python as from the command line: load_pair("toy:tiny"), the draft coming with it.
    from mcsd_runtime.models.pair import load_pair

    pair = load_pair("toy:tiny", device="cpu")
    assert (pair.target_name, pair.draft_name) == (str(target), str(draft))
    assert "Loading weights" not in capsys.readouterr().err


def test_same_seed_same_weights_and_force_rebuilds(tmp_path):
    recipe = get_recipe("tiny", **MICRO)
    a = build_pair(out=tmp_path / "a", recipe=recipe, progress=False)
    wa = weights(a)
    other = weights(build_pair(out=tmp_path / "c", recipe=get_recipe("tiny", seed=1, **MICRO),
                               progress=False))
    assert not all(torch.equal(wa[k], other[k]) for k in wa)
    empty = tmp_path / "empty"
    empty.mkdir()  # an existing empty --out folder is built into, the same weights again
    assert build_pair(out=empty, recipe=recipe, progress=False) == empty
    assert weights(empty).keys() == wa.keys()
    assert all(torch.equal(wa[k], v) for k, v in weights(empty).items())
    stamp = (a / "card.json").stat().st_mtime_ns
    assert build_pair(out=a, recipe=recipe, force=True, progress=False) == a
    assert (a / "card.json").stat().st_mtime_ns != stamp
    assert all(torch.equal(wa[k], v) for k, v in weights(a).items())
    assert not list(tmp_path.glob(".*"))  # no temporary folders left


def test_fp32_override_is_its_own_recipe(tmp_path, capsys):
    recipe = get_recipe("tiny", precision="32-true", **MICRO)
    card = toy_build.read_card(build_pair(out=tmp_path / "fp32", recipe=recipe, progress=False))
    assert card["recipe"]["precision"] == card["build_machine"]["precision"] == "32-true"
    assert card["recipe_hash"] == recipe.hash12()
    if get_recipe("tiny").resolved().precision != "32-true":  # bf16 machines: another name
        assert pair_dir("tiny", precision="32-true") != pair_dir("tiny")
    missing = tmp_path / "none"
    assert mcsd(["toy", "info", "--recipe", "tiny", "--precision", "32-true",
                 "--out", str(missing)]) == 2
    assert "--precision 32-true" in capsys.readouterr().err


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(folder, recipe, progress):
        (folder / "target").mkdir()
        raise KeyboardInterrupt

    monkeypatch.setattr(toy_build, "_build_into", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_pair("tiny", out=tmp_path / "pair", progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda r: (r / "target/model.safetensors").write_bytes(b"garbage"), "does not match"),
        (lambda r: (r / "draft/model.safetensors").unlink(), "draft/model.safetensors is missing"),
        (lambda r: (r / "card.json").unlink(), "card.json is missing"),
        (lambda r: (r / "card.json").write_text("{oops"), "card.json is unreadable"),
    ],
)
def test_corrupt_pair_is_reported(tiny, tmp_path, capsys, damage, message):
    broken = tmp_path / "pair"
    shutil.copytree(tiny[0], broken)
    damage(broken)
    assert mcsd(["toy", "build", "--recipe", "tiny", "--out", str(broken)]) == 2
    err = capsys.readouterr().err
    assert message in err and "--force" in err and "Traceback" not in err


def test_pair_of_another_recipe_is_refused(tiny, capsys):
    assert mcsd(["toy", "build", "--recipe", "tiny", "--seed", "3", "--out", str(tiny[0])]) == 2
    assert "another recipe" in capsys.readouterr().err


def test_unwritable_output_folder(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert mcsd(["toy", "build", "--recipe", "tiny", "--out", str(blocker / "pair")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the toy pair" in err and "Traceback" not in err


def test_unknown_preset_and_missing_pair(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        mcsd(["toy", "build", "--recipe", "huge"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err
    assert mcsd(["toy", "info", "--recipe", "tiny", "--out", str(tmp_path / "none")]) == 2
    assert "no toy pair at" in capsys.readouterr().err
