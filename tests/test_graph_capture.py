"""`FixedForwards`' capture bookkeeping on the CPU, with the model's forward and the CUDA graph
stood in for: one graph per shape, where the shape includes the logits kept and whether states
are returned; at most `MAX_GRAPHS` graphs; and a failed capture that switches capture off for
good (one warning, eager forwards from then on)."""

from __future__ import annotations

import warnings

import pytest
import torch

from mcsd_runtime.decode import graphs
from mcsd_runtime.decode.graphs import FixedForwards, ForwardOut

VOCAB, HIDDEN = 5, 3
MODEL = torch.nn.Identity()  # only its id enters a graph's key


def fake_model(model, cache, ids, pos, mask, keep, hidden, prev=None,
               ragged=None) -> ForwardOut:
    """Logits [rows, keep, V] and states [rows, n, H] (when asked) read off the ids."""
    logits = ids[:, -keep:, None].double().expand(-1, -1, VOCAB).clone()
    states = ids[..., None].double().expand(-1, -1, HIDDEN).clone() if hidden else None
    return ForwardOut(logits, states)


class Captured:
    """A `graphs.Graph` without CUDA: replays rerun the captured function on its buffers."""

    made = 0

    def __init__(self, run, inputs, pool) -> None:
        self.run, self.inputs = run, {k: v.clone() for k, v in inputs.items()}
        Captured.made += 1

    def replay(self, inputs) -> ForwardOut:
        for name, value in inputs.items():
            self.inputs[name].copy_(value)
        return self.run(**self.inputs)


class Failing:
    """A capture that fails as CUDA's does when memory runs out."""

    tries = 0

    def __init__(self, run, inputs, pool) -> None:
        Failing.tries += 1
        raise RuntimeError("out of graph memory")


@pytest.fixture
def forwards(monkeypatch):
    monkeypatch.setattr(graphs, "call_model", fake_model)
    monkeypatch.setattr(graphs, "Graph", Captured)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    Captured.made = Failing.tries = 0
    fw = FixedForwards(torch.device("cpu"), capture=True, bucket=8)
    fw.caches(2, 16)
    return fw


def forward(fw: FixedForwards, n: int = 3, keep: int = 1, hidden: bool = False,
            first: int = 1) -> ForwardOut:
    """A forward of n tokens over both rows of the target's slot cache."""
    cache = fw._caches[0]
    ids = torch.arange(first, first + 2 * n).view(2, n)
    pos = torch.arange(n).expand(2, n)
    mask = torch.zeros(2, 1, n, cache.span_for(n), dtype=torch.float64)
    return fw(MODEL, cache, ids, pos, mask, keep, hidden)


def test_a_graph_is_keyed_by_the_logits_it_keeps(forwards):
    assert forward(forwards, keep=1).logits.shape == (2, 1, VOCAB)
    two = forward(forwards, keep=2, first=10)  # same width, two positions kept: its own graph
    assert two.logits.shape == (2, 2, VOCAB)
    assert two.logits[:, :, 0].tolist() == [[11, 12], [14, 15]]
    assert Captured.made == 2


def test_a_graph_is_keyed_by_whether_it_returns_states(forwards):
    assert forward(forwards, hidden=False).hidden is None
    out = forward(forwards, hidden=True, first=10)
    assert out.hidden is not None and out.hidden.shape == (2, 3, HIDDEN)
    assert out.hidden[:, :, 0].tolist() == [[10, 11, 12], [13, 14, 15]]
    assert Captured.made == 2
    again = forward(forwards, hidden=True, first=20)  # replayed with the new inputs
    assert again.hidden[0, :, 0].tolist() == [20, 21, 22] and Captured.made == 2


def test_past_max_graphs_new_shapes_run_eagerly(forwards, monkeypatch):
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 2)
    outs = [forward(forwards, keep=k, first=10 * k) for k in (1, 2, 3)]
    assert Captured.made == 2  # the third shape is past the limit
    assert sum(g is not None for g in forwards.graphs.values()) == 2
    assert len(forwards.graphs) == 3 and list(forwards.graphs.values())[-1] is None
    assert outs[2].logits[:, :, 0].tolist() == [[30, 31, 32], [33, 34, 35]]  # eager, right
    assert forwards.kind == "captured"


def test_a_failed_capture_switches_capture_off_for_good(forwards, monkeypatch):
    monkeypatch.setattr(graphs, "Graph", Failing)
    with pytest.warns(RuntimeWarning, match="capture failed"):
        out = forward(forwards, keep=2)
    assert out.logits[:, :, 0].tolist() == [[2, 3], [5, 6]]  # the eager forward's
    assert not forwards.capture and forwards.kind == "fixed"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        other = forward(forwards, n=4, keep=1, hidden=True, first=20)
    assert Failing.tries == 1  # no second try at another shape
    assert other.logits.shape == (2, 1, VOCAB) and other.hidden.shape == (2, 4, HIDDEN)
