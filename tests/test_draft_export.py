"""A distilled draft exported for vLLM's draft-model speculation (`serving.draft_export`) and
the `draft:K` method (`serving.vllm_methods`), without vLLM:

- the export loads in transformers with an untied head: its logits on the kept tokens are the
  reduced-head draft's, every other token's exactly 0; tokenizer files come along;
- an export is reused while its source is unchanged, redone when it changes, and an interrupted
  one leaves no folder that looks complete;
- `draft:K` becomes vLLM's draft_model config; bad K, a missing draft and a target without a
  default draft are refused, and a method list without `draft:` resolves no draft.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from mcsd_runtime.distill.head import HEAD_FILE, ReducedHead, attach_reduced_head, save_reduced_head
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.serving import draft_export
from mcsd_runtime.serving.draft_export import export_for_vllm, head_agreement
from mcsd_runtime.serving.vllm_methods import parse_method, parse_methods

VOCAB, WIDTH = 64, 32
KEPT = torch.tensor([0, 2, 3, 7, 11, 20, 33, 40, 41, 63])


def _draft(folder: Path, seed: int = 0) -> Path:
    """A tiny tied-embedding Llama with a reduced head over KEPT (random rows, not its own) and
    a tokenizer file and chat template beside it, as a distilled draft's folder holds."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, initializer_range=0.3, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).eval().save_pretrained(folder)
    save_reduced_head(ReducedHead(KEPT, torch.randn(len(KEPT), WIDTH), VOCAB), folder)
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    return folder


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.fixture
def src(tmp_path) -> Path:
    return _draft(tmp_path / "draft")


def test_the_export_scores_kept_tokens_as_the_reduced_head_and_others_zero(src, tmp_path):
    out = export_for_vllm(src, tmp_path / "export")
    reduced = attach_reduced_head(AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32),
                                  src).eval()
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    a, b = _logits(reduced, ids), _logits(exported, ids)
    other = torch.ones(VOCAB, dtype=torch.bool)
    other[KEPT] = False
    assert torch.allclose(b[..., KEPT], a[..., KEPT], atol=1e-6, rtol=1e-5)
    assert (b[..., other] == 0).all()
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    head, emb = exported.get_output_embeddings().weight, exported.get_input_embeddings().weight
    assert head.data_ptr() != emb.data_ptr()
    assert not (out / HEAD_FILE).exists()
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    stats = head_agreement(reduced, exported, KEPT, ids.tolist())
    assert stats["positions"] == 24 and stats["argmax_differs"] <= stats[
        "kept_logits_all_nonpositive"]
    assert 0 < stats["nonkept_mass_mean"] <= stats["nonkept_mass_max"] < 1


def test_an_export_is_reused_until_its_source_changes(src, tmp_path, monkeypatch):
    out = export_for_vllm(src, tmp_path / "export")
    before = (out / "model.safetensors").stat().st_mtime_ns, json.loads(
        (out / "export.json").read_text())["fingerprint"]

    def refuse(*_):
        raise AssertionError("a current export was written again")

    with monkeypatch.context() as mp:
        mp.setattr(draft_export, "write_export", refuse)
        assert export_for_vllm(src, out) == out
    assert ((out / "model.safetensors").stat().st_mtime_ns,
            json.loads((out / "export.json").read_text())["fingerprint"]) == before

    rows = torch.full((len(KEPT), WIDTH), 0.5)
    save_reduced_head(ReducedHead(KEPT, rows, VOCAB), src)  # the source changes
    export_for_vllm(src, out)
    assert json.loads((out / "export.json").read_text())["fingerprint"] != before[1]
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert torch.equal(exported.get_output_embeddings().weight[KEPT], rows)


def test_an_interrupted_export_leaves_no_complete_looking_folder(src, tmp_path, monkeypatch):
    import safetensors.torch

    out = tmp_path / "exports" / "draft"

    def half_written(tensors, path, metadata=None):
        Path(path).write_bytes(b"\0" * 100)
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", half_written)
    with pytest.raises(KeyboardInterrupt):
        export_for_vllm(src, out)
    assert not out.exists() and list(out.parent.iterdir()) == []
    monkeypatch.undo()
    assert export_for_vllm(src, out) == out
    assert draft_export.is_current(out, draft_export.source_fingerprint(src.resolve()))


def test_a_draft_without_reduced_head_is_its_own_export(src, tmp_path):
    (src / HEAD_FILE).unlink()
    assert export_for_vllm(src, tmp_path / "export") == src.resolve()
    assert not (tmp_path / "export").exists()


def test_drafts_vllm_cannot_run_are_refused(src, tmp_path):
    with pytest.raises(MCSDError, match="no draft model at"):
        export_for_vllm(tmp_path / "nothing", tmp_path / "export")
    (src / "feature_fc.safetensors").write_bytes(b"")
    with pytest.raises(MCSDError, match="reads the target's hidden states"):
        export_for_vllm(src, tmp_path / "export")


def test_draft_k_is_vllms_draft_model_config(tmp_path):
    assert parse_method("draft:3", draft=tmp_path).speculative == {
        "method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 3}
    calls = []

    def find() -> Path:
        calls.append(1)
        return tmp_path

    methods = parse_methods("ar,draft:2,ngram:2,draft:4", draft=find)
    assert [m.label for m in methods] == ["ar", "draft:2", "ngram:2", "draft:4"]
    assert [m.speculative["num_speculative_tokens"] for m in methods[1:]] == [2, 2, 4]
    assert calls == [1]  # resolved once for every draft: method


def _never() -> Path:
    raise AssertionError("a draft was resolved")


@pytest.mark.parametrize(("text", "match"), [
    ("ar,draft:0", "K must be at least 1"),
    ("ar,draft:x", r"use draft:K"),
    ("ar,draft:", r"use draft:K"),
    ("ar,draft:2,draft:-1", "K must be at least 1"),
    ("ar,draft:2,static:1", "does not run with --engine vllm"),
])
def test_bad_draft_specs_fail_before_a_draft_is_resolved(text, match):
    with pytest.raises(MCSDError, match=match):
        parse_methods(text, draft=_never)


def test_methods_without_a_draft_resolve_none_and_a_missing_draft_is_named():
    assert [m.label for m in parse_methods("ar,ngram:2", draft=_never)] == ["ar", "ngram:2"]
    with pytest.raises(MCSDError, match="needs the draft vLLM loads"):
        parse_method("draft:2")
    with pytest.raises(MCSDError, match="draft:K"):
        parse_method("draft")


def test_the_default_draft_is_the_pairs_own(monkeypatch, tmp_path):
    from mcsd_runtime.models import pair

    with pytest.raises(MCSDError, match="brings no default draft"):
        draft_export.default_draft(str(tmp_path))
    seen = []
    monkeypatch.setattr(pair, "pair_names",
                        lambda t, d, build: seen.append((t, d, build)) or ("T", str(tmp_path)))
    assert draft_export.default_draft("smollm2", build=False) == tmp_path
    assert seen == [("smollm2", None, False)]
