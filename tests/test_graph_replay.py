"""The captured path's bookkeeping on the CPU: `FixedForwards` with capture on, its CUDA graphs
stood in for by replays that rerun the captured function on the graph's own input buffers. What
this checks is everything but CUDA: a graph per shape, inputs copied into its buffers, rows
padded, outputs copied out before the next replay; and that the cost profile's timer sees
every replay (which runs no module hook)."""

from __future__ import annotations

import pytest
import torch
from test_decoder_greedy import prompts

from mcsd_runtime.benchmarks.measure import ForwardTimer
from mcsd_runtime.decode import graphs
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
from mcsd_runtime.decode.graphs import FixedForwards


class StandIn:
    """A `graphs.Graph` without CUDA: replay reruns the function on the buffers, with the
    models' forward hooks held back (a real replay runs no Python, so no hook)."""

    made, models = 0, []

    def __init__(self, run, inputs, pool) -> None:
        self.run, self.inputs = run, {k: v.clone() for k, v in inputs.items()}
        StandIn.made += 1

    def replay(self, inputs):
        for name, value in inputs.items():
            self.inputs[name].copy_(value)
        held = [(m, dict(m._forward_pre_hooks), dict(m._forward_hooks)) for m in self.models]
        for m, _, _ in held:
            m._forward_pre_hooks.clear()
            m._forward_hooks.clear()
        try:
            out = self.run(**self.inputs)
        finally:
            for m, pre, post in held:
                m._forward_pre_hooks.update(pre)
                m._forward_hooks.update(post)
        return graphs.ForwardOut(out.logits.clone(),
                                 None if out.hidden is None else out.hidden.clone())


@pytest.fixture
def captured(monkeypatch, pair):
    monkeypatch.setattr(graphs, "Graph", StandIn)
    monkeypatch.setattr(StandIn, "models", [pair.target, pair.draft])
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    StandIn.made = 0

    def make(dec):
        dec.forwards = FixedForwards(dec.pair.device, capture=True, bucket=8)
        return dec

    return make


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_replayed_graphs_decode_as_eager(pair, captured, temperature):
    cfg = DecodeConfig(k_config=(4, 2, 1), max_new_tokens=24, temperature=temperature,
                       graphs="off")
    ps = prompts(pair.vocab_size, n=6)
    want = MCSDDecoder(pair, cfg, "heuristic").generate_batch(ps, batch_size=5)
    dec = captured(MCSDDecoder(pair, cfg, "heuristic"))
    got = dec.generate_batch(ps, batch_size=5)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    shapes = len(dec.forwards.graphs)
    assert 1 < shapes == StandIn.made < got.stats.target_calls + got.stats.draft_calls
    again = dec.generate_batch(ps, batch_size=5)  # the same shapes: no new graph
    assert [r.token_ids for r in again] == [r.token_ids for r in want]
    assert StandIn.made == shapes


def test_the_profile_timer_sees_every_replay(pair, captured):
    dec = captured(MCSDDecoder(pair, DecodeConfig(k_config=(2, 1), max_new_tokens=16), "static"))
    with ForwardTimer(pair) as log:
        stats = dec.generate_batch(prompts(pair.vocab_size, n=3), batch_size=3).stats
    assert sum(name == "target" for name, *_ in log) == stats.target_calls
    assert sum(name == "draft" for name, *_ in log) == stats.draft_calls
    assert not graphs.REPLAY_OBSERVERS  # the timer leaves no observer behind


class Stale(StandIn):
    """A broken stand-in: replays on the inputs it was captured with."""

    def replay(self, inputs):
        return super().replay({})


def test_the_check_fails_on_graphs_that_keep_stale_inputs(pair, captured, monkeypatch):
    cfg = DecodeConfig(k_config=(2, 1), max_new_tokens=16, graphs="off")
    ps = prompts(pair.vocab_size, n=3)
    want = [r.token_ids for r in MCSDDecoder(pair, cfg, "static").generate_batch(ps, 3)]
    dec = captured(MCSDDecoder(pair, cfg, "static"))
    monkeypatch.setattr(graphs, "Graph", Stale)
    assert [r.token_ids for r in dec.generate_batch(ps, 3)] != want
