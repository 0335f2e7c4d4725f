"""vLLM as a second runtime (`mcsd eval --engine vllm`, `mcsd_runtime.serving`).

- exact in the real engine: in fp32, every speculative method's greedy outputs (vLLM's ngram,
  a K-by-batch-size table, the toolkit's learned-lookup proposer class) equal vLLM plain's, at
  concurrency 1 and 3, on a random tiny Llama;
- each method drafts what it should: ngram drafts and some drafts are accepted; the table drafts
  at concurrency 1 and nothing where its band says K=0; the proposer drafts chains no longer
  than its policy allows;
- bad input: vLLM missing names the extra, another version names the supported one, unknown
  methods, a method list without ar and decoder-only options are refused before any engine
  starts.

One set of engines (in-process, about 10 s each to start) serves the whole module.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.serving import vllm_engine
from mcsd_runtime.serving.vllm_methods import parse_method, parse_methods

VOCAB, TOKENS = 128, 24


def _tiny_target(folder) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=256, initializer_range=0.3, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).eval().save_pretrained(folder)
    return str(folder)


def _copy_policy(folder) -> str:
    """A learned copy length fitted on synthetic rows: copies more where the match is longer."""
    import lightgbm as lgb

    from mcsd_runtime.decisions.copy_length import FEATURES, CopyLength

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 4, size=(400, len(FEATURES)))
    y = (x[:, 0] + rng.normal(0, 0.5, 400) > x[:, -1]).astype(int)
    booster = lgb.train({"objective": "binary", "verbose": -1, "num_leaves": 4},
                        lgb.Dataset(x, y), num_boost_round=5)
    CopyLength(booster, [0.01 * (1 + 0.1 * k) for k in range(5)], 10.0, 1, 3).save(
        folder, booster.model_to_string())
    return str(folder)


def _schedule(folder) -> str:
    from mcsd_runtime.serving.schedule import Schedule

    Schedule(bands=((1, 2, 3), (3, None, 0)),
             meta={"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}).write(
        folder)
    return str(folder)


def _prompts() -> list[tuple[str, list[int]]]:
    rng = np.random.default_rng(1)
    out = []
    for i in range(6):
        seg = rng.integers(0, VOCAB, 5).tolist()
        out.append((f"p{i}", seg + rng.integers(0, VOCAB, 3).tolist() + seg * 2))
    return out


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    """Every method's records at concurrency 1 and 3 (concurrency -> records)."""
    pytest.importorskip("vllm")
    from mcsd_runtime.serving.vllm_eval import VllmRun, evaluate

    root = tmp_path_factory.mktemp("vllm")
    methods = ["ar", "ngram:3:1:3", f"table:{_schedule(root / 'schedule')}",
               f"proposer:{_copy_policy(root / 'copy')}"]
    run = VllmRun(model=_tiny_target(root / "target"),
                  methods=tuple(parse_method(m) for m in methods), concurrency=(1, 3),
                  dtype="float32", max_new_tokens=TOKENS, ignore_eos=True, in_process=True)
    return evaluate(run, _prompts(), log=lambda _: None, progress=False), methods


def test_every_method_equals_vllm_plain_in_fp32(decoded):
    by_c, methods = decoded
    for c, records in by_c.items():
        ar = {r.prompt_id: r.token_ids for r in records if r.method == "ar"}
        assert len(ar) == 6 and all(len(t) == TOKENS for t in ar.values())
        for m in methods[1:]:
            mine = {r.prompt_id: r.token_ids for r in records if r.method == m}
            assert mine == ar, f"{m} at concurrency {c}"


def test_each_method_drafts_what_it_should(decoded):
    by_c, methods = decoded
    ngram, table, proposer = methods[1:]

    def totals(c, m):
        steps = [s for r in by_c[c] if r.method == m for s in r.steps]
        return sum(d for d, _ in steps), sum(a for _, a in steps), steps

    drafted, accepted, steps = totals(1, ngram)
    assert drafted > 0 and accepted > 0 and all(0 < d <= 3 and a <= d for d, a in steps)
    assert totals(1, table)[0] > 0  # band 1-2: K=3
    assert totals(3, table)[0] == 0  # band 3+: K=0, no speculation
    drafted, _, steps = totals(1, proposer)
    assert drafted > 0 and all(d <= 4 for d, _ in steps)  # at most its costs' length
    assert all(r.steps == [] for r in by_c[1] if r.method == "ar")


def test_waves_pair_above_concurrency_one(decoded):
    by_c, _ = decoded
    assert all(r.batch_id is None for r in by_c[1])
    waves = {r.batch_id for r in by_c[3]}
    assert waves == {"wave0000", "wave0001"}
    assert all(r.batch_tokens_per_s > 0 for r in by_c[3])


def test_methods_are_checked_before_any_engine_starts(tmp_path):
    with pytest.raises(MCSDError, match="add ar to --methods"):
        parse_methods("ngram:4")
    with pytest.raises(MCSDError, match="does not run with --engine vllm"):
        parse_method("static:2")
    with pytest.raises(MCSDError, match="ngram:K or ngram:K:MIN:MAX"):
        parse_method("ngram:4:2")
    with pytest.raises(MCSDError, match="MIN 5 is above MAX 2"):
        parse_method("ngram:4:5:2")
    with pytest.raises(MCSDError, match="not a learned copy length"):
        parse_method(f"proposer:{tmp_path}")
    with pytest.raises(MCSDError, match="no schedule at"):
        parse_method(f"table:{tmp_path}")
    assert parse_method("ngram:4").speculative == {"method": "ngram", "num_speculative_tokens": 4}


def test_missing_or_other_vllm_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(MCSDError, match=r"pip install -e \"\.\[vllm\]\""):
        vllm_engine.require_vllm()

    class Other:
        __version__ = "0.31.2"

    monkeypatch.setitem(sys.modules, "vllm", Other)
    with pytest.raises(MCSDError, match="vLLM 0.31.2 is installed; this toolkit drives vLLM 0.32"):
        vllm_engine.require_vllm()


def test_the_command_refuses_decoder_options(capsys):
    from mcsd_runtime.cli import main

    code = main(["eval", "--engine", "vllm", "--target", "toy:tiny", "--batch-size", "4"])
    err = capsys.readouterr().err
    assert code != 0 and "does not take --batch-size (use --concurrency)" in err
    assert "Traceback" not in err
    code = main(["eval", "--target", "toy:tiny", "--concurrency", "4"])
    assert code != 0 and "--concurrency is for --engine vllm" in capsys.readouterr().err
