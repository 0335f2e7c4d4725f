"""Tree shapes: k-configs, capped depths, and the topology a Tree derives from them."""

from __future__ import annotations

import json
import pickle

import pytest

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.tree import KConfig, Tree, k_text, parse_k_config


def test_an_uncapped_k_config_is_its_tuple():
    k = parse_k_config("4,2,2,1")
    assert k == (4, 2, 2, 1) and hash(k) == hash((4, 2, 2, 1)) and not k.sparse
    assert str(k) == "4,2,2,1" and k.json() == [4, 2, 2, 1]
    assert parse_k_config([4, 2]) == parse_k_config("(4, 2,)") == (4, 2)
    assert k_text(()) == "() (autoregressive)"


def test_a_capped_depth_is_another_tree():
    k = parse_k_config("4,1/1,1,1")
    assert k.sparse and k.caps == (None, 1, None, None)
    assert k != (4, 1, 1, 1) and (4, 1, 1, 1) != k and k != parse_k_config("4,1,1,1")  # noqa: SIM300 (both sides)
    assert str(k) == "4,1/1,1,1" and parse_k_config(k.json()) == k
    assert pickle.loads(pickle.dumps(k)) == k and json.loads(json.dumps(k.json())) == str(k)
    assert {k: 1}.get(parse_k_config("4,1/1,1,1")) == 1
    assert parse_k_config("4,2/8") == (4, 2)  # a cap at the full size keeps everything


def test_a_capped_tree_grows_under_its_likeliest_nodes():
    tree = Tree(parse_k_config("4,2/2,1"))
    assert tree.sizes == (4, 2, 2) and tree.cum == (0, 4, 6, 8)
    # depth 2 is the two children of node 1 (the likeliest candidate), depth 3 one under each
    assert tree.parents() == [-1, 0, 0, 0, 0, 1, 1, 5, 6]
    assert tree.sibling_ranks() == [0, 0, 1, 2, 3, 0, 1, 0, 0]
    assert [tree.parents_with_children(d) for d in (1, 2, 3)] == [1, 1, 2]
    assert Tree((4, 2, 2, 1)).sizes == (4, 8, 16, 16)


@pytest.mark.parametrize(("spec", "match"), [
    ("4/2,1", "depth 1 takes no cap"),
    ("4,2/3", "multiple of that depth's children"),
    ("4,2/1", "multiple of that depth's children"),
    ("4,1/0", "positive integer"),
    ("4,1/x", "k/cap keeps at most cap nodes"),
    ("4,1/1/1", "k/cap keeps at most cap nodes"),
])
def test_bad_caps_are_refused_with_the_rule(spec, match):
    with pytest.raises(MCSDError, match=match):
        parse_k_config(spec)


def test_a_k_config_and_its_caps_must_agree():
    with pytest.raises(MCSDError, match="2 depths but 1 caps"):
        KConfig((4, 1), (None,))
