"""`mcsd export`: a schedule in vLLM's, TensorRT-LLM's and SGLang's formats, K=0 where an engine
cannot take it, per-category schedules, user mistakes; an engine profile as DSpark's step-cost
table (SGLang, TensorRT-LLM); and vLLM's own validator on the table (where vLLM is installed:
`.venv-vllm/bin/python -m pytest tests/test_schedule_export.py`)."""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right

import pytest

from mcsd_runtime.cli import main
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.serving.cost_table import cost_curve, export_cost_table
from mcsd_runtime.serving.engine_profile import EngineProfile, ProfilePoint
from mcsd_runtime.serving.export import export_schedule, write_exported
from mcsd_runtime.serving.schedule import Schedule

SCHEDULE = Schedule([[1, 3, 5], [4, 15, 2], [16, 63, 1], [64, None, 0]],
                    {"code": [[1, 7, 7], [8, None, 3]]}, {"method": "ngram"})


def test_vllm_gets_inclusive_ranges_and_the_largest_k():
    out = export_schedule(SCHEDULE, "vllm", max_batch_size=256)
    assert out.config == {"num_speculative_tokens_per_batch_size":
                          [[1, 3, 5], [4, 15, 2], [16, 63, 1], [64, 256, 0]],
                          "num_speculative_tokens": 5}
    assert any("--category C" in n for n in out.notes)  # the pooled bands, said so


def test_trtllm_keys_each_band_by_its_end_and_never_writes_zero():
    out = export_schedule(SCHEDULE, "trtllm", max_batch_size=512)
    sched = {int(k): v for k, v in out.config["draft_len_schedule"].items()}
    assert out.config["max_draft_len"] == 5 and sched == {3: 5, 15: 2, 63: 1, 512: 1}
    assert any("K=0 at batch sizes 64+ written as 1" in n and "16888" in n for n in out.notes)

    def trtllm_k(b: int) -> int:  # get_draft_len_for_batch_size: the first key >= b
        keys = sorted(sched)
        i = bisect_left(keys, b)
        return sched[keys[i]] if i < len(keys) else 0

    for b in range(1, 513):
        assert trtllm_k(b) == max(SCHEDULE.k_for(b), 1), b


def test_trtllm_caps_bands_above_the_first_k():
    out = export_schedule(Schedule([[1, 3, 2], [4, None, 4]]), "trtllm", max_batch_size=64)
    assert out.config == {"max_draft_len": 2, "draft_len_schedule": {"3": 2, "64": 2}}
    assert any("K above the first band's 2 at batch sizes 4+ written as 2" in n
               for n in out.notes)


def test_sglang_keys_each_slot_by_its_start_with_one_candidate():
    out = export_schedule(SCHEDULE, "sglang", category="code")
    slots = {int(k): v["candidate_steps"] for k, v in out.config.items() if k.isdigit()}
    assert slots == {1: [7], 8: [3]}
    assert "mcsd_note" in out.config
    keys = sorted(slots)
    for b in (1, 7, 8, 4096):  # AdaptiveStepRouter: the largest key <= b
        assert slots[keys[bisect_right(keys, b) - 1]] == [SCHEDULE.k_for(b, "code")]
    assert any("EAGLE/EAGLE3 only" in n for n in out.notes)  # trained on ngram: said so


def test_k_zero_stays_where_the_engine_takes_it():
    zero = Schedule([[1, 1, 3], [2, None, 0]])
    assert export_schedule(zero, "vllm").config["num_speculative_tokens_per_batch_size"][-1][2] \
        == 0
    assert export_schedule(zero, "sglang").config["2"] == {"candidate_steps": [0]}
    off = export_schedule(Schedule([[1, None, 0]]), "vllm")
    assert off.config["num_speculative_tokens"] == 1  # vLLM refuses 0
    assert any("serve without --speculative-config" in n for n in off.notes)


def test_export_refuses_unknown_categories_and_a_cap_below_the_last_band():
    with pytest.raises(MCSDError, match=r"no bands for category 'chat' \(it has bands for code\)"):
        export_schedule(SCHEDULE, "vllm", category="chat")
    with pytest.raises(MCSDError, match="--max-batch-size 32 ends the open last band 64\\+ "
                                        "before it starts: pass at least 64"):
        export_schedule(SCHEDULE, "trtllm", max_batch_size=32)
    with pytest.raises(MCSDError, match="unknown engine 'tgi'"):
        export_schedule(SCHEDULE, "tgi")


def test_write_is_atomic_and_refuses_a_folder(tmp_path):
    out = export_schedule(SCHEDULE, "vllm")
    path = write_exported(out, tmp_path / "k.json")
    assert json.loads(path.read_text()) == out.config
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(MCSDError, match="is a folder: pass a file path"):
        write_exported(out, tmp_path)
    with pytest.raises(MCSDError, match="cannot write .*; pass a writable --out"):
        write_exported(out, tmp_path / "absent" / "k.json")


def test_the_command_writes_the_file_and_notes(tmp_path, capsys):
    SCHEDULE.write(tmp_path)
    out = tmp_path / "trt.json"
    code = main(["export", str(tmp_path), "--engine", "trtllm", "--out", str(out),
                 "--max-batch-size", "128"])
    captured = capsys.readouterr()
    assert code == 0 and json.loads(out.read_text())["draft_len_schedule"]["128"] == 1
    assert "mcsd export: note: K=0 at batch sizes 64+ written as 1" in captured.err
    assert f"-> {out}" in captured.out


