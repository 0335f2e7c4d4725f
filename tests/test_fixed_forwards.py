"""The fixed-shape path (`DecodeConfig.graphs="on"`: slot caches, bucketed spans; captured as
CUDA graphs on a GPU, run without capture here) decodes token for token as the eager path,
greedy and sampled, alone and in batches, for every proposer and model family."""

from __future__ import annotations

import pytest
import torch
from test_copy_length import feature_pair as feature_pair_fixture
from test_decoder_greedy import prompts, reference
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from mcsd_runtime.decisions.width import WidthPolicy
from mcsd_runtime.decode.cache import SlotRowCache
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.decode.graphs import EagerForwards, FixedForwards, make_forwards, row_bucket
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.pair import Pair

feature_pair = feature_pair_fixture
BUCKET = 8  # small spans, so that a decode crosses several of them
PROMPTS = prompts(64, n=8)


def fixed(dec: MCSDDecoder) -> MCSDDecoder:
    """`dec` on fixed-shape forwards with small span buckets."""
    dec.forwards = FixedForwards(dec.pair.device, capture=False, bucket=BUCKET)
    return dec


def both(make, ps=PROMPTS, batch_size: int = 3, **kw) -> tuple[list, list]:
    """Token ids of eager and fixed-shape decoders built by `make(graphs)`, in a batch (the
    fixed run's statistics in `both.stats`)."""
    eager = make("off").generate_batch(ps, batch_size=batch_size, **kw)
    assert eager.stats.forwards == "eager"
    dec = make("on")
    assert isinstance(dec.forwards, FixedForwards) and not dec.forwards.capture
    dec.forwards.bucket = BUCKET
    got = dec.generate_batch(ps, batch_size=batch_size, **kw)
    both.stats = got.stats
    assert got.stats.forwards == "fixed" and got[0].stats.forwards == "fixed"
    return [r.token_ids for r in eager], [r.token_ids for r in got]


def test_rows_are_padded_to_powers_of_two_within_the_slots():
    assert [row_bucket(r, 5) for r in range(1, 6)] == [1, 2, 4, 4, 5]
    assert [row_bucket(r, 8) for r in (3, 5, 8)] == [4, 8, 8]


def test_graphs_option_picks_the_path():
    cpu = torch.device("cpu")
    assert isinstance(make_forwards("auto", cpu), EagerForwards)
    assert isinstance(make_forwards("off", cpu), EagerForwards)
    on = make_forwards("on", cpu)
    assert isinstance(on, FixedForwards) and not on.capture
    assert make_forwards("auto", torch.device("cuda")).capture
    with pytest.raises(MCSDError, match="unknown graphs"):
        DecodeConfig(graphs="always")


@pytest.mark.parametrize("k_config", [(4, 2, 2, 1), (1, 1, 1, 1), "4,1/1,1,1", (8,)])
@pytest.mark.parametrize("batch_size", [1, 3, 5])  # 5: rows padded to 8, then to 4 as they go
def test_greedy_equals_eager_and_the_target(pair, k_config, batch_size):
    # 16 tokens after prompts of up to 11: rows still cross two or three spans of BUCKET
    def make(graphs):
        return MCSDDecoder(pair, DecodeConfig(k_config=k_config, max_new_tokens=16,
                                              graphs=graphs), "heuristic")

    eager, got = both(make, batch_size=batch_size)
    assert got == eager
    assert got[:3] == [reference(pair, p, 16) for p in PROMPTS[:3]]


@pytest.mark.parametrize("stopper", ["static:2", "confidence:0.2", "cumprod:0.9"])
def test_greedy_equals_eager_under_adaptive_stoppers(pair, stopper):
    def make(graphs):
        return MCSDDecoder(pair, DecodeConfig(k_config=(3, 2, 1, 1), max_new_tokens=24,
                                              graphs=graphs), stopper)

    eager, got = both(make)
    assert got == eager


def test_ar_equals_eager(pair):
    eager, got = both(lambda g: ARDecoder(pair, DecodeConfig(max_new_tokens=24, graphs=g)),
                      batch_size=4)
    assert got == eager


@pytest.mark.parametrize("verify", ["mcss", "naive"])
@pytest.mark.parametrize("batch_size", [1, 3, 5])
def test_sampled_draws_equal_eager(pair, verify, batch_size):
    """Same seeds, same draws: the fixed path's rows follow the target's law because they are
    the eager path's rows (whose law the sampling tests check)."""
    def make(graphs):
        return MCSDDecoder(pair, DecodeConfig(k_config=(4, 2, 1), max_new_tokens=16,
                                              temperature=0.7, verify=verify, graphs=graphs),
                           "heuristic")

    eager, got = both(make, batch_size=batch_size, seeds=list(range(len(PROMPTS))))
    assert got == eager


