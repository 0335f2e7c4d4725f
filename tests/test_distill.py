"""Drafts distilled from any target (`mcsd_runtime.distill`): the recipe and its hash, the cut
from the target's layers, self-generated chat data, the distillation, the reduced-vocabulary
head (exact greedy MCSD, finite stopper features), the cache, and `mcsd draft`."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import fake_cpu_flags, make_pair
from mcsd_runtime import cli
from mcsd_runtime.backend.layers import cut_draft
from mcsd_runtime.cli.draft import register as draft_register
from mcsd_runtime.decisions.features import node_features
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.distill import cache as distill_cache
from mcsd_runtime.distill import data as distill_data
from mcsd_runtime.distill.agreement import agreement
from mcsd_runtime.distill.head import (
    HEAD_FILE,
    ReducedHead,
    attach_reduced_head,
    head_of,
    pick_vocab,
    reduced_head_from,
    save_reduced_head,
)
from mcsd_runtime.distill.recipe import DATA_FIELDS, PRESETS, get_recipe
from mcsd_runtime.distill.target import fingerprint, load_target
from mcsd_runtime.distill.train import distill
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.toy import build as toy_build

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}"
                 "\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
FP = {"config": "c", "tokenizer": "t", "weights": "w"}


def mcsd(argv: list[str]) -> int:
    return cli.run_parser(cli.build_parser([draft_register]), argv)


@pytest.fixture(autouse=True)
def short_latency(monkeypatch):
    """Latency figures are not under test; on a busy CPU measuring them can take seconds."""
    monkeypatch.setattr(toy_build, "LATENCY_MAX_SECONDS", 0.2)


@pytest.fixture(scope="module")
def chat_target(toy_tiny, tmp_path_factory) -> Path:
    """The tiny toy target with a chat template given to its tokenizer."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("chat") / "chat-target"
    shutil.copytree(toy_tiny / "target", folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def chat_data(chat_target, tmp_path_factory):
    target, tok = load_target(chat_target)
    folder = tmp_path_factory.mktemp("data")
    recipe = get_recipe("tiny", conversations=12, heldout_conversations=8, text_tokens=3000)
    return target, tok, recipe, folder, distill_data.generate_data(folder, target, tok, recipe,
                                                                   progress_on=False)


# ------------------------------------------------------------------------------- the recipe
@pytest.mark.parametrize("flags", ["avx2", "avx2 amx_bf16"])
def test_recipe_hash_changes_with_each_field_and_the_target(flags, tmp_path, monkeypatch):
    fake_cpu_flags(monkeypatch, tmp_path, flags)
    base = get_recipe("tiny")
    native = "amx_bf16" in flags
    assert base.resolved().precision == ("bf16-mixed" if native else "32-true")
    changed = {"layers": 2, "vocab": 64, "conversations": 9, "heldout_conversations": 5,
               "query_tokens": 9, "answer_tokens": 13, "query_temperature": 0.7,
               "gen_batch": 5, "prompts": "toy-code", "prompt_limit": 3, "text_tokens": 2001,
               "heldout_text_tokens": 501, "top_k": 9, "steps": 13, "batch_size": 5,
               "seq_len": 65, "lr": 1e-3, "warmup_frac": 0.2, "ce_weight": 0.3,
               "train_embeddings": True, "features": True, "seed": 1,
               # `auto` hashes as what it resolves to on this CPU: change to the other one
               "precision": "32-true" if native else "bf16-mixed"}
    for key, value in changed.items():
        other = replace(base, **{key: value})
        assert other.hash12(FP) != base.hash12(FP), key
        same_data = other.data_hash12(FP) == base.data_hash12(FP)
        assert same_data == (key not in DATA_FIELDS), key
    assert get_recipe("tiny", layer_ids=(0,)).hash12(FP) != base.hash12(FP)
    assert base.hash12({**FP, "weights": "x"}) != base.hash12(FP)
    assert base.data_hash12({**FP, "weights": "x"}) != base.data_hash12(FP)
    assert get_recipe("tiny").hash12(FP) == base.hash12(FP)  # stable
    assert replace(base, precision=base.resolved().precision).hash12(FP) == base.hash12(FP)


def test_recipe_errors():
    with pytest.raises(MCSDError, match="unknown distillation recipe"):
        get_recipe("huge")
    with pytest.raises(MCSDError, match="unknown recipe field"):
        get_recipe("tiny", nonsense=1)
    with pytest.raises(MCSDError, match="layers must be an integer >= 1"):
        get_recipe("tiny", layers=0)
    with pytest.raises(MCSDError, match="name 2 layers, but layers is 3"):
        get_recipe("tiny", layer_ids=(0, 1), layers=3)
    with pytest.raises(MCSDError, match="precision"):
        get_recipe("tiny", precision="fp8")
    assert get_recipe("tiny", layer_ids=(0, 1)).layers == 2
    assert get_recipe("default", layers=3).layer_ids == ()


# ------------------------------------------------------------------------ the draft's init
def test_cut_draft_holds_the_target_layers(toy_pair):
    target = toy_pair.target
    n = target.config.num_hidden_layers
    whole = cut_draft(target, list(range(n)))
    x = torch.tensor([[1, 40, 41, 42, 43]])
    with torch.no_grad():
        assert torch.equal(whole(input_ids=x).logits, target(input_ids=x).logits)
    last = cut_draft(target, [n - 1])
    assert last.config.num_hidden_layers == 1
    for (name, p), q in zip(last.model.layers[0].state_dict().items(),
                            target.model.layers[n - 1].state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert not torch.equal(last.model.layers[0].self_attn.q_proj.weight,
                           target.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(last.model.embed_tokens.weight, target.model.embed_tokens.weight)
    for bad in ([n], [1, 0], []):
        with pytest.raises(MCSDError, match="layer ids"):
            cut_draft(target, bad)


# ------------------------------------------------------------------------------- the data
def test_chat_data_are_the_targets_own_greedy_answers(chat_data):
    target, tok, recipe, folder, data = chat_data
    assert data.has_chat and len(data.heldout_chat) == 8
    chats = [s for s in data.train if s.kind == "chat"]
    assert len(chats) == 12 and any(s.kind == "text" for s in data.train)
    prefix = tok("<|user|>\n", add_special_tokens=False)["input_ids"]
    for s in chats + data.heldout_chat:
        assert s.tokens[: len(prefix)].tolist() == prefix
        answer = s.tokens[s.start:]
        assert s.top_ids.shape == (answer.numel(), recipe.top_k)
        # greedy answers: each token is the target's argmax, recorded during generation
        assert torch.equal(s.top_ids[:, 0].long(), answer)
        assert (s.top_logp[:, :-1] >= s.top_logp[:, 1:]).all()
    # one answer checked against a fresh, unbatched forward of the target
    s = chats[0]
    with torch.no_grad():
        logits = target(input_ids=s.tokens[None]).logits[0, s.start - 1 : -1]
    assert torch.equal(logits.argmax(-1), s.tokens[s.start:])
    # train and held-out conversations are different streams
    assert {tuple(c.tokens.tolist()) for c in chats}.isdisjoint(
        tuple(c.tokens.tolist()) for c in data.heldout_chat)
    assert (folder / "conversations.jsonl").read_text().count("\n") >= 20


def test_generated_data_are_reused_not_regenerated(chat_data, monkeypatch):
    target, tok, recipe, folder, data = chat_data

    def no_generation(*a, **k):
        raise AssertionError("generated again")

    monkeypatch.setattr(target, "generate", no_generation)
    monkeypatch.setattr(target, "forward", no_generation)
    again = distill_data.generate_data(folder, target, tok, recipe, progress_on=False)
    assert [s.tokens.tolist() for s in again.train] == [s.tokens.tolist() for s in data.train]
    with pytest.raises(AssertionError, match="generated again"):  # more data: must generate
        distill_data.generate_data(folder, target, tok, replace(recipe, conversations=40),
                                   progress_on=False)


def test_answered_prompts_add_a_stream_beside_the_same_conversations(chat_data, monkeypatch):
    """A recipe that adds `prompts` reads the conversations already generated and answers
    only the prompts; another prompt set gets a stream of its own."""
    target, tok, recipe, folder, data = chat_data
    with_prompts = replace(recipe, prompts="toy-code", prompt_limit=3)
    assert with_prompts.data_hash12(FP) == recipe.data_hash12(FP)

    def no_queries(*a, **k):
        raise AssertionError("conversations generated again")

    monkeypatch.setattr(distill_data, "sample_queries", no_queries)
    got = distill_data.generate_data(folder, target, tok, with_prompts, progress_on=False)
    chats = [s.tokens.tolist() for s in data.train if s.kind == "chat"]
    assert [s.tokens.tolist() for s in got.train if s.kind == "chat"] == chats
    answered = [s for s in got.train if s.kind == "prompt"]
    assert got.prompts == 3 and len(answered) == 3
    doc_recipe = replace(with_prompts, prompts="toy-doc")
    other = distill_data.generate_data(folder, target, tok, doc_recipe, progress_on=False)
    doc = [s.tokens.tolist() for s in other.train if s.kind == "prompt"]
    assert len(doc) == 3 and doc != [s.tokens.tolist() for s in answered]
    assert len(list(folder.glob("prompts-*.pt"))) == 2


def test_worker_processes_generate_the_same_data(chat_data, chat_target, tmp_path):
    """Batches are seeded one by one: two processes write what one wrote."""
    target, tok, recipe, folder, data = chat_data
    par = distill_data.generate_data(tmp_path, target, tok, recipe, progress_on=False,
                                     workers=2, target_folder=chat_target)
    for a, b in ((par.train, data.train), (par.heldout_chat, data.heldout_chat),
                 (par.heldout_text, data.heldout_text)):
        assert [s.tokens.tolist() for s in a] == [s.tokens.tolist() for s in b]
        assert all(torch.equal(x.top_logp, y.top_logp) for x, y in zip(a, b, strict=True))
    assert not list(tmp_path.glob(".*"))  # plans, claims and worker logs are cleaned up


def test_a_target_without_chat_template_gets_text_only(toy_tiny, tmp_path):
    target, tok = load_target(toy_tiny / "target")
    assert distill_data.user_prefix(tok) is None
    data = distill_data.generate_data(tmp_path, target, tok, get_recipe("tiny"),
                                      progress_on=False)
    assert not data.has_chat and not data.heldout_chat
    assert {s.kind for s in data.train} == {"text"}


# ------------------------------------------------------------------------ the distillation
def test_distillation_lowers_heldout_kl_and_lr_zero_does_not(chat_data):
    target, tok, recipe, folder, data = chat_data
    recipe = replace(recipe, steps=30, lr=3e-3, vocab=0, train_embeddings=True)
    pad = tok.pad_token_id
    results = {}
    for lr in (0.0, 3e-3):
        draft = cut_draft(target, [0])
        before = agreement(draft, data.heldout_text, recipe.seq_len, pad)
        distill(draft, None, data.train, replace(recipe, lr=lr), pad, progress=False)
        results[lr] = (before, agreement(draft, data.heldout_text, recipe.seq_len, pad))
    before, after = results[3e-3]
    assert after["kl_topk"] < before["kl_topk"] - 0.05
    frozen_before, frozen_after = results[0.0]
    assert frozen_after["kl_topk"] == frozen_before["kl_topk"] == before["kl_topk"]


# ------------------------------------------------------------------------ the reduced head
def test_reduced_head_fills_the_rest_and_matches_the_full_head(toy_pair):
    draft = toy_pair.draft
    ids = torch.tensor([0, 2, 5, 17, 100, 311])
    head = reduced_head_from(draft, ids)
    h = torch.randn(3, 7, draft.config.hidden_size)
    full = draft.get_output_embeddings()(h)
    got = head(h)
    assert got.shape == full.shape
    assert torch.allclose(got[..., ids], full[..., ids], atol=1e-6)
    rest = torch.ones(full.shape[-1], dtype=torch.bool)
    rest[ids] = False
    assert (got[..., rest] == torch.finfo(got.dtype).min).all()
    probs = torch.softmax(got, -1)
    assert (probs[..., rest] == 0).all() and torch.allclose(probs.sum(-1), torch.ones(3, 7))
    for bad_ids, msg in (([1, 1], "repeat"), ([-1], "must lie"), ([10**6], "must lie")):
        with pytest.raises(MCSDError, match=msg):
            ReducedHead(torch.tensor(bad_ids), torch.zeros(len(bad_ids), 4), 512)


def test_pick_vocab_keeps_specials_then_the_most_frequent():
    from mcsd_runtime.distill.data import Sequence

    top = torch.tensor([[7, 8], [7, 9], [7, 9], [3, 9]], dtype=torch.int32)
    seq = Sequence("chat", torch.zeros(5, dtype=torch.long), 1, top, torch.zeros(4, 2))
    assert pick_vocab([seq], 3, 20, keep=[0]).tolist() == [0, 3, 7]
    assert pick_vocab([seq], 4, 20, keep=[0]).tolist() == [0, 3, 7, 9]
    with pytest.raises(MCSDError, match="reduced head needs"):
        pick_vocab([seq], 1, 20, keep=[0, 1])


def _reduced_pair(size: int = 24):
    pair = make_pair(vocab=64, eos=3)
    ids = torch.cat([torch.tensor([3]), torch.arange(10, 10 + size - 1)])
    pair.draft.set_output_embeddings(reduced_head_from(pair.draft, ids).to(torch.float64))
    return pair, ids


@pytest.mark.parametrize("k_config", [(1, 1, 1, 1), (4, 2, 2, 1), (3, 1, 1)])
@pytest.mark.parametrize("stopper", ["static", "entropy:0.45:0.1", "confidence:0.2"])
def test_greedy_mcsd_with_a_reduced_head_equals_the_targets_greedy(k_config, stopper):
    pair, ids = _reduced_pair()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 64, (int(n),), generator=gen).tolist() for n in (3, 6, 9, 12)]
    ar = ARDecoder(pair, DecodeConfig(max_new_tokens=20))
    dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, max_new_tokens=20), stopper=stopper)
    drafted = accepted = 0
    for p in prompts:
        want = ar.generate(p).token_ids
        got = dec.generate(p)
        assert got.token_ids == want
        drafted += sum(s.drafted for s in got.steps)
        accepted += sum(s.accepted for s in got.steps)
    assert drafted > 0
    # the draft proposed only tokens of its head: accepted tokens are in the subset
    assert accepted > 0


