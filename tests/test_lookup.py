"""Prompt lookup: the n-gram proposer, its place in the decode loop (greedy output equals the
target's, alone and in batches beside drafted rows, on chain trees and on trees of several
candidates), its configuration and its method names."""

from __future__ import annotations

import pytest

from conftest import make_pair
from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate.methods import (
    check_method,
    explicit_label,
    parse_lookup,
    short_name,
    stopper_folder,
)
from mcsd_runtime.evaluate.runners import build_method
from mcsd_runtime.lookup import propose

# a prompt that repeats itself, so that lookup finds matches from the first step on
REPEATING = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7]
PROMPTS = [REPEATING, [1, 2, 3, 4], REPEATING[:9], [3, 3, 3, 3, 3], [9, 8, 7, 9, 8]]


def test_propose_copies_after_the_latest_longest_match():
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 4, 2, 3]
    # suffix [2, 3] (no earlier [4, 2, 3]): latest earlier occurrence at 5 -> [7, 8, 4]
    assert propose(ctx, 3, 1, 4) == [7, 8, 4]
    assert propose(ctx, 1, 1, 4) == [7]
    assert propose(ctx, 3, 3, 4) == []  # no 3-token match
    assert propose([1, 2, 3, 1, 2], 5, 2, 4) == [3, 1, 2]  # runs to the context's end
    assert propose([1, 2, 3], 4, 1, 4) == []
    assert propose([4, 4], 2, 1, 4) == [4]
    assert propose([], 2, 1, 4) == [] and propose([1, 1], 0, 1, 4) == []
    # the longer match wins over a later shorter one
    assert propose([1, 2, 5, 9, 2, 6, 1, 2], 1, 1, 4) == [5]


@pytest.fixture(scope="module")
def pair():
    return make_pair(vocab=64, seed=0)


@pytest.fixture(scope="module")
def reference(pair):
    ar = ARDecoder(pair, DecodeConfig(max_new_tokens=40))
    return [ar.generate(p).token_ids for p in PROMPTS]


@pytest.mark.parametrize("stopper", ["none", "static", "switch:1:1:3"])
def test_greedy_lookup_equals_the_target_alone_and_in_batches(pair, reference, stopper):
    cfg = DecodeConfig(k_config=(1, 1, 1, 1), max_new_tokens=40, lookup=4, lookup_min_ngram=1)
    dec = MCSDDecoder(pair, cfg, stopper)
    alone = [dec.generate(p) for p in PROMPTS]
    assert [r.token_ids for r in alone] == reference
    assert all(r.stats.lookup_steps > 0 for r in alone[:1])
    assert sum(r.stats.accepted_tokens for r in alone) > 0
    # fewer target calls than tokens: copied tokens were accepted
    assert alone[0].stats.target_calls < len(alone[0].token_ids)
    batch = dec.generate_batch(PROMPTS, batch_size=3)
    assert [r.token_ids for r in batch] == reference
    assert batch.stats.lookup_steps > 0


