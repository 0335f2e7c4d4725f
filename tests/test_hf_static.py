"""`hf-static[:compile|eager]`: the target's own generate() on a static cache, compiled on CUDA
by default. On the CPU it runs eager: greedily its output is `hf`'s and `ar`'s token for token;
its name parses, its warm-up (when compiled) comes once per cache size, untimed, with no hooks
on the model."""

from __future__ import annotations

import pytest
import torch

from mcsd_runtime.decode.decoder import DecodeConfig
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate.loop import run_eval
from mcsd_runtime.evaluate.methods import (
    check_batch_methods,
    check_method,
    explicit_methods,
    is_hf_reference,
    parse_hf_static,
    split_methods,
)
from mcsd_runtime.evaluate.runners import HFGenerate, build_method, static_cache_kwargs
from mcsd_runtime.evaluate.stats import summarize
from mcsd_runtime.prompts.sets import load_prompts

TOKENS = 16


def outputs(records) -> dict[str, dict[str, list[int]]]:
    """method -> prompt id -> new tokens."""
    out: dict[str, dict[str, list[int]]] = {}
    for r in records:
        out.setdefault(r.method, {})[r.prompt_id] = r.token_ids
    return out


def assert_equal_outputs(records, methods: list[str]) -> None:
    """Every method's output equals the first's on every prompt, token for token."""
    by = outputs(records)
    ref = by[methods[0]]
    for m in methods[1:]:
        for pid, tokens in ref.items():
            assert by[m][pid] == tokens, f"{m} differs from {methods[0]} on {pid}"


@pytest.fixture(scope="module")
def prompts():
    return load_prompts("toy-code", limit=3)


def test_hf_static_equals_hf_and_ar_greedily(toy_pair, prompts):
    assert next(toy_pair.target.parameters()).dtype == torch.float32
    records = run_eval(toy_pair, prompts, ["ar", "hf", "hf-static"],
                       DecodeConfig(k_config=(1,), max_new_tokens=TOKENS), progress=False)
    assert_equal_outputs(records, ["hf", "ar", "hf-static"])
    for r in records:
        if r.method == "hf-static":  # eager on the CPU: its forwards hooked like hf's
            assert r.new_tokens == r.target_calls == TOKENS and r.forward_time > 0
            assert r.hf_divergence is None and r.lossless
    rows = {r["method"]: r for r in summarize(records, greedy=True)}
    assert rows["hf-static"]["hf_equal_share"] == rows["hf-static"]["ar_equal_share"] == 1.0


def test_the_equality_check_catches_a_dropped_token(toy_pair, prompts, monkeypatch):
    """The same run with hf-static's generate() losing its last token: the check above fails,
    and the report's hf-equal share falls."""
    target = toy_pair.target
    real = target.generate

    def broken(*args, **kwargs):
        out = real(*args, **kwargs)
        return out[:, :-1] if kwargs.get("cache_implementation") == "static" else out

    monkeypatch.setattr(target, "generate", broken)
    records = run_eval(toy_pair, prompts[:1], ["hf", "hf-static"],
                       DecodeConfig(k_config=(1,), max_new_tokens=TOKENS), progress=False)
    with pytest.raises(AssertionError, match="hf-static differs from hf"):
        assert_equal_outputs(records, ["hf", "hf-static"])
    rows = {r["method"]: r for r in summarize(records, greedy=True)}
    assert rows["hf-static"]["hf_equal_share"] == 0.0


def test_the_static_cache_is_asked_for_and_compiled_only_on_cuda_by_default(toy_pair):
    assert static_cache_kwargs(False, "cuda") == {"cache_implementation": "static",
                                                   "disable_compile": True}
    assert static_cache_kwargs(True, "cuda:0") == {"cache_implementation": "static"}
    forced = static_cache_kwargs(True, "cpu")["compile_config"]
    assert forced._compile_all_devices and forced.mode == "reduce-overhead"
    base = DecodeConfig(max_new_tokens=4)
    for name, compiled in (("hf-static", False), ("hf-static:eager", False),
                           ("hf-static:compile", True)):
        runner = build_method(name, toy_pair, base)  # no compiling: nothing is generated
        assert isinstance(runner, HFGenerate) and runner.compiled == compiled, name
        assert runner.cache_kwargs["cache_implementation"] == "static"


def test_compiled_warm_up_comes_once_per_cache_size_untimed_and_unhooked(toy_pair, monkeypatch):
    """Compiled (compiling itself left out: too slow on a CPU), each new cache size costs one
    generate() before the timed one; no hook is on the model while it runs, and target calls
    are one per new token."""
    target = toy_pair.target
    real = target.generate
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[0].shape[1])
        assert not target._forward_pre_hooks and not target._forward_hooks
        return real(*args, **kwargs)

    monkeypatch.setattr(target, "generate", spy)
    monkeypatch.delattr(target, "_previous_max_cache_length", raising=False)
    runner = HFGenerate(toy_pair, DecodeConfig(max_new_tokens=4), static=True, compiled=True)
    runner.cache_kwargs = static_cache_kwargs(False, "cpu")  # a static cache, eager
    for prompt, generates in (([5, 9, 13], 2), ([5, 9, 13], 1), ([7, 8, 9, 10, 11], 2),
                              ([3, 4], 1)):  # a shorter prompt: the larger cache, warmed
        calls.clear()
        rec = runner.generate(prompt)
        assert calls == [len(prompt)] * generates
        assert rec.target_calls == rec.new_tokens == 4 and rec.forward_time == 0.0
    assert runner.warmed == {6, 8}


def test_hf_static_names():
    for name in ("hf-static", "hf-static:compile", "hf-static:eager"):
        check_method(name)
        assert is_hf_reference(name)
    assert [parse_hf_static(m) for m in ("hf-static", "hf-static:compile", "hf", "static:1")] == [
        "auto", "compile", None, None]
    assert split_methods("ar,hf-static:eager,mcsd:2,1") == ["ar", "hf-static:eager", "mcsd:2,1"]
    assert explicit_methods(["hf", "hf-static"], (2, 1)) == ["hf", "hf-static"]
    for bad in ("hf-static:", "hf-static:fast", "hf-static:compile:eager"):
        with pytest.raises(MCSDError, match=f"method '{bad}': use hf-static .*hf-static:eager"):
            check_method(bad)
    with pytest.raises(MCSDError, match=r"unknown method 'warp-drive': .*hf-static\[:compile"):
        check_method("warp-drive")
    with pytest.raises(MCSDError, match="hf-static:eager decode one sequence"):
        check_batch_methods(["ar", "hf-static:eager"], 4)
