"""The decision-feature layout, named once in `mcsd_runtime.decisions.features`: the decoder's host
rows (`host_nodes` -> `decision_matrix`) and replay's stored node rows (`decision_from_nodes`)
give the same DECISION_FEATURES, column by column, as the full feature matrix."""

from __future__ import annotations

import numpy as np
import torch

from mcsd_runtime.decisions import features as F


def test_decoder_and_replay_decision_features_are_the_full_matrix_columns():
    gen = torch.Generator().manual_seed(0)
    parents, k = 3, 2
    probs = torch.softmax(torch.randn(parents, 40, generator=gen, dtype=torch.float64), -1)
    top = probs.topk(F.TOP_K_MASS, -1).values
    prob = top[:, :k].reshape(-1)  # each parent's k likeliest tokens
    log_path = torch.log(prob) - 1.5
    n = parents * k
    static = torch.stack([torch.full((n,), 2.0), torch.arange(n) % k * 1.0,
                          torch.full((n,), float(n))], -1).double()
    trajectory = [5.0, 2.0, 0.6, 0.7]
    full = F.with_trajectory(F.node_features(static, prob, log_path, probs), trajectory).numpy()
    want = full[:, [F.column(name) for name in F.DECISION_FEATURES]]

    host = F.host_nodes(prob, log_path, top.repeat_interleave(k, 0)).numpy()
    decoder = F.decision_matrix(static.numpy(), host, trajectory)
    replay = F.decision_from_nodes(full[:, :len(F.NODE_FEATURES)], trajectory)
    for got in (decoder, replay):
        assert got.shape == (n, len(F.DECISION_FEATURES)) and got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # node_features: float32