def test_near_one_hot_draft_sampled_equals_eager(pair):
    """A draft at a very low temperature proposes near-one-hot distributions."""
    def make(graphs):
        return MCSDDecoder(pair, DecodeConfig(k_config=(2, 1, 1), max_new_tokens=20,
                                              temperature=0.05, graphs=graphs), "static")

    eager, got = both(make, seeds=list(range(len(PROMPTS))))
    assert got == eager


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_prompt_lookup_equals_eager(pair, temperature):
    repeat = [[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 1, 2, 3, 1, 2], [9, 9, 9, 9, 9, 9]]

    def make(graphs):
        return MCSDDecoder(pair, DecodeConfig(k_config=(4, 2, 1), max_new_tokens=24,
                                              temperature=temperature, lookup=4,
                                              lookup_min_ngram=1, graphs=graphs), "static")

    eager, got = both(make, ps=repeat + PROMPTS[:3])
    assert got == eager
    assert both.stats.lookup_steps > 0


def test_learned_width_equals_eager(pair):
    identity = ([0.0, 1.0], [0.0, 1.0])
    width = WidthPolicy(k=4, calibration=[identity] * 4, seconds=[1.0, 1.05, 1.1, 1.2],
                        rate=1.0)

    def make(graphs):
        return MCSDDecoder(pair, DecodeConfig(k_config=(4,), max_new_tokens=24, graphs=graphs),
                           "static:1", width=width)

    eager, got = both(make)
    assert got == eager
    assert both.stats.drafted_tokens < 4 * both.stats.drafting_steps  # some steps were cut


def test_target_initialized_equals_eager(pair):
    def make(graphs):
        return MCSDDecoder(pair, DecodeConfig(k_config=(3, 2, 1), max_new_tokens=24,
                                              init="target", graphs=graphs), "heuristic")

    eager, got = both(make, batch_size=1)
    assert got == eager


def test_feature_draft_equals_eager(feature_pair):
    def make(graphs):
        return MCSDDecoder(feature_pair, DecodeConfig(k_config="4,1/1,1", max_new_tokens=24,
                                                      graphs=graphs), "heuristic")

    eager, got = both(make)
    assert got == eager


def tiny(family: str) -> Pair:
    """A tiny target and a noisy copy as its draft, of another Llama-like family."""
    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM),
                             "mistral": (MistralConfig, MistralForCausalLM)}[family]
    models = []
    for noise in (0.0, 0.02):
        torch.manual_seed(0)
        cfg = config_cls(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, eos_token_id=None, bos_token_id=None,
                         pad_token_id=None, tie_word_embeddings=False,
                         attn_implementation="sdpa")
        model = model_cls(cfg).to(torch.float64).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn_like(p))
        model.generation_config.pad_token_id = 0
        models.append(model)
    return Pair(*models)


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_other_families_equal_eager(family):
    p = tiny(family)

    def make(graphs):
        return MCSDDecoder(p, DecodeConfig(k_config=(3, 2, 1), max_new_tokens=20,
                                           graphs=graphs), "heuristic")

    eager, got = both(make)
    assert got == eager


def test_caches_are_kept_and_grown_across_calls(pair):
    dec = fixed(MCSDDecoder(pair, DecodeConfig(k_config=(2, 1), max_new_tokens=16), "static"))
    short = dec.generate_batch(PROMPTS[:2], batch_size=2)
    first = dec.forwards._caches
    long_prompt = list(range(60)) * 2
    grown = dec.generate_batch([long_prompt, *PROMPTS[:3]], batch_size=4)
    assert dec.forwards._caches is not first
    assert dec.forwards._caches[0].row_slots == 4
    again = dec.generate_batch(PROMPTS[:2], batch_size=2)
    assert [r.token_ids for r in again] == [r.token_ids for r in short]
    eager = MCSDDecoder(pair, DecodeConfig(k_config=(2, 1), max_new_tokens=16, graphs="off"),
                        "static").generate(long_prompt)
    assert grown[0].token_ids == eager.token_ids


def test_a_forward_past_the_slots_is_refused():
    cache = SlotRowCache(1, 16, torch.device("cpu"))
    cache.settle([14])
    assert cache.span_for(2) == 16
    with pytest.raises(MCSDError, match="overflows the preallocated cache"):
        cache.span_for(3)


def test_comparison_fails_on_a_cache_that_writes_one_column_late(pair, monkeypatch):
    """The equality above could fail: a slot cache writing each forward one column late
    decodes other tokens."""
    real = SlotRowCache.begin

    def late(self, n):
        idx = real(self, n)
        idx.add_(1)
        return idx

    monkeypatch.setattr(SlotRowCache, "begin", late)

    def make(graphs):
        return MCSDDecoder(pair, DecodeConfig(k_config=(4, 2, 1), max_new_tokens=24,
                                              graphs=graphs), "static")

    eager, got = both(make)
    assert got != eager