@pytest.mark.parametrize(("table", "message"), [
    ({"format": "mcsd-schedule", "version": 1, "bands": [[1, 8, 4], [5, None, 2]]},
     "overlap at batch sizes 5-8"),
    ({"format": "mcsd-schedule", "version": 1, "bands": [[2, None, 4]]},
     "the first band starts at batch size 2, not 1"),
    ("{broken", "is not readable JSON"),
])
def test_a_bad_table_is_one_clear_line_and_no_file(table, message, tmp_path, capsys):
    (tmp_path / "schedule.json").write_text(table if isinstance(table, str)
                                            else json.dumps(table))
    out = tmp_path / "k.json"
    code = main(["export", str(tmp_path), "--engine", "vllm", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("mcsd: error: ")
    assert not out.exists() and not list(tmp_path.glob("k.json*"))


# ------------------------------------------------------------------ step-cost tables

# step seconds at (concurrency, K): c=2,K=1 and c=4,K=0 both score 4 tokens a step
PROFILE = EngineProfile("vllm", "0.32.0", "m", "float32", "ngram", tuple(
    ProfilePoint(c, k, s, 50) for c, k, s in
    [(1, 0, 0.010), (1, 1, 0.011), (1, 3, 0.012), (2, 1, 0.014), (4, 0, 0.016), (4, 3, 0.040)]))


def test_cost_curve_puts_cells_on_tokens_scored_a_step():
    curve = cost_curve(PROFILE)
    assert curve.tokens == (1, 2, 4, 16)
    assert curve.seconds == pytest.approx((0.010, 0.011, 0.014, 0.040))  # 4: median(12, 14, 16)
    assert curve.spread == pytest.approx(2 / 14)
    assert curve.falls() == []
    with pytest.raises(MCSDError, match="measures one step size only"):
        cost_curve(EngineProfile("vllm", "0", "m", "f", "ngram", (ProfilePoint(1, 0, .01, 5),)))


def sglang_lookup(table: dict, tokens: int) -> float:
    """SGLang's SpsCostTable (dspark_sps.py) as read from its source: its checks, then the rate
    of the largest probe <= tokens."""
    probes, rates = table["sample_batch_tokens"], table["sample_steps_per_sec"]
    assert probes == sorted(set(probes)) and len(probes) == len(rates) >= 2
    assert table["max_batch_tokens"] >= probes[-1]
    return rates[max(0, bisect_right(probes, tokens) - 1)]


def test_sglang_and_trtllm_cost_tables_price_each_step_as_measured():
    sglang = json.loads(json.dumps(export_cost_table(PROFILE, "sglang").config))
    trt = export_cost_table(PROFILE, "trtllm")
    assert set(trt.config) == {"token_counts", "step_time_ms", "fixed_overhead_ms",
                               "minimum_predicted_gain"}  # TensorRT-LLM's legacy curve
    for c, k in [(1, 0), (1, 1), (2, 1), (4, 3)]:  # (2, 1): the median of the cells at 4
        tokens, seconds = c * (k + 1), PROFILE.step_seconds(c, k)
        assert 1 / sglang_lookup(sglang, tokens) == pytest.approx(seconds)
        ms = trt.config["step_time_ms"][trt.config["token_counts"].index(tokens)]
        assert ms == pytest.approx(1000 * seconds)
    assert any("confidence_sps_table_path" in n for n in trt.notes)
    with pytest.raises(MCSDError, match="vllm reads no step-cost table"):
        export_cost_table(PROFILE, "vllm")


def test_export_writes_a_profile_as_a_cost_table(tmp_path, capsys):
    noisy = EngineProfile("vllm", "0.32.0", "m", "float32", "ngram", (
        ProfilePoint(1, 0, 0.010, 9), ProfilePoint(1, 1, 0.008, 9), ProfilePoint(2, 0, .03, 9)))
    src, out = noisy.save(tmp_path / "profile.json"), tmp_path / "sps.json"
    assert main(["export", str(src), "--engine", "sglang", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert json.loads(out.read_text())["sample_batch_tokens"] == [1, 2]
    assert "differ by up to" in err  # 0.008 and 0.030 at 2 tokens
    assert main(["export", str(src), "--engine", "sglang", "--category", "code", "--out",
                 str(tmp_path / "x.json")]) == 2
    assert "an engine profile has none" in capsys.readouterr().err


# ------------------------------------------------------------------ vLLM's own checks


def test_vllm_validates_and_expands_the_exported_table():
    """vLLM's validator takes the table, and its dense lookup (what the scheduler indexes by
    batch size) gives every batch size the schedule's K. SpeculativeConfig takes it too (ngram
    needs no model); it does not check the table itself (the scheduler does, at start)."""
    pytest.importorskip("vllm")
    from vllm.v1.spec_decode.dynamic.utils import (
        build_dynamic_sd_schedule_lookup,
        validate_and_normalize_dynamic_sd_schedule,
    )

    config = export_schedule(SCHEDULE, "vllm", max_batch_size=256).config
    config = json.loads(json.dumps(config))  # as the user passes it
    table = config["num_speculative_tokens_per_batch_size"]
    assert validate_and_normalize_dynamic_sd_schedule(table) == [tuple(r) for r in table]
    dense = build_dynamic_sd_schedule_lookup(table, 300, config["num_speculative_tokens"])
    assert dense[1:] == [SCHEDULE.k_for(b) for b in range(1, 301)]  # past 256 too: carried
    with pytest.raises(ValueError, match="non-overlapping"):
        validate_and_normalize_dynamic_sd_schedule([[1, 8, 4], [5, 16, 2]])

    from vllm.config import SpeculativeConfig

    spec = SpeculativeConfig(method="ngram", prompt_lookup_max=3, **config)
    assert spec.num_speculative_tokens == 5
    assert [list(r) for r in spec.num_speculative_tokens_per_batch_size] == table
