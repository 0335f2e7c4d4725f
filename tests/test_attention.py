"""`mcsd_sdpa`: grouped-query heads packed under a shared mask compute what `sdpa` computes."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from mcsd_runtime.benchmarks.step_breakdown import shaped_pair
from mcsd_runtime.decisions.builtin import make_stopper
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.attention import check_attention, packed_sdpa_forward, register


class Heads(torch.nn.Module):
    num_key_value_groups = 3


def inputs(n: int, dtype: torch.dtype, heads_in_mask: int = 1, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 6, n, 16, generator=gen).to(dtype)
    k, v = (torch.randn(2, 2, 24, 16, generator=gen).to(dtype) for _ in range(2))
    allowed = torch.rand(2, heads_in_mask, n, 24, generator=gen) > 0.3
    allowed[..., -1] = True  # every query sees at least one key
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return q, k, v, mask


@pytest.mark.parametrize("n", [1, 5, 9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_heads_give_sdpa_outputs(n, dtype):
    q, k, v, mask = inputs(n, dtype)
    out, _ = packed_sdpa_forward(Heads(), q, k, v, mask, scaling=0.25)
    ref, _ = sdpa_attention_forward(Heads(), q, k, v, mask, scaling=0.25)
    assert out.shape == ref.shape == (2, n, 6, 16)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-2)
    # the check can fail: a head's rows given another head's keys differ
    wrong, _ = packed_sdpa_forward(Heads(), q, k.flip(1), v.flip(1), mask, scaling=0.25)
    assert (wrong - ref).abs().max() > 1e-2


def test_per_head_masks_and_ungrouped_heads_are_sdpa_itself():
    q, k, v, mask = inputs(4, torch.float32, heads_in_mask=6)
    out, _ = packed_sdpa_forward(Heads(), q, k, v, mask)
    assert torch.equal(out, sdpa_attention_forward(Heads(), q, k, v, mask)[0])
    one = torch.nn.Module()  # no num_key_value_groups: every query head has its own keys
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    assert torch.equal(packed_sdpa_forward(one, q, k, v, None)[0],
                       sdpa_attention_forward(one, q, k, v, None)[0])


@pytest.mark.parametrize("k_config", [(4, 2, 1), "4,1/1,1,1"])
def test_greedy_mcsd_on_grouped_heads_equals_ar_and_sdpa(k_config):
    pair = shaped_pair("tiny", 1, "cpu", torch.float32)  # 4 query heads over 2 key/value heads
    assert pair.target.config._attn_implementation == register()
    prompts = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (3, 9, 17)]
    config = DecodeConfig(k_config=k_config, max_new_tokens=20)
    packed = [MCSDDecoder(pair, config, stopper=make_stopper("static")).generate(p).token_ids
              for p in prompts]
    ar = [ARDecoder(pair, config).generate(p).token_ids for p in prompts]
    for model in (pair.target, pair.draft):
        model.config._attn_implementation = "sdpa"
    plain = [MCSDDecoder(pair, config, stopper=make_stopper("static")).generate(p).token_ids
             for p in prompts]
    assert packed == ar == plain


def test_unknown_attention_is_a_clear_error():
    with pytest.raises(MCSDError, match="unknown attention implementation 'flash'.*mcsd_sdpa"):
        check_attention("flash")
    assert check_attention("sdpa") == "sdpa" and check_attention("eager") == "eager"


def test_attention_bench_pairs_the_two_implementations(toy_tiny, capsys):
    from mcsd_runtime.cli import main

    pair = ["attention-bench", "--target", str(toy_tiny / "target"), "--draft",
            str(toy_tiny / "draft"), "--dtype", "float32", "--threads", "1"]
    assert main([*pair, "--context", "8", "--tokens", "1,3", "--rounds", "3"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 8 |")]
    assert [r.split(" | ")[1] for r in rows] == ["1", "3"]
    assert all(r.endswith("| 0 |") for r in rows)  # the same logits
    assert main([*pair, "--compare", "sdpa,sdpa"]) == 2
    assert "two different implementations" in capsys.readouterr().err
    assert main([*pair, "--compare", "sdpa,flash9"]) == 2
    assert "unknown attention implementation 'flash9'" in capsys.readouterr().err