def test_stopper_features_stay_finite_with_a_reduced_head():
    pair, ids = _reduced_pair()
    with torch.no_grad():
        logits = pair.draft(input_ids=torch.tensor([[5, 6, 7]])).logits[0]
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(2, 1), max_new_tokens=4))
    probs = dec.probs(logits)
    assert (probs[:, torch.isin(torch.arange(64), ids, invert=True)] == 0).all()
    top = probs.topk(2, -1)
    static = torch.tensor([[1.0, 0.0, 2.0], [1.0, 1.0, 2.0]])
    feats = node_features(static, top.values[0], top.values[0].log(), probs[:1])
    assert torch.isfinite(feats).all()
    # the MCSD decoder's own features, through a recorder-free run with the entropy stopper
    assert MCSDDecoder(pair, DecodeConfig(k_config=(2, 1), max_new_tokens=6),
                       stopper="entropy").generate([5, 6, 7]).token_ids


def test_attach_reduced_head_is_a_no_op_without_the_file(toy_tiny, tmp_path):
    from mcsd_runtime.models.pair import load_pair

    folder = tmp_path / "draft"
    shutil.copytree(toy_tiny / "draft", folder)
    plain = load_pair(toy_tiny / "target", folder, device="cpu", dtype="float32")
    assert head_of(plain.draft) is None
    assert attach_reduced_head(plain.draft, tmp_path / "nowhere") is plain.draft
    save_reduced_head(reduced_head_from(plain.draft, torch.arange(0, 40)), folder)
    assert (folder / HEAD_FILE).is_file()
    pair = load_pair(toy_tiny / "target", folder, device="cpu", dtype="float32")
    head = head_of(pair.draft)
    assert head is not None and head.ids.tolist() == list(range(40))
    with torch.no_grad():
        logits = pair.draft(input_ids=torch.tensor([[1, 40, 41]])).logits
    assert (logits[..., 40:] == torch.finfo(torch.float32).min).all()
    assert torch.isfinite(logits[..., :40]).all()


