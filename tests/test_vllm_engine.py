"""vLLM as a second runtime (`mcsd eval --engine vllm`, `mcsd_runtime.serving`).

- exact in the real engine: in fp32, every speculative method's greedy outputs (vLLM's ngram,
  a K-by-batch-size table, the toolkit's proposer class over a learned copy length, over the
  draft's chain under a stopper and over both, a draft model with a reduced head exported for
  vLLM) equal vLLM plain's, at concurrency 1 and 3, on a random tiny
  Llama;
- each method drafts what it should: ngram drafts and some drafts are accepted; the table drafts
  at concurrency 1 and nothing where its band says K=0; the proposer drafts chains no longer
  than its policy allows; the draft model drafts K tokens a step and some are accepted;
- bad input: vLLM missing names the extra, another version names the supported one, unknown
  methods, a method list without ar, decoder-only options and a draft whose head size vLLM's
  CPU attention does not run are refused before any engine starts.

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


def tiny_target(folder, vocab: int = VOCAB, seed: int = 3, init: float = 0.3,
                positions: int = 256) -> str:
    """A random tiny Llama saved in `folder` (heads of 32, which vLLM's CPU attention runs)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=positions, initializer_range=init,
                      bos_token_id=None,
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


def _draft(folder, target: str) -> str:
    """A draft for the tiny target as the distillation leaves one, exported for vLLM: the
    target's weights with noise, and a reduced head over 96 of its tokens."""
    from transformers import LlamaForCausalLM

    from mcsd_runtime.distill.head import reduced_head_from, save_reduced_head
    from mcsd_runtime.serving.draft_export import export_for_vllm

    model = LlamaForCausalLM.from_pretrained(target)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(folder / "draft")
    kept = torch.randperm(VOCAB, generator=gen)[:96].sort().values
    save_reduced_head(reduced_head_from(model, kept), folder / "draft")
    return str(export_for_vllm(folder / "draft", folder / "export"))


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
    copy = _copy_policy(root / "copy")
    methods = ["ar", "ngram:3:1:3", f"table:{_schedule(root / 'schedule')}",
               f"proposer:{copy}", "draft:2", "proposer:static:3", f"proposer:{copy}+static:2"]
    target = tiny_target(root / "target")
    draft = _draft(root, target)
    run = VllmRun(model=target, methods=tuple(parse_method(m, draft) for m in methods),
                  concurrency=(1, 3),
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
    ngram, table, proposer = methods[1:4]

    def totals(c, m):
        steps = [s for r in by_c[c] if r.method == m for s in r.steps]
        return sum(d for d, _ in steps), sum(a for _, a in steps), steps

    drafted, accepted, steps = totals(1, ngram)
    assert drafted > 0 and accepted > 0 and all(0 < d <= 3 and a <= d for d, a in steps)
    assert totals(1, table)[0] > 0  # band 1-2: K=3
    assert totals(3, table)[0] == 0  # band 3+: K=0, no speculation
    drafted, _, steps = totals(1, proposer)
    assert drafted > 0 and all(d <= 4 for d, _ in steps)  # at most its costs' length
    # the draft's chain under a stopper (static:3: three tokens a step), alone and where the
    # copy length copies nothing
    drafted, accepted, steps = totals(1, methods[5])
    assert accepted > 0 and {d for d, _ in steps} == {3}
    drafted, accepted, steps = totals(1, methods[6])
    assert accepted > 0 and 2 in {d for d, _ in steps} and all(d <= 4 for d, _ in steps)
    assert all(r.steps == [] for r in by_c[1] if r.method == "ar")


def test_a_draft_model_drafts_and_changes_no_output(decoded):
    """draft:2 on the exported draft: vLLM plain's outputs, K=2 drafts a step, some accepted."""
    by_c, methods = decoded
    assert "draft:2" in methods
    for c, records in by_c.items():
        ar = {r.prompt_id: r.token_ids for r in records if r.method == "ar"}
        mine = {r.prompt_id: r.token_ids for r in records if r.method == "draft:2"}
        assert mine == ar, f"draft:2 at concurrency {c}"
        steps = [s for r in records if r.method == "draft:2" for s in r.steps]
        assert steps and all(d == 2 and 0 <= a <= d for d, a in steps)
        assert sum(a for _, a in steps) > 0


def test_a_draft_whose_heads_vllms_cpu_attention_cannot_run_is_refused(tmp_path):
    """vLLM checks the target's head size, not the draft's: a draft with heads of 16 (the tiny
    toy pair's) would start, then fail at its first step."""
    pytest.importorskip("vllm")
    (tmp_path / "config.json").write_text('{"hidden_size": 32, "num_attention_heads": 2}')
    with pytest.raises(MCSDError, match="heads of size 16, which vLLM's CPU attention"):
        parse_method("draft:2", draft=tmp_path)


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


def test_ar_sync_starts_plain_vllm_without_async_scheduling(monkeypatch):
    """`ar:sync` is vLLM plain with async scheduling off (as vLLM runs every host proposer);
    `ar` leaves it to vLLM."""
    pytest.importorskip("vllm")
    import vllm

    from mcsd_runtime.serving.vllm_eval import VllmRun, engine_config

    started = []

    class Recorded:
        def __init__(self, **kwargs) -> None:
            started.append(kwargs)

    monkeypatch.setattr(vllm, "LLM", Recorded)
    methods = parse_methods("ar,ar:sync")
    assert [(m.label, m.speculative, m.async_scheduling) for m in methods] == [
        ("ar", None, None), ("ar:sync", None, False)]
    run = VllmRun(model="m", methods=tuple(methods), concurrency=(1,), dtype="float32",
                  max_new_tokens=4, ignore_eos=True, in_process=False)
    for m in methods:
        vllm_engine.start_engine(engine_config(run, m))
    assert "async_scheduling" not in started[0] and started[1]["async_scheduling"] is False
    with pytest.raises(MCSDError, match="does not run with --engine vllm"):
        parse_method("ar:fast")


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
