"""Ragged batches (`DecodeConfig(batch_layout="ragged")`): each row's own tokens, packed into one
forward, give exactly what the padded grid gives.

- the packed forward's logits and cache entries equal the padded forward's on every real slot;
- greedy rows equal the target alone and the prompt decoded alone, token for token, over rows
  at different depths and widths, copied chains, empty trees and rows joining mid-batch, on
  Llama, Qwen2 and Mistral tiny models, eager and fixed-shape;
- sampled rows follow the target's law (chi-square; a biased verifier fails the same test);
- the target sees fewer tokens ragged than padded, on the same steps."""

from __future__ import annotations

import pytest
import torch
from test_batch_decoder import joint_counts, row_steps
from test_decoder_greedy import prompts, reference
from test_decoder_sampling import (
    ALPHA,
    DRAFTS,
    N_CHECKED,
    PROMPT,
    exact_joint,
    micro_pair,
    p_value,
    residual_from_p,
    unguarded_verify,
)
from test_fixed_forwards import tiny

from conftest import make_pair
from mcsd_runtime.decisions.builtin import StopperBase, make_stopper
from mcsd_runtime.decisions.features import DECISION_FEATURES
from mcsd_runtime.decode import ragged as R
from mcsd_runtime.decode import speculative_sampling as V
from mcsd_runtime.decode.cache import RowCache
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
from mcsd_runtime.decode.graphs import call_model
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.attention import NAME, register


def ragged_ready(pair):
    """The pair's models on `mcsd_sdpa` (`load_pair`'s default), which ragged forwards need."""
    register()
    for model in (pair.target, pair.draft):
        model.config._attn_implementation = NAME
    return pair


@pytest.fixture(scope="module")
def rpair():
    return ragged_ready(make_pair())


@pytest.fixture(scope="module")
def refs(rpair):
    return [(p, reference(rpair, p, 20)) for p in prompts(rpair.vocab_size, n=7, seed=5)]


@pytest.fixture
def layouts(monkeypatch):
    """Every ragged layout built while the test runs: (counts, width)."""
    made = []
    real = R.Ragged.__init__

    def spy(self, counts, width, device, bucket=0):
        made.append((tuple(counts), width))
        real(self, counts, width, device, bucket)

    monkeypatch.setattr(R.Ragged, "__init__", spy)
    return made


def test_forwards_are_packed_only_where_they_save_a_quarter():
    assert not R.Ragged.needed([5, 5, 5, 5], 5)  # equal rows: the padded forward itself
    assert not R.Ragged.needed([3, 3, 3, 4], 4)  # 13 of 16: packing would cost more
    assert R.Ragged.needed([1, 1, 5, 5], 5) and R.Ragged.needed([1, 0, 0, 0], 1)


def test_packed_forward_equals_the_padded_one(rpair):
    """Rows of 1, 4 and 2 real tokens in a grid of 4 over cached prefixes of different lengths:
    logits and the cache's new entries equal the padded forward's on every real slot."""
    model, rows, width = rpair.target, 3, 4
    counts = [1, 4, 2]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (rows, 6 + width), generator=gen)
    caches = []
    for _ in range(2):
        cache = RowCache(rows, torch.device("cpu"))
        block = torch.zeros(6, 6, dtype=model.dtype).masked_fill_(
            torch.ones(6, 6, dtype=torch.bool).triu(1), torch.finfo(model.dtype).min)
        call_model(model, cache, ids[:, :6], torch.arange(6)[None].expand(rows, -1),
                   cache.mask(block[None], model.dtype), 0, False)
        cache.appended(6)
        cache.settle([6, 4, 5])  # rows hold prefixes of different lengths
        caches.append(cache)
    # a chain tree over the grid: each slot sees the ones before it
    tree = torch.zeros(width, width, dtype=model.dtype).masked_fill_(
        torch.ones(width, width, dtype=torch.bool).triu(1), torch.finfo(model.dtype).min)
    pos = torch.tensor([[6], [4], [5]]) + torch.arange(width)[None]
    new = ids[:, 6:]
    padded = call_model(model, caches[0], new, pos, caches[0].mask(tree[None], model.dtype), 0,
                        True)
    layout = R.Ragged(counts, width, torch.device("cpu"))
    packed = call_model(model, caches[1], new, pos, caches[1].mask(tree[None], model.dtype), 0,
                        True, ragged=layout)
    assert layout.total == 7
    for r, n in enumerate(counts):
        torch.testing.assert_close(packed.logits[r, :n], padded.logits[r, :n], rtol=0, atol=1e-10)
        torch.testing.assert_close(packed.hidden[r, :n], padded.hidden[r, :n], rtol=0, atol=1e-10)
        for a, b in zip(caches[0].cache.layers, caches[1].cache.layers, strict=True):
            for name in ("keys", "values"):
                torch.testing.assert_close(getattr(b, name)[r, :, 6 : 6 + n],
                                           getattr(a, name)[r, :, 6 : 6 + n], rtol=0, atol=1e-10)
        assert not packed.logits[r, n:].any()  # padding slots come back as zeros


