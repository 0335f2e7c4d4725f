"""What `mcsd export` writes for SGLang's DSpark planner, read by SGLang's own loaders: the
modules `sglang/srt/speculative/dspark_components/dspark_sps.py` and `dspark_sts.py` of the
SGLang wheel the Makefile installs without its dependencies (`SGLANG_SPEC`), each loaded from its
file so that SGLang's package (which imports its GPU stack) is never imported."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from mcsd_runtime.serving.cost_table import export_cost_table
from mcsd_runtime.serving.engine_profile import EngineProfile, ProfilePoint
from mcsd_runtime.serving.export import write_exported

DSPARK = "srt/speculative/dspark_components"


def sglang_module(name: str) -> ModuleType:
    """SGLang's `DSPARK/name.py`, executed alone (it imports only msgspec and torch)."""
    found = importlib.util.find_spec("sglang")
    if found is None or not found.submodule_search_locations:
        pytest.fail("SGLang's wheel is missing: `make venv` installs it (--no-deps)")
    path = Path(found.submodule_search_locations[0], DSPARK, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_sglang_{name}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sglang_reads_the_cost_table_as_measured(tmp_path):
    sps = sglang_module("dspark_sps")
    profile = EngineProfile("vllm", "0.32.0", "m", "float32", "ngram", tuple(
        ProfilePoint(c, k, s, 20) for c, k, s in
        [(1, 0, 0.010), (1, 3, 0.013), (4, 0, 0.016), (4, 3, 0.040)]))
    path = write_exported(export_cost_table(profile, "sglang"), tmp_path / "sps.json")
    table = sps.load_sps_table_from_path(str(path))
    assert isinstance(table, sps.SpsCostTable) and not sps.is_uninitialized_sps_table(table)
    for c, k in [(1, 0), (1, 3), (4, 3)]:  # 1, 4 (the median of two cells) and 16 tokens
        expected = 1 / profile.step_seconds(c, k) if (c, k) != (1, 3) else 1 / 0.0145
        assert table.lookup(c * (k + 1)) == pytest.approx(expected)
    assert table.lookup(10) == table.lookup(4)  # a floor between probes


def test_sglang_reads_the_sts_calibration(tmp_path):
    from mcsd_runtime.decisions.sts import StsCalibration

    sts = sglang_module("dspark_sts")
    ours = StsCalibration((0.5, 1.25, 2.0), "inst-mix", 7, (0.2, 0.1, 0.3), (0.05, 0.04, 0.02),
                          {"report": {"held_out": True}})
    read = sts.load_sts_calibration_from_path(str(ours.write(tmp_path / "sts.json")))
    assert read.temperatures == [0.5, 1.25, 2.0] and read.num_samples == 7
    assert read.ece_before == [0.2, 0.1, 0.3] and read.ece_after == [0.05, 0.04, 0.02]
