"""`generate(custom_generate=mcsd_generate)`: inputs it refuses, the `verify=` it passes on, and
a trained stopper reloaded when its stopper.json changes."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch
from transformers import DynamicCache, GenerationConfig

from mcsd_runtime.backend.compat import cache_kwargs
from mcsd_runtime.decisions.artifact import FORMAT
from mcsd_runtime.decisions.features import DECISION_FEATURES, SCHEMA_VERSION
from mcsd_runtime.decode import speculative_sampling as V
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.integrations.hf import generate as mcsd_generate

PROMPT = [5, 9, 2]
K = (2, 2, 1)


def run(pair, prompt=PROMPT, draft=None, **kw):
    x = torch.tensor([prompt])
    kw = {"max_new_tokens": 6, "do_sample": False, "k_config": K} | kw
    return pair.target.generate(x, attention_mask=torch.ones_like(x),
                                custom_generate=mcsd_generate,
                                draft_model=pair.draft if draft is None else draft, **kw)


def direct(pair, max_length: int = len(PROMPT) + 4, **kw):
    """`mcsd_generate` called as generate() calls it, for inputs generate() itself would stop
    before they reach it (an encoder-decoder's encoder, a max_length within the prompt)."""
    cfg = GenerationConfig(max_length=max_length, num_beams=1, do_sample=False,
                           return_dict_in_generate=False)
    kw = {"draft_model": pair.draft, "k_config": K} | kw
    return mcsd_generate(pair.target, torch.tensor([PROMPT]), generation_config=cfg, **kw)


def test_direct_call_decodes(pair):
    ref = pair.target.generate(torch.tensor([PROMPT]), attention_mask=torch.ones(1, 3).long(),
                               max_new_tokens=4, do_sample=False)
    assert torch.equal(direct(pair), ref)  # the helper below reaches the decoder


def test_encoder_decoder_models_are_refused(pair, monkeypatch):
    monkeypatch.setattr(pair.target.config, "is_encoder_decoder", True)
    with pytest.raises(MCSDError, match="decoder-only models, not encoder-decoders"):
        direct(pair)


def test_inputs_embeds_are_refused(pair):
    embeds = pair.target.get_input_embeddings()(torch.tensor([PROMPT]))
    with pytest.raises(MCSDError, match="takes input_ids, not inputs_embeds"):
        direct(pair, inputs_embeds=embeds)


def test_a_filled_cache_is_refused(pair):
    cache = DynamicCache()
    with torch.no_grad():
        pair.target(torch.tensor([PROMPT]), **cache_kwargs(pair.target, cache), use_cache=True)
    assert cache.get_seq_length() == len(PROMPT)
    with pytest.raises(MCSDError, match="do not pass past_key_values"):
        run(pair, **cache_kwargs(pair.target, cache))  # the name this transformers takes


def test_draft_of_another_dtype_is_refused(pair):
    draft = copy.deepcopy(pair.draft).to(torch.float32)
    with pytest.raises(MCSDError, match="in torch.float32, the target on cpu in torch.float64: "
                                        "load both on one device, one dtype"):
        run(pair, draft=draft)


def test_draft_on_another_device_is_refused(pair, monkeypatch):
    draft = copy.deepcopy(pair.draft)
    draft.__class__ = type("Elsewhere", (type(draft),),
                           {"device": property(lambda _: torch.device("meta"))})
    with pytest.raises(MCSDError, match="the draft is on meta in torch.float64, the target on "
                                        "cpu"):
        direct(pair, draft_model=draft)


def test_max_length_within_the_prompt_is_refused(pair):
    with pytest.raises(MCSDError, match=r"max_length \(3\) leaves no room after the prompt "
                                        r"\(3 tokens\): pass max_new_tokens"):
        direct(pair, max_length=3)


@pytest.mark.parametrize("verify", ["mcss", "mcss-replacement", "naive"])
def test_verify_reaches_the_verifier(pair, verify, monkeypatch):
    seen = []
    original = V.verify_children

    def recording(p, q, cands, mode, generator):
        seen.append(mode)
        return original(p, q, cands, mode, generator)

    monkeypatch.setattr(V, "verify_children", recording)
    torch.manual_seed(0)
    out = run(pair, do_sample=True, top_k=0, temperature=1.0, verify=verify)
    assert out.shape[1] == len(PROMPT) + 6
    assert seen and set(seen) == {verify}


def test_unknown_verifier_is_refused(pair):
    with pytest.raises(MCSDError, match="unknown verifier 'exact'"):
        run(pair, do_sample=True, top_k=0, verify="exact")


def _artifact(folder, threshold: float, k_config=K) -> None:
    """A LightGBM stopper artifact for `k_config` trees, fit on random rows to continue where
    the draft's q(x) exceeds 0.4 (its scores lie in (0, 1): threshold 0 always continues,
    threshold 2 always stops)."""
    import lightgbm as lgb

    rng = np.random.default_rng(0)
    x = rng.uniform(size=(400, len(DECISION_FEATURES)))
    y = (x[:, DECISION_FEATURES.index("draft_prob")] > 0.4).astype(float)
    booster = lgb.train({"objective": "binary", "verbose": -1, "num_threads": 1},
                        lgb.Dataset(x, y,
                                    feature_name=list(DECISION_FEATURES)), num_boost_round=3)
    folder.mkdir(exist_ok=True)
    booster.save_model(str(folder / "model.txt"))
    spec = {"format": FORMAT, "kind": "lightgbm", "schema_version": SCHEMA_VERSION,
            "feature_names": list(DECISION_FEATURES), "aggregation": "max",
            "threshold": threshold, "k_config": list(k_config)}
    (folder / "stopper.json").write_text(json.dumps(spec))


def test_trained_stopper_is_reloaded_when_stopper_json_changes(pair, tmp_path):
    folder = tmp_path / "stopper"
    _artifact(folder, threshold=0.0)

    def drafted() -> set[int]:
        out = run(pair, max_new_tokens=12, stopper=f"stopper:{folder}",
                  return_dict_in_generate=True)
        return {s.drafted for s in out.mcsd.steps if s.drafted}

    assert max(drafted()) == 3  # always continues
    assert max(drafted()) == 3  # loaded once, reused
    spec = json.loads((folder / "stopper.json").read_text())
    (folder / "stopper.json").write_text(json.dumps(spec | {"threshold": 2.0}))
    st = (folder / "stopper.json").stat()
    os.utime(folder / "stopper.json", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert drafted() == {1}  # the new threshold: stops after depth 1