class SkipEveryOther(StopperBase):
    """Drafts every other step of its row (an empty tree between) and, when it drafts, goes on
    while the frontier's first candidate has draft probability >= 0.3: rows verify empty trees
    and trees of different depths in the same step."""

    def reset(self) -> None:
        self.n = 0

    def should_draft(self, start) -> bool:
        self.n = getattr(self, "n", 0) + 1
        return self.n % 2 == 1

    def should_continue(self, frontier) -> bool:
        prob = frontier.decision_features()[0, DECISION_FEATURES.index("draft_prob")]
        return bool(prob >= 0.3)


CASES = [((4, 2, 2, 1), "heuristic", "row"), ((1, 1, 1, 1), "confidence:0.3", "row"),
         ((3, 1, 1, 1, 1, 1), "cumprod:0.8", "row"), ((2, 3), "static:1", "max"),
         ((3, 2, 1), "skip", "row")]


def stopper_of(spec: str):
    return SkipEveryOther() if spec == "skip" else make_stopper(spec)


@pytest.mark.parametrize(("k_config", "stopper", "batch_depth"), CASES)
def test_greedy_ragged_rows_equal_the_target_and_the_prompt_alone(rpair, refs, layouts,
                                                                  k_config, stopper,
                                                                  batch_depth):
    cfg = DecodeConfig(k_config=k_config, max_new_tokens=20, batch_layout="ragged",
                       batch_depth=batch_depth)
    dec = MCSDDecoder(rpair, cfg, stopper=stopper_of(stopper))
    ps = [p for p, _ in refs]
    out = dec.generate_batch(ps, batch_size=3)  # 7 prompts: rows join as others finish
    assert [r.token_ids for r in out] == [ref for _, ref in refs]
    assert layouts and any(min(c) < w for c, w in layouts)  # forwards really were ragged
    if batch_depth == "row":
        alone = [MCSDDecoder(rpair, cfg, stopper=stopper_of(stopper)).generate(p) for p in ps]
        assert [row_steps(r.steps) for r in out] == [row_steps(a.steps) for a in alone]


def test_copied_chains_and_empty_trees_beside_drafted_rows(layouts):
    """Prompt lookup's chains on their own tree, rows that draft nothing and drafted rows of a
    4-candidate tree share ragged forwards; every row is the target's."""
    pair = ragged_ready(make_pair(vocab=64, seed=0))
    ps = [[5, 6, 7, 8, 5, 6, 7], [1, 2, 3, 1, 2, 3, 1, 2], [9, 4, 9, 4, 9], [3], [7, 7, 7, 7]]
    refs = [reference(pair, p, 30) for p in ps]
    cfg = DecodeConfig(k_config=(4, 1, 1), max_new_tokens=30, lookup=3, lookup_min_ngram=1,
                       batch_layout="ragged", batch_depth="row")
    out = MCSDDecoder(pair, cfg, stopper=SkipEveryOther()).generate_batch(ps, batch_size=4)
    assert [r.token_ids for r in out] == refs
    assert out.stats.lookup_steps > 0
    assert any(min(c) > 0 and len(set(c)) > 2 for c, _ in layouts)


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_other_families_ragged(family, layouts):
    pair = ragged_ready(tiny(family))
    ps = prompts(64, n=5, seed=2)
    refs = [reference(pair, p, 16) for p in ps]
    cfg = DecodeConfig(k_config=(3, 2, 1), max_new_tokens=16, batch_layout="ragged",
                       batch_depth="row")
    out = MCSDDecoder(pair, cfg, stopper="heuristic").generate_batch(ps, batch_size=3)
    assert [r.token_ids for r in out] == refs and layouts


