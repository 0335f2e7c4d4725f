"""The forward spike (eager, fixed-shape, compiled) at a tiny shape on the CPU: the fixed-shape
forward computes the eager one's logits, and the report has a cell per way and shape."""

from __future__ import annotations

import torch

from conftest import make_pair
from mcsd_runtime.benchmarks.capture_spike import (
    eager_forward,
    fixed_forward,
    run_spike,
    spike_table,
)


def test_fixed_forward_computes_the_eager_logits():
    model = make_pair().target
    with torch.inference_mode():
        eager = eager_forward(model, 2, 20, 3)
        fixed = fixed_forward(model, 2, 20, 3)
        first, again = eager(), eager()
        assert torch.equal(first, again)  # the eager cache is cut back after each call
        torch.testing.assert_close(fixed(), first, rtol=0, atol=1e-9)
        assert not torch.allclose(fixed_forward(model, 2, 21, 3)(), first)


def test_spike_reports_each_way_and_shape():
    rows = run_spike(make_pair(), rows=(1, 2), tokens=(1, 4), context=12, repeats=2)
    assert {(r["way"], r["rows"], r["new_tokens"]) for r in rows} == {
        (w, b, n) for w in ("eager", "fixed") for b in (1, 2) for n in (1, 4)}
    assert all(r["ms"] > 0 for r in rows)
    table = spike_table(rows)
    assert table.count("\n") == 5 and "fixed ms" in table
