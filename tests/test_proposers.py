"""The proposers' bookkeeping, one call each, on stand-ins for the decoder: `PromptLookup.update`
tells a copy history that the stopper drafted only past the layers the draft did not propose,
`WidthCut.propose` cuts only drafted rows, and cuts every per-node tensor of their first layer
(a cut layer's node rows are the first w of the uncut's), and each proposer returns proposals
without changing the drafted trees it reads."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mcsd_runtime.decisions.copy_length import CopyHistory
from mcsd_runtime.decisions.features import TOP_K_MASS
from mcsd_runtime.decode.proposers import PromptLookup, Proposing, WidthCut
from mcsd_runtime.decode.step_state import Drafted, DraftLayer, Proposal

V = 16


def lookup(chain=None) -> PromptLookup:
    dec = SimpleNamespace(config=SimpleNamespace(), copy_length=None, chain=chain,
                          pair=SimpleNamespace(vocab_size=V))
    return PromptLookup(dec)


def drafted_value(lo: int, depth: int, copied: bool = False) -> float:
    """The copy history's running value of drafted steps after one step of a row whose first
    `lo` layers the draft did not propose."""
    st = SimpleNamespace(copy_history=CopyHistory())
    draft = SimpleNamespace(depth=depth, copied=copied, roots=lo)
    verdict = SimpleNamespace(accepted=min(depth, 1), conf=[0.9, 0.8, 0.7])
    lookup().update(st, draft, verdict, committed=[5, 6, 7])
    return st.copy_history.draft_value


def test_lookup_counts_a_drafted_step_only_past_the_first_depth_it_always_has():
    untouched = CopyHistory().draft_value
    assert drafted_value(lo=0, depth=0) == untouched  # the stopper drafted nothing
    assert drafted_value(lo=0, depth=1) > untouched
    assert drafted_value(lo=1, depth=1) == untouched  # target-init: depth 1 is the target's
    assert drafted_value(lo=1, depth=2) > untouched
    assert drafted_value(lo=0, depth=3, copied=True) == untouched  # a copy, not a draft


def first_layer(seed: int, k: int = 4) -> DraftLayer:
    gen = torch.Generator().manual_seed(seed)
    proposal = torch.rand(1, V, generator=gen, dtype=torch.float64).softmax(-1)
    prob, tokens = proposal[0].topk(k)
    return DraftLayer(tokens, proposal, None, prob, prob.log(), None)


def test_width_cut_cuts_drafted_depth_one_rows_and_every_per_node_tensor():
    k, w = 4, 2
    layers = [[first_layer(i)] for i in range(3)] + [[first_layer(3), first_layer(4)]]
    before = [list(row) for row in layers]
    d = Drafted(layers=layers, depths=[1, 1, 1, 2], pending=[1] * 4, pending_base=0,
                copied=[False, True, False, False])
    dec = SimpleNamespace(width=SimpleNamespace(choose=lambda top: w),
                          widths={1: "tree of 1", 2: "tree of 2", 3: "tree of 3"},
                          config=SimpleNamespace(k_config=(k, 1)))
    asked = []

    def choose(tops: list[list[float]]) -> list[int]:  # the planner's `width`
        asked.append(tops)
        return [w] * len(tops)

    proposals = WidthCut(dec, choose).propose(Proposing(d, torch.zeros(4, 0), [0] * 4))
    assert len(asked) == 1 and len(asked[0]) == 2 and all(len(t) == k for t in asked[0])
    # not the copied row 1, not row 3 (depth 2)
    assert [p is not None for p in proposals] == [True, False, True, False]
    assert [p.tt for p in proposals if p is not None] == ["tree of 2", "tree of 2"]
    ids = lambda layers: [[id(layer) for layer in row] for row in layers]  # noqa: E731
    assert ids(d.layers) == ids(before) and d.trees == {}  # the drafted trees it read: unchanged
    for i, p in enumerate(proposals):
        if p is not None:
            d.take(i, p)
    assert d.trees == {0: "tree of 2", 2: "tree of 2"} and d.depths == [1, 1, 1, 2]
    for i in (0, 2):
        cut, full = d.layers[i][0], before[i][0]
        assert cut.tokens.tolist() == full.tokens[:w].tolist()
        assert cut.prob.tolist() == full.prob[:w].tolist()
        assert cut.log_path.tolist() == full.log_path[:w].tolist()
        rows = cut.host_rows()
        assert rows.shape == (w, 2 + TOP_K_MASS)
        assert torch.equal(rows, full.host_rows()[:w])
        static = torch.zeros(w, 3, dtype=torch.float64)
        assert torch.equal(cut.node_features(static),
                           full.node_features(torch.zeros(k, 3, dtype=torch.float64))[:w])


def test_lookup_proposes_each_planned_chain_on_its_tree():
    chains = torch.tensor([[3, 4, 5], [0, 0, 0], [7, 8, 0]])
    d = Drafted(layers=[[], [], []], depths=[0, 2, 0], pending=[1] * 3, pending_base=0,
                copied=[False] * 3, depth=2)
    on_draft_tree = lookup().propose(Proposing(d, chains, [3, 0, 2]))
    assert on_draft_tree[1] is None
    assert [[int(layer.tokens) for layer in p.layers] for p in on_draft_tree if p] == [
        [3, 4, 5], [7, 8]]
    assert all(p.copied and p.tt is None for p in on_draft_tree if p)
    assert d.depths == [0, 2, 0] and d.copied == [False] * 3  # nothing changed by proposing
    for i, p in enumerate(on_draft_tree):
        if p is not None:
            d.take(i, p)
    assert d.depths == [3, 2, 2] and d.copied == [True, False, True]
    assert d.depth == 3  # the draft's tree now reaches the longest chain
    own = lookup(chain="chain tree").propose(Proposing(d, chains, [3, 0, 2]))
    d2 = Drafted(layers=[[], [], []], depths=[0, 2, 0], pending=[1] * 3, pending_base=0,
                 copied=[False] * 3, depth=2)
    for i, p in enumerate(own):
        if p is not None:
            d2.take(i, p)
    assert d2.trees == {0: "chain tree", 2: "chain tree"} and d2.depth == 2
    assert isinstance(own[0], Proposal)