def test_fixed_shape_forwards_run_ragged_too(rpair, refs, layouts):
    cfg = DecodeConfig(k_config=(4, 2, 1), max_new_tokens=20, batch_layout="ragged",
                       batch_depth="row", graphs="on")
    out = MCSDDecoder(rpair, cfg, stopper="heuristic").generate_batch([p for p, _ in refs],
                                                                      batch_size=3)
    assert [r.token_ids for r in out] == [ref for _, ref in refs]
    assert out.stats.forwards == "fixed" and layouts


def test_captured_ragged_forwards_replay_per_total_bucket(rpair, refs, monkeypatch):
    """Ragged forwards captured (CUDA graphs stood in for by reruns on the graphs' own input
    buffers, `test_graph_replay.StandIn`): the layout's index is a graph input, rows padded
    with idle rows and totals bucketed, so graphs are reused across steps; greedy rows stay
    the target's."""
    from test_graph_replay import StandIn

    from mcsd_runtime.decode import graphs
    from mcsd_runtime.decode.graphs import FixedForwards

    monkeypatch.setattr(graphs, "Graph", StandIn)
    monkeypatch.setattr(StandIn, "models", [rpair.target, rpair.draft])
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    StandIn.made = 0
    cfg = DecodeConfig(k_config=(1, 1, 1, 1, 1), max_new_tokens=20, batch_layout="ragged",
                       batch_depth="row", graphs="on")
    dec = MCSDDecoder(rpair, cfg, stopper=SkipEveryOther())
    dec.forwards = FixedForwards(dec.pair.device, capture=True, bucket=8)
    out = dec.generate_batch([p for p, _ in refs], batch_size=3)
    assert [r.token_ids for r in out] == [ref for _, ref in refs]
    ragged_keys = [k for k in dec.forwards.graphs if k[-1] is not None]
    assert ragged_keys and all(k[-1] % 8 == 0 for k in ragged_keys)
    assert all("index" in dec.forwards.graphs[k].inputs for k in ragged_keys)
    assert StandIn.made == len(dec.forwards.graphs) < out.stats.target_calls


def step_tokens(pair, layout: str, ps, monkeypatch) -> tuple[int, list]:
    """Tokens through the target's embedding inside decode steps (admissions' prefills left
    out) in one batch decode, and its results."""
    from mcsd_runtime.decode.engine import Engine

    seen, inside = [], []
    real_step = Engine.step

    def step(self, *args):
        inside.append(True)
        try:
            return real_step(self, *args)
        finally:
            inside.pop()

    monkeypatch.setattr(Engine, "step", step)
    hook = pair.target.get_input_embeddings().register_forward_hook(
        lambda m, args, out: seen.append(args[0].numel() if inside else 0))
    try:
        cfg = DecodeConfig(k_config=(1, 1, 1, 1, 1), max_new_tokens=20, batch_layout=layout,
                           batch_depth="row")
        out = MCSDDecoder(pair, cfg, stopper=SkipEveryOther()).generate_batch(ps, batch_size=4)
    finally:
        hook.remove()
    return sum(seen), list(out)


