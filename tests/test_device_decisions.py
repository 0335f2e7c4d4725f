"""Stoppers decide on the device (`device_continue`) exactly as on the host (`should_continue`),
frontier by frontier through real decodes: the built-ins, and learned LightGBM (its trees as
tensors) and MLP stoppers under every aggregation, with and without calibration."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_decoder_greedy import prompts

from mcsd_runtime.decisions import device_scoring
from mcsd_runtime.decisions.artifact import ArtifactSpec
from mcsd_runtime.decisions.builtin import StopperBase, make_stopper
from mcsd_runtime.decisions.expected_rate import Calibration
from mcsd_runtime.decisions.learned import stopper_from
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder

FIXTURES = Path(__file__).parent / "fixtures" / "stoppers-b8df3aa"


class Both(StopperBase):
    """Asks the inner stopper on the device first (which must not change its state), then on
    the host, and records both decisions."""

    def __init__(self, inner) -> None:
        self.inner, self.pairs = inner, []

    def reset(self) -> None:
        self.inner.reset()

    def should_continue(self, frontier) -> bool:
        on_device = self.inner.device_continue(frontier)
        on_host = self.inner.should_continue(frontier)
        self.pairs.append((bool(on_device), on_host))
        return on_host

    def update(self, drafted: int, accepted: int) -> None:
        self.inner.update(drafted, accepted)


def decisions(pair, inner, k_config=(4, 2, 2, 1)) -> list[tuple[bool, bool]]:
    both = Both(inner)
    dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, max_new_tokens=24), both)
    for p in prompts(pair.vocab_size, n=4):
        dec.generate(p)
    return both.pairs


@pytest.mark.parametrize("spec", ["static:2", "confidence:0.3", "entropy:0.4:0.1",
                                  "cumprod:0.9", "heuristic", "switch:0.5:3", "none"])
def test_builtins_decide_on_the_device_as_on_the_host(pair, spec):
    got = decisions(pair, make_stopper(spec, (4, 2, 2, 1)))
    assert all(d == h for d, h in got)
    if spec != "none":  # (none drafts nothing: no depth to decide)
        assert {h for _, h in got} == {True, False}


def learned(kind: str, **overrides):
    folder = FIXTURES / kind
    return stopper_from(ArtifactSpec.read(folder), folder, **overrides)


@pytest.mark.parametrize("kind", ["lightgbm", "mlp"])
@pytest.mark.parametrize("aggregation", ["sum", "max", "mean", "path"])
def test_learned_stoppers_decide_on_the_device_as_on_the_host(pair, kind, aggregation):
    got = []
    for threshold in (0.02, 0.08, 0.3, 0.6):
        got += decisions(pair, learned(kind, threshold=threshold, aggregation=aggregation,
                                       min_depth=1, min_depth_gate=0.0))
    assert all(d == h for d, h in got)
    assert {h for _, h in got} == {True, False}


@pytest.mark.parametrize("kind", ["lightgbm", "mlp"])
def test_calibrated_per_depth_thresholds_decide_on_the_device_as_on_the_host(pair, kind):
    cal = Calibration((0.0, 0.05, 0.2, 1.0), (0.0, 0.1, 0.3, 0.5))
    got = []
    for scale in (0.5, 1.0, 1.5):
        got += decisions(pair, learned(kind, calibration=cal, aggregation="mean",
                                       depth_thresholds=(0.2 * scale, 0.3 * scale, 0.4 * scale)))
    assert all(d == h for d, h in got)
    assert {h for _, h in got} == {True, False}


def test_online_recalibration_decides_on_the_host():
    assert learned("mlp", online_strength=0.5).device_continue(None) is None


def test_the_comparison_catches_a_wrong_device_rule(pair, monkeypatch):
    monkeypatch.setitem(device_scoring.DEVICE_AGGREGATIONS, "sum",
                        device_scoring.DEVICE_AGGREGATIONS["mean"])
    got = decisions(pair, learned("lightgbm", threshold=0.08, aggregation="sum"))
    assert any(d != h for d, h in got)