@pytest.mark.parametrize("k_config", [(1, 1, 1, 1), (3, 2, 1), "4,1/1,1"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_beside_copied_rows_draft_as_they_would_alone(pair, k_config, temperature):
    """In row mode a batch gives each row its own tree: a row's steps (drafted, accepted, tree
    size) and its output equal the prompt decoded alone (sampled: with the same seed), which
    needs every row's draft cache kept right after copied steps (a copied chain never went
    through the draft) and, on a tree of several candidates, copied chains verified on their
    own tree beside drafted rows in the same forward."""
    cfg = DecodeConfig(k_config=k_config, max_new_tokens=40, lookup=4, lookup_min_ngram=2,
                       batch_depth="row", temperature=temperature)
    dec = MCSDDecoder(pair, cfg, "static:2")
    alone = [dec.generate(p, seed=i) for i, p in enumerate(PROMPTS)]
    batch = dec.generate_batch(PROMPTS, batch_size=3, seeds=range(len(PROMPTS)))
    assert batch.stats.lookup_steps > 0 and batch.stats.draft_calls > 0
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone]
    steps = [[(s.drafted, s.accepted, s.tree_size) for s in r.steps] for r in alone]
    assert [[(s.drafted, s.accepted, s.tree_size) for s in r.steps] for r in batch] == steps


@pytest.mark.parametrize("k_config", [(3, 2, 1), "4,1/1,1"])
def test_copies_beside_a_tree_of_several_candidates_verify_a_chain_of_their_own(pair, reference,
                                                                                k_config):
    """A draft tree with several candidates: a step that copies verifies the chain alone (its
    tree is the chain, no candidate slots), a step that does not drafts the whole tree; the
    output is the target's, alone and in batches, where copying rows and drafting rows share
    a forward."""
    cfg = DecodeConfig(k_config=k_config, max_new_tokens=40, lookup=3, lookup_min_ngram=1)
    dec = MCSDDecoder(pair, cfg, "static")
    alone = [dec.generate(p) for p in PROMPTS]
    assert [r.token_ids for r in alone] == reference
    copied = [s for r in alone for s in r.steps if s.drafted and s.tree_size == s.drafted]
    drafted = [s for r in alone for s in r.steps if s.tree_size > s.drafted]
    assert len(copied) == sum(r.stats.lookup_steps for r in alone) > 0
    assert drafted and sum(s.accepted for s in copied) > 0
    assert all(s.tree_size == dec.tree.cum[s.drafted] for s in drafted)
    batch = dec.generate_batch(PROMPTS, batch_size=3)
    assert [r.token_ids for r in batch] == reference
    assert batch.stats.lookup_steps > 0
    for r in batch:  # a copied chain, or the draft's tree
        assert all(s.tree_size in (s.drafted, dec.tree.cum[s.drafted]) for s in r.steps)


def test_copies_accepted_past_the_draft_trees_last_node(pair, reference):
    """A copy accepted deeper than the draft's tree has nodes (here 2): its path indexes the
    chain's own tree, not the draft's."""
    cfg = DecodeConfig(k_config=(2,), max_new_tokens=40, lookup=8, lookup_min_ngram=1)
    dec = MCSDDecoder(pair, cfg, "static")
    alone = [dec.generate(p) for p in PROMPTS]
    assert [r.token_ids for r in alone] == reference
    assert max(s.accepted for r in alone for s in r.steps) > dec.tree.num_nodes
    assert [r.token_ids for r in dec.generate_batch(PROMPTS, batch_size=3)] == reference


def test_lookup_off_changes_nothing(pair):
    a = MCSDDecoder(pair, DecodeConfig(k_config=(1, 1), max_new_tokens=20), "static")
    b = MCSDDecoder(pair, DecodeConfig(k_config=(1, 1), max_new_tokens=20, lookup=0), "static")
    ra, rb = a.generate(REPEATING), b.generate(REPEATING)
    assert ra.token_ids == rb.token_ids and rb.stats.lookup_steps == 0
    assert [s.drafted for s in ra.steps] == [s.drafted for s in rb.steps]


def test_a_copied_step_is_no_draft_to_the_stopper(pair):
    """The trajectory's acceptance rates are the draft's: copied chains leave them alone."""
    cfg = DecodeConfig(k_config=(1, 1, 1, 1), max_new_tokens=30, lookup=4, lookup_min_ngram=1)
    seen = []

    class Spy:
        needs_hidden = False

        def reset(self): pass
        def should_draft(self, start): return False
        def should_continue(self, frontier): return False
        def update(self, drafted, accepted): seen.append((drafted, accepted))
        def check_tree(self, k): pass
        def for_batch(self, n): return self
        def batch_continue(self, frontiers): return None

    r = MCSDDecoder(pair, cfg, Spy()).generate(REPEATING)
    assert r.stats.lookup_steps > 0 and r.stats.accepted_tokens > 0
    assert set(seen) == {(0, 0)}


@pytest.mark.parametrize(("kw", "message"), [
    (dict(k_config=(), lookup=3), "beside a draft tree"),
    (dict(k_config=(1, 1), lookup=2, init="target"), "init='draft'"),
    (dict(k_config=(1, 1), lookup=2, lookup_min_ngram=3, lookup_max_ngram=2), "min <= max"),
    (dict(k_config=(1, 1), lookup=-1), "lookup must be >= 0"),
])
def test_bad_lookup_configs_are_refused(kw, message):
    with pytest.raises(MCSDError, match=message):
        DecodeConfig(**kw)


def test_a_recorder_is_refused_with_lookup(pair):
    class Rec:
        needs_hidden = False

        def on_step(self, trace): pass

    with pytest.raises(MCSDError, match="collect with lookup off"):
        MCSDDecoder(pair, DecodeConfig(k_config=(1,), lookup=1), recorder=Rec())


def test_lookup_method_names(tmp_path):
    assert parse_lookup("ar") is None
    assert parse_lookup("lookup") == (None, 3, None)
    assert parse_lookup("lookup:5:2+heuristic") == (5, 2, "heuristic")
    assert explicit_label("lookup", (4, 2, 2, 1)) == "lookup:8:3"
    assert explicit_label("lookup+confidence", (1, 1, 1)) == "lookup:8:3+confidence:0.4"
    assert explicit_label("lookup:2:1+static", (1, 1, 1)) == "lookup:2:1+static:3"
    for bad, message in (("lookup:0", "positive integers"), ("lookup:2:5", "N <= 4"),
                         ("lookup:a", "positive integers"), ("lookup:1:1:1", "positive"),
                         ("lookup+", "name a stopper"), ("lookup+nonsense", "unknown method")):
        with pytest.raises(MCSDError, match=message):
            check_method(bad)
    folder = tmp_path / "lgb"
    assert stopper_folder(f"lookup:4:2+stopper:{folder}") == folder
    assert stopper_folder("lookup:4") is None
    assert short_name(f"lookup:4:2+stopper:{folder}") == "lookup:4:2+stopper:lgb"


def test_lookup_methods_run_and_stay_lossless(pair, reference):
    base = DecodeConfig(k_config=(1, 1, 1), max_new_tokens=40)
    pure = build_method("lookup:5:1", pair, base)
    assert pure.decoder.config.k_config == (1,) * 5 and pure.decoder.config.lookup == 5
    mixed = build_method("lookup:2:1+heuristic", pair, base)
    assert mixed.decoder.config.k_config == (1, 1, 1) and mixed.decoder.config.lookup == 2
    longer = build_method("lookup:4:1+heuristic", pair, base)  # copies longer than the tree
    assert longer.decoder.chain is not None and mixed.decoder.chain is None
    for runner in (pure, mixed, longer):
        assert [runner.generate(p).token_ids for p in PROMPTS] == reference
    wide = build_method("lookup:2:1+static", pair, DecodeConfig(k_config=(3, 2), max_new_tokens=40))
    assert wide.decoder.config.k_config == (3, 2) and wide.decoder.chain is not None
    assert [wide.generate(p).token_ids for p in PROMPTS] == reference
