"""Sampled verification in vLLM's CPU build, with the toolkit's fix (`serving.vllm_fixes`).

- `expand_at_dtype` repeats each request's value over its positions at the caller's dtype and
  rewrites `replace_from` first, as vLLM's Triton `expand_kernel` does;
- vLLM 0.32's CPU stand-in leaves a float output unwritten (vLLM issue #55005), and `apply`
  replaces it with code that writes it, once;
- lossless at T=0.7: a proposer that drafts one fixed token after each request's first token
  leaves the second token's distribution that of vLLM plain (a two-sample chi-square over 800
  seeded requests each, on a random tiny Llama in fp32). Without the fix the test fails
  (docs/mutants.md).
"""

from __future__ import annotations

import os
import types
from collections import Counter

import numpy as np
import pytest
import torch
from test_vllm_engine import tiny_target

from mcsd_runtime.serving import vllm_fixes

VOCAB, N, FIXED_ENV = 64, 800, "MCSD_TEST_FIXED_DRAFT"


class FixedDraft:
    """vLLM's custom proposer class drafting the token in $MCSD_TEST_FIXED_DRAFT for every row
    past its prefill."""

    def __init__(self, vllm_config) -> None:
        self.token = int(os.environ[FIXED_ENV])

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        return [[self.token] if sampled else [] for sampled in sampled_token_ids]

    def load_model(self, *args, **kwargs) -> None:
        pass


def test_expand_at_dtype_repeats_each_value_over_its_positions():
    out = torch.full((6,), -1.0)
    vllm_fixes.expand_at_dtype(out, torch.tensor([0.7, 0.0, 1.5]),
                               torch.tensor([2, 5, 5], dtype=torch.int32), 0, 1)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, -1.0])  # 0 -> 1; 6th unused
    ints = torch.zeros(3, dtype=torch.int32)
    vllm_fixes.expand_at_dtype(ints, torch.tensor([5, 9], dtype=torch.int32),
                               torch.tensor([1, 3]), 0, 0)
    assert ints.tolist() == [5, 9, 9] and ints.dtype == torch.int32


def test_the_cpu_stand_in_is_defective_and_apply_replaces_it_once():
    pytest.importorskip("vllm")
    from vllm.utils import cpu_triton_utils as shim

    code = vllm_fixes.ORIGINAL_CODE.get("cpu-expand", shim._expand_kernel_impl.__code__)
    original = types.FunctionType(code, shim.__dict__, "original", (None,))
    assert vllm_fixes.expand_is_broken(original)  # vLLM's own: the output is never written
    vllm_fixes.apply()
    assert not vllm_fixes.expand_is_broken(shim._expand_kernel_impl)
    assert vllm_fixes.apply() == []


def _second_tokens(target: str, speculative: dict | None, env: dict) -> list[int]:
    """The second new token of N requests of one prompt, request i sampled at T=0.7 with seed
    i, on an in-process engine."""
    from mcsd_runtime.serving.vllm_engine import (
        EngineConfig,
        sampling_params,
        start_engine,
        stop_engine,
    )

    llm, _ = start_engine(EngineConfig(model=target, dtype="float32", speculative=speculative,
                                       in_process=True, env=env))
    try:
        prompt = {"prompt_token_ids": [3, 17, 42, 8, 3, 17]}
        params = [sampling_params(0.7, 2, True, seed) for seed in range(N)]
        outputs = llm.generate([prompt] * N, params, use_tqdm=False)
    finally:
        stop_engine(llm)
    return [o.outputs[0].token_ids[1] for o in outputs]


def _two_sample_pvalue(a: list[int], b: list[int]) -> float:
    """Chi-square test that two samples of tokens share one distribution, tokens seen fewer
    than 10 times in both together pooled into one bin."""
    from scipy.stats import chi2_contingency

    ca, cb = Counter(a), Counter(b)
    common = [t for t in set(ca) | set(cb) if ca[t] + cb[t] >= 10]
    rows = [[ca[t] for t in common], [cb[t] for t in common]]
    rest = [len(a) - sum(rows[0]), len(b) - sum(rows[1])]
    if sum(rest) > 0:
        rows = [r + [x] for r, x in zip(rows, rest, strict=True)]
    return float(chi2_contingency(np.asarray(rows)).pvalue)


def test_sampled_verification_keeps_vllm_plains_distribution(tmp_path):
    pytest.importorskip("vllm")
    target = tiny_target(tmp_path / "target", vocab=VOCAB, seed=5, init=0.5, positions=64)
    plain = _second_tokens(target, None, {})
    fixed = Counter(plain).most_common(1)[0][0]  # drafted at the second position: accepted
    # often, rejected often enough that rejections sample the rest
    spec = {"method": "custom_class", "model": f"{__name__}.FixedDraft",
            "num_speculative_tokens": 1}
    drafted = _second_tokens(target, spec, {FIXED_ENV: str(fixed)})
    share = Counter(plain)[fixed] / N
    assert 0.1 < share < 0.9, f"the drafted token's share {share} tests one path only"
    assert _two_sample_pvalue(plain, drafted) > 1e-3
