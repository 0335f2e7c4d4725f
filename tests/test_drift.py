"""Low-precision drift: AR and MCSD decoded in a reference and a low precision, each compared
with reference AR, per category."""

from __future__ import annotations

import json

import torch

from conftest import make_pair
from mcsd_runtime.decode.decoder import ARDecoder
from mcsd_runtime.decode.records import DecodeConfig
from mcsd_runtime.evaluate.divergence import top2_margin
from mcsd_runtime.evaluate.drift import DriftRow, drift_table, measure_drift, summarize

PROMPTS = [("p0", "a", [1, 5, 9]), ("p1", "a", [3, 4]), ("p2", "b", [7, 7, 2, 11]),
           ("p3", "b", [12, 30])]


def _run(low: torch.dtype = torch.bfloat16):
    pair = make_pair(vocab=64, noise=0.05)
    config = DecodeConfig(k_config=(2, 2, 1), max_new_tokens=24)
    rows = measure_drift(pair, PROMPTS, config, low=low, reference=torch.float64)
    return pair, config, rows


def test_reference_mcsd_equals_reference_ar_and_the_low_runs_are_the_low_models():
    pair, config, rows = _run()
    assert pair.target.dtype == torch.float64  # the caller's pair is untouched
    assert all(r.first_diff["mcsd_ref"] is None for r in rows)
    ref = ARDecoder(pair, config)
    for r, (_, _, ids) in zip(rows, PROMPTS, strict=True):
        assert r.outputs["ar_ref"] == ref.generate(ids).token_ids
    pair.target.to(torch.bfloat16)
    pair.draft.to(torch.bfloat16)
    ar_low = ARDecoder(pair, config)
    for r, (_, _, ids) in zip(rows, PROMPTS, strict=True):
        assert r.outputs["ar_low"] == ar_low.generate(ids).token_ids


def test_bf16_parts_from_the_reference_and_the_margin_is_the_reference_targets():
    pair, _, rows = _run()
    parted = [(r, run) for r in rows for run in ("ar_low", "mcsd_low")
              if r.first_diff[run] is not None]
    assert parted, "bf16 on a random tiny pair parts from float64 somewhere"
    for r, run in parted:
        i = r.first_diff[run]
        assert r.outputs[run][:i] == r.outputs["ar_ref"][:i]
        assert r.outputs[run][i:i + 1] != r.outputs["ar_ref"][i:i + 1]
        prompt = dict((p[0], p[2]) for p in PROMPTS)[r.prompt_id]
        assert r.margin[run] == top2_margin(pair.target, prompt + r.outputs["ar_ref"][:i])


def _row(pid: str, cat: str, ar_low: int | None, mcsd_low: int | None,
         same_low: bool) -> DriftRow:
    ref = [1, 2, 3, 4]
    low_ar = ref if ar_low is None else ref[:ar_low] + [9] * (4 - ar_low)
    low_mcsd = low_ar if same_low else ([8] * 4 if mcsd_low == 0 else ref)
    return DriftRow(pid, cat, {"ar_ref": ref, "mcsd_ref": ref, "ar_low": low_ar,
                               "mcsd_low": low_mcsd},
                    {"mcsd_ref": None, "ar_low": ar_low, "mcsd_low": mcsd_low},
                    {"mcsd_ref": None, "ar_low": None if ar_low is None else 0.5,
                     "mcsd_low": None if mcsd_low is None else 0.25})


def test_summary_by_category_and_all():
    rows = [_row("a", "x", 2, 2, True), _row("b", "x", None, None, True),
            _row("c", "y", 1, 0, False), _row("d", "y", None, None, True)]
    s = summarize(rows)
    assert s["x"]["prompts"] == 2 and s["all"]["prompts"] == 4
    assert s["x"]["ar_low"]["equal_share"] == 0.5
    assert s["x"]["ar_low"]["first_diff_median"] == 2
    assert s["y"]["mcsd_low"]["first_diff_median"] == 0
    assert s["all"]["ar_low"]["first_diff_median"] == 1.5
    assert s["all"]["mcsd_low"]["margin_median"] == 0.25
    assert s["y"]["mcsd_low_equals_ar_low"] == 0.5
    assert s["x"]["mcsd_ref"]["equal_share"] == 1.0
    table = drift_table(s)
    assert table.splitlines()[-1].startswith("| all | 4 | 100% | 50% | 50% | 75% |")


def test_the_command_writes_its_table_and_every_output(toy_tiny, tmp_path, capsys):
    from mcsd_runtime.cli import main

    out = tmp_path / "drift"
    code = main(["drift", "--target", str(toy_tiny / "target"), "--draft",
                 str(toy_tiny / "draft"), "--prompts", "toy-code", "--limit", "2",
                 "--max-new-tokens", "8", "--k-config", "2,1", "--out", str(out)])
    assert code == 0
    saved = json.loads((out / "drift.json").read_text())
    assert len(saved["rows"]) == 2 and saved["k_config"] == [2, 1]
    assert all(len(r["outputs"]["ar_ref"]) == 8 for r in saved["rows"])
    table = (out / "drift.md").read_text()
    shown = capsys.readouterr()
    assert table.strip() in shown.out
    assert table.splitlines()[-1].startswith("| all | 2 | 100% |")
    assert "drift: 8/8 decodes (100%)" in shown.err and "done" in shown.err  # the progress


def test_the_command_refuses_a_dtype(tmp_path, capsys):
    from mcsd_runtime.cli import main

    assert main(["drift", "--target", "toy:tiny", "--dtype", "bf16",
                 "--out", str(tmp_path / "d")]) == 2
    assert "drop it" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
