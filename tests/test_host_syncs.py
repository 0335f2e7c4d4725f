"""What a decode step asks of the host, counted on the CPU through torch's function mode: a step
reads the device back once (the verdicts of all rows, in one copy), and uploads only through
`mcsd_runtime.transfer.upload` (pinned and non-blocking on CUDA: a plain
`torch.tensor(values, device=cuda)` synchronizes the stream)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_decoder_greedy import prompts
from torch.overrides import TorchFunctionMode

from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder
from mcsd_runtime.decode.engine import Engine

READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
         torch.Tensor.__float__, torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.__index__}


class HostTraffic(TorchFunctionMode):
    """Counts reads back to the host, and uploads that name a device, inside decode steps."""

    def __init__(self) -> None:
        super().__init__()
        self.counts, self.in_step = Counter(), False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.in_step:
            if func in READS:
                self.counts["reads"] += 1
            elif func is torch.tensor and kwargs.get("device") is not None:
                self.counts["blocking uploads"] += 1
        return func(*args, **kwargs)


def traffic(dec, monkeypatch, batch_size: int) -> Counter:
    """Host traffic inside the decode steps of one batch run, and the steps (`steps`)."""
    mode, step = HostTraffic(), Engine.step

    def counted(self, *args, **kwargs):
        mode.in_step = True
        mode.counts["steps"] += 1
        try:
            return step(self, *args, **kwargs)
        finally:
            mode.in_step = False

    monkeypatch.setattr(Engine, "step", counted)
    with mode:
        dec.generate_batch(prompts(dec.pair.vocab_size, n=4), batch_size=batch_size)
    return mode.counts


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("method", ["ar", "static", "heuristic", "switch:0.5:2"])
def test_a_step_reads_the_device_once(pair, monkeypatch, method, batch_size):
    cfg = DecodeConfig(k_config=(4, 2, 1), max_new_tokens=20)
    dec = ARDecoder(pair, cfg) if method == "ar" else MCSDDecoder(pair, cfg, method)
    counts = traffic(dec, monkeypatch, batch_size)
    assert counts["steps"] > 5
    assert counts["reads"] == counts["steps"]
    assert counts["blocking uploads"] == 0


def test_a_stopper_reading_features_reads_once_more_per_depth(pair, monkeypatch):
    """The count can fail: a confidence stopper reads its decision back at every depth."""
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(4, 2, 1), max_new_tokens=20), "confidence:0.3")
    counts = traffic(dec, monkeypatch, 1)
    assert counts["reads"] > counts["steps"]