def test_the_target_verifies_each_rows_own_tokens_only(rpair, refs, monkeypatch):
    """Ragged (every forward whose rows differ packed), the target's steps take exactly each
    row's root and tree (one token for an empty tree); padded, every row takes the widest
    row's."""
    monkeypatch.setattr(R, "RAGGED_FILL", 1.0)
    ps = [p for p, _ in refs]
    padded, out_padded = step_tokens(rpair, "padded", ps, monkeypatch)
    ragged, out_ragged = step_tokens(rpair, "ragged", ps, monkeypatch)
    assert [r.token_ids for r in out_ragged] == [r.token_ids for r in out_padded]
    assert ragged == sum(1 + s.tree_size for r in out_ragged for s in r.steps)
    assert ragged < padded


def test_models_without_mcsd_sdpa_run_padded_with_a_warning(refs):
    pair = make_pair()  # attn_implementation="sdpa"
    cfg = DecodeConfig(k_config=(2, 1), max_new_tokens=8, batch_layout="ragged")
    with pytest.warns(RuntimeWarning, match="mcsd_sdpa"):
        out = MCSDDecoder(pair, cfg, stopper="heuristic").generate_batch(
            [p for p, _ in refs[:3]], batch_size=3)
    assert [r.token_ids for r in out] == [reference(pair, p, 8) for p, _ in refs[:3]]
    with pytest.raises(MCSDError, match="batch_layout"):
        DecodeConfig(batch_layout="packed")


# ---------------------------------------------------------------------------- sampling
def ragged_counts(pair, temperature: float = 1.0, k_config=(3, 2), stopper="heuristic",
                  n: int = N_CHECKED) -> torch.Tensor:
    cfg = DecodeConfig(k_config=k_config, temperature=temperature, max_new_tokens=3,
                       batch_layout="ragged", batch_depth="row")
    dec = MCSDDecoder(pair, cfg, stopper=stopper)
    return joint_counts(dec.generate_batch([PROMPT] * n, batch_size=8, seeds=list(range(n))))


def test_sampled_ragged_rows_follow_the_target(monkeypatch, layouts):
    """Rows at depths chosen on their own draws (row mode), ragged; the biased verifier fails."""
    micro = ragged_ready(micro_pair())
    exact = exact_joint(micro, 1.0)
    assert p_value(ragged_counts(micro, stopper=SkipEveryOther()), exact) > ALPHA
    assert any(min(c) < w for c, w in layouts)
    monkeypatch.setattr(V, "verify_children", residual_from_p)
    assert p_value(ragged_counts(micro, stopper=SkipEveryOther(), n=300), exact) < ALPHA


@pytest.mark.parametrize("draft_kind", ["one-hot", "sharp-T0.2"])
def test_sampled_ragged_rows_under_degenerate_drafts(draft_kind, monkeypatch):
    _, temperature, k_config = DRAFTS[draft_kind]
    micro = ragged_ready(micro_pair(draft_kind))
    exact = exact_joint(micro, temperature)
    kw = dict(temperature=temperature, k_config=k_config, stopper=SkipEveryOther())
    assert p_value(ragged_counts(micro, **kw), exact) > ALPHA
    monkeypatch.setattr(V, "verify_children", unguarded_verify)
    assert p_value(ragged_counts(micro, n=300, **kw), exact) < ALPHA


def test_a_feature_draft_runs_ragged(layouts):
    """A feature draft (it reads the target's states): rows that draft nothing keep their
    pending tokens and states out of the first draft forward, rows at different depths share
    packed forwards; greedy rows stay the target's."""
    from test_feature_draft import fpair as make_fpair

    pair = ragged_ready(make_fpair.__wrapped__())
    ps = prompts(pair.vocab_size, n=5, seed=2)
    refs = [reference(pair, p, 16) for p in ps]
    cfg = DecodeConfig(k_config=(3, 1, 1), max_new_tokens=16, batch_layout="ragged",
                       batch_depth="row")
    out = MCSDDecoder(pair, cfg, stopper=SkipEveryOther()).generate_batch(ps, batch_size=3)
    assert [r.token_ids for r in out] == refs
    assert any(min(c) == 0 for c, _ in layouts)  # a forward some rows sat out