# ------------------------------------------------------------------- the build and the cache
@pytest.fixture(scope="module")
def built(chat_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("built")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(toy_build, "LATENCY_MAX_SECONDS", 0.2)
        out = distill_cache.build_draft(chat_target, get_recipe("tiny", vocab=64),
                                        out=root / "draft-tiny", data=root / "data",
                                        progress=False)
    return out, root


def test_build_writes_a_loadable_draft_and_a_card(built, chat_target):
    from mcsd_runtime.models.pair import load_pair

    out, _ = built
    card = distill_cache.verify_draft(out)
    assert card["recipe"]["vocab"] == 64 and card["draft"]["vocab"] == 64
    assert card["target"]["fingerprint"] == fingerprint(chat_target)
    chat, text = card["metrics"]["heldout_chat"], card["metrics"]["heldout_text"]
    assert chat["positions"] > 0 and 0 <= chat["top1"] <= chat["top4"] <= 1
    assert text["positions"] > 0 and 0 <= text["top1"] <= 1
    assert card["cost_ratio_1thread"] > 0 and card["seconds"]["build"] > 0
    assert (out / "draft" / HEAD_FILE).is_file()
    pair = load_pair(chat_target, out / "draft", device="cpu", dtype="float32")
    assert head_of(pair.draft) is not None
    assert pair.draft.config.num_hidden_layers == 1


def test_a_feature_draft_builds_loads_and_decodes_losslessly(chat_target, tmp_path, capsys):
    from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
    from mcsd_runtime.distill.feature import FC_FILE, is_feature_draft
    from mcsd_runtime.models.pair import load_pair

    out = tmp_path / "fd"
    assert mcsd(["draft", "distill", "--target", str(chat_target), "--recipe", "tiny",
                 "--vocab", "64", "--features", "--out", str(out), "--data",
                 str(tmp_path / "data"), "--threads", "1", "--device", "cpu"]) == 0
    recipe = get_recipe("tiny", vocab=64, features=True)
    card = distill_cache.verify_draft(out, recipe.hash12(fingerprint(chat_target)))
    capsys.readouterr()
    assert mcsd(["draft", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "reading the target's states" in shown and "top-1 on its own states" in shown
    chat = card["metrics"]["heldout_chat"]
    assert card["recipe"]["features"] and chat["positions"] > 0
    assert 0 <= chat["top1"] <= chat["top4"] <= 1 and 0 <= chat["top1_own"] <= 1
    assert (out / "draft" / FC_FILE).is_file()
    pair = load_pair(chat_target, out / "draft", device="cpu", dtype="float32")
    assert is_feature_draft(pair.draft) and head_of(pair.draft) is not None
    prompt = pair.tokenizer("def add(a, b):")["input_ids"]
    config = DecodeConfig(k_config=(2, 1, 1), max_new_tokens=16)
    want = ARDecoder(pair, config).generate(prompt).token_ids
    assert MCSDDecoder(pair, config, "static").generate(prompt).token_ids == want


def test_a_second_build_reuses_the_draft(built, chat_target, monkeypatch):
    out, root = built

    def no_build(*a, **k):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(distill_cache, "_build_into", no_build)
    recipe = get_recipe("tiny", vocab=64)
    assert distill_cache.build_draft(chat_target, recipe, out=out, progress=False) == out
    with pytest.raises(AssertionError, match="rebuilt"):
        distill_cache.build_draft(chat_target, recipe, out=out, force=True, progress=False)
    assert (out / "card.json").is_file()  # a failed rebuild leaves the old draft in place
    with pytest.raises(MCSDError, match="another recipe"):
        distill_cache.build_draft(chat_target, replace(recipe, steps=3), out=out,
                                  progress=False)


def test_default_draft_dir_builds_once_into_the_cache(chat_target, tmp_path, monkeypatch,
                                                     capsys):
    monkeypatch.setenv("MCSD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(PRESETS, "default", replace(PRESETS["tiny"], name="default"))
    with pytest.raises(MCSDError, match="no distilled draft \\(default recipe\\) for .* "
                                        "`mcsd draft distill --target [^ ]* --recipe default` "
                                        ".*or pass build=True"):
        distill_cache.default_draft_dir(chat_target)  # builds only when asked
    got = distill_cache.default_draft_dir(chat_target, build=True, progress=False)
    assert "note: distilling the draft (default recipe)" in capsys.readouterr().err
    assert got.name == "draft" and (got / "config.json").is_file()
    assert got.is_relative_to(tmp_path / "cache" / "models")
    monkeypatch.setattr(distill_cache, "_build_into", lambda *a, **k: 1 / 0)
    assert distill_cache.default_draft_dir(chat_target) == got
    assert distill_cache.default_draft_dir(chat_target, build=True) == got
    assert "note:" not in capsys.readouterr().err  # nothing to build, nothing said
    # another copy of the same target (same config, tokenizer and weights) finds the same draft
    copy = shutil.copytree(chat_target, tmp_path / "elsewhere")
    assert distill_cache.default_draft_dir(copy, build=False) == got
    # another recipe has its own folder, and the command to build it names the recipe
    with pytest.raises(MCSDError, match="no distilled draft \\(tiny recipe\\).* --recipe tiny`"):
        distill_cache.default_draft_dir(chat_target, build=False, recipe="tiny")


def test_a_library_call_never_starts_a_distillation(chat_target, tmp_path, monkeypatch, capsys):
    """`load_pair(target, "distill:R")` of a draft not built yet says how to build it and builds
    nothing; `build=True` (what the commands pass) builds it, saying so on stderr."""
    from mcsd_runtime.models.pair import load_pair, pair_names

    monkeypatch.setenv("MCSD_CACHE", str(tmp_path / "cache"))
    built = []

    def build_draft(folder, recipe, progress=True):
        built.append(recipe.name)
        (tmp_path / "built" / "draft").mkdir(parents=True, exist_ok=True)
        return tmp_path / "built"

    monkeypatch.setattr(distill_cache, "build_draft", build_draft)
    with pytest.raises(MCSDError, match=r"no distilled draft \(features recipe\).* `mcsd draft "
                                        r"distill --target \S+ --recipe features`.*build=True"):
        load_pair(chat_target, "distill:features", device="cpu")
    with pytest.raises(MCSDError, match="--recipe default`"):
        pair_names(chat_target, "distill")
    assert built == [] and "note:" not in capsys.readouterr().err
    assert pair_names(chat_target, "distill", build=True) == (
        str(chat_target), str(tmp_path / "built" / "draft"))
    assert built == ["default"]
    assert "note: distilling the draft (default recipe)" in capsys.readouterr().err


# --------------------------------------------------------------------------- the command
def test_cli_distills_and_shows(chat_target, tmp_path, capsys):
    out = tmp_path / "d"
    assert mcsd(["draft", "distill", "--target", str(chat_target), "--recipe", "tiny",
                 "--layer-ids", "1", "--steps", "4", "--out", str(out), "--data",
                 str(tmp_path / "data"), "--threads", "1", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip().endswith(str(out / "draft"))
    card = distill_cache.read_card(out)
    assert card["draft"]["layer_ids"] == [1] and card["build_machine"]["device"] == "cpu"
    assert mcsd(["draft", "show", str(out / "draft")]) == 0
    shown = capsys.readouterr().out
    assert "agreement, chat    top-1" in shown and "%" in shown and "cost ratio" in shown


@pytest.mark.parametrize("argv, message", [
    (["--target", "no-such-model"], "unknown target 'no-such-model'"),
    (["--target", "toy:tiny", "--layer-ids", "a,b"], "comma-separated integers"),
    (["--target", "toy:tiny", "--threads", "-1"], "--threads must be 0 (torch's own default)"),
    (["--target", "toy:tiny", "--device", "tpu:0"], "unknown device 'tpu:0'"),
])
def test_cli_distill_errors(argv, message, capsys):
    assert mcsd(["draft", "distill", "--recipe", "tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_errors_on_bad_layers_and_folders(chat_target, tmp_path, capsys):
    assert mcsd(["draft", "distill", "--target", str(chat_target), "--recipe", "tiny",
                 "--layer-ids", "0,9", "--out", str(tmp_path / "x"), "--data",
                 str(tmp_path / "data")]) == 2
    assert "layer ids must lie in 0..1" in capsys.readouterr().err
    assert mcsd(["draft", "show", str(tmp_path)]) == 2
    assert "card.json is missing" in capsys.readouterr().err
    assert mcsd(["draft", "distill", "--target", str(tmp_path), "--recipe", "tiny"]) == 2
    assert "holds no model" in capsys.readouterr().err


def test_negative_layer_ids_count_from_the_end():
    from mcsd_runtime.backend.layers import check_layer_ids

    assert check_layer_ids([-1], 30) == [29] and check_layer_ids([0, -1], 30) == [0, 29]
    for bad in ([-31], [29, -1], [30]):
        with pytest.raises(MCSDError, match="layer ids"):
            check_layer_ids(bad, 30)
