"""`mcsd step-breakdown` (`benchmarks.step_breakdown`): a step's forwards against the decoder's
own work, eager against captured, the host syncs per step, the bandwidth bound and the forward
probe, on a random-weight pair of a known shape."""

from __future__ import annotations

import json

import pytest
import torch

from mcsd_runtime.benchmarks import step_breakdown as sb
from mcsd_runtime.cli import main as mcsd
from mcsd_runtime.decisions.builtin import StaticStopper

ARGS = ["--shape", "tiny", "--draft-layers", "1", "--device", "cpu", "--dtype", "fp32",
        "--k-config", "1,1", "--max-new-tokens", "8", "--prompt-count", "1",
        "--prompt-tokens", "16", "--rounds", "1", "--copy-mib", "1", "--graphs", "off"]


def step_breakdown(argv: list[str]) -> int:
    """`mcsd step-breakdown ARGV`'s exit status."""
    return mcsd(["step-breakdown", *argv])


def test_each_method_splits_its_steps_into_forwards_and_the_rest(tmp_path, capsys):
    out = tmp_path / "steps.json"
    assert step_breakdown([*ARGS, "--methods", "ar,static:2", "--graphs", "off,on", "--rounds", "3",
                    "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["device"] == "cpu" and got["timer"] == "perf_counter" and got["repeats"] == 3
    assert {(r["method"], r["graphs"]) for r in got["rows"]} == {
        (m, g) for m in ("ar", "static:2") for g in ("off", "on")}
    for r in got["rows"]:
        assert r["error"] is None and r["steps"] > 0 and r["forwards_ms_per_step"] > 0
        assert len(r["step_ms_runs"]) == 3
        assert r["step_ms"] == pytest.approx(sorted(r["step_ms_runs"])[1])
        assert r["forwards_ms_per_step"] + r["other_ms_per_step"] == pytest.approx(
            r["step_ms_synced"], abs=2e-3)
        assert (r["draft_ms_per_call"] > 0) == (r["method"] != "ar")
    for g in ("off", "on"):
        assert got["launches"][g]["static:2"]["steps"] > 0
        assert got["launches"][g]["ar"]["device_busy"] is None  # no device on a CPU
    printed = capsys.readouterr().out
    assert '"method": "static:2"' in printed and "| ar |" in printed


def test_the_bound_and_the_probe_are_reported(tmp_path):
    out = tmp_path / "steps.json"
    assert step_breakdown([*ARGS, "--methods", "hf,ar", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    rows = {r["method"]: r for r in got["rows"]}
    assert rows["hf"]["step_ms"] > 0 and rows["hf"]["steps"] == 8  # generate(): 8 new tokens
    bound = got["bound"]
    pair = sb.shaped_pair("tiny", 1, "cpu", torch.float32)
    assert bound["target_bytes"] == sb.weight_bytes(pair.target) > bound["draft_bytes"] > 0
    assert bound["copy_GBps"] > 0 and bound["target_forward_ms"] > 0
    assert bound["ar_over_bound"]["off"] == pytest.approx(
        rows["ar"]["step_ms"] / bound["target_forward_ms"], rel=0.01)
    probe = got["forward_probe"]
    assert probe["context"] == 16 and min(probe["warm_ms"], probe["fresh_ms"]) > 0
    assert "fresh_no_cudnn_ms" not in probe  # CUDA only


def test_weight_bytes_count_what_a_forward_reads():
    pair = sb.shaped_pair("tiny", 1, "cpu", torch.float32)
    tied = pair.target  # tiny ties its head: the shared matrix counts once
    assert sb.weight_bytes(tied) == 4 * sum(p.numel() for p in tied.parameters())
    untied = sb._build({**sb.SHAPES["tiny"], "tie_word_embeddings": False}, 1, "cpu",
                       torch.bfloat16, seed=0)
    emb = untied.get_input_embeddings().weight
    assert {p.dtype for p in untied.parameters()} == {torch.bfloat16}
    assert sb.weight_bytes(untied) == 2 * (sum(p.numel() for p in untied.parameters())
                                           - emb.numel())


def test_the_7b_shape_has_the_llama_68m_draft_and_builds_on_the_meta_device():
    pair = sb.shaped_pair("llama2-7b", 4, "meta", torch.bfloat16)
    assert pair.draft_name == "llama-68m" and pair.dtype == torch.bfloat16
    t, d = pair.target.config, pair.draft.config
    assert (t.vocab_size, t.hidden_size, t.intermediate_size, t.num_hidden_layers,
            t.num_attention_heads, t.num_key_value_heads, t.max_position_embeddings) == (
        32000, 4096, 11008, 32, 32, 32, 4096)
    assert (d.hidden_size, d.intermediate_size, d.num_hidden_layers, d.num_attention_heads) == (
        768, 3072, 2, 12)
    assert not t.tie_word_embeddings and not d.tie_word_embeddings
    assert sum(p.numel() for p in pair.target.parameters()) == 6_738_415_616
    assert pair.target.device.type == "meta"  # nothing materialised on the CPU


def test_a_method_that_fails_at_run_time_is_a_row_with_its_error(monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(sb, "breakdown", broken)
    out = tmp_path / "steps.json"
    assert step_breakdown([*ARGS, "--methods", "ar", "--no-probe", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["error"] == "RuntimeError: capture failed" and row["step_ms"] is None


def test_decisions_are_timed_per_stopper_on_request(tmp_path):
    out = tmp_path / "steps.json"
    assert step_breakdown([*ARGS, "--methods", "ar,static:2,confidence:0.5", "--decisions",
                    "--no-probe", "--out", str(out)]) == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["ar"]["decision_us"] is None
    assert rows["static:2"]["decision_us"] > 0 and rows["confidence:0.5"]["decision_us"] > 0
    assert step_breakdown([*ARGS, "--methods", "static:2", "--no-probe", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["rows"][0]["decision_us"] is None


def test_launch_counts_see_a_stopper_that_syncs_on_every_decision(monkeypatch):
    pair = sb.shaped_pair("tiny", 1, "cpu", torch.float32)
    prompt = list(range(3, 19))
    clean = sb.launch_counts(pair, "static:2", (1, 1), prompt, 8)

    def syncing(self, frontier):
        torch.ones(1).item()  # a hidden host sync in the hot path
        return self.depth is None or frontier.depth < self.depth

    monkeypatch.setattr(StaticStopper, "should_continue", syncing)
    broken = sb.launch_counts(pair, "static:2", (1, 1), prompt, 8)
    assert broken["aten::_local_scalar_dense"] >= clean["aten::_local_scalar_dense"] + 1


def test_bad_input_is_an_error_not_a_traceback(capsys):
    assert step_breakdown([*ARGS, "--methods", "ar,static:5"]) == 2
    err = capsys.readouterr().err
    assert "static:5 needs a tree of at least 5 depths" in err and "Traceback" not in err
    assert step_breakdown([*ARGS, "--prompt-count", "0"]) == 2
    assert "must be positive" in capsys.readouterr().err
    assert step_breakdown([*ARGS, "--graphs", "off,maybe"]) == 2
    assert "--graphs takes auto, on, off" in capsys.readouterr().err


def test_the_profile_warms_every_shape_up_on_an_accelerator():
    """`mcsd profile` on a GPU timed first-seen shapes (a cuDNN attention plan built per new
    cache length: 43 ms a forward against 1.7 ms warm); there every decoder now decodes every
    prompt before the timed runs, while a CPU keeps its single warm-up."""
    from types import SimpleNamespace

    from mcsd_runtime.benchmarks import measure

    class Decoder:
        def __init__(self):
            self.seen = []

        def generate(self, ids):
            self.seen.append(ids)

        def generate_batch(self, ids, batch_size):
            self.seen.append(("batch", len(ids), batch_size))

    prompts = [[1], [2], [3]]
    for device, batch in (("cpu", 1), ("meta", 1), ("cpu", 2), ("meta", 2)):
        decs = {0: Decoder(), 1: Decoder(), 2: Decoder()}
        measure._warm_up(SimpleNamespace(device=torch.device(device)), decs, prompts, 2, batch)
        if device == "cpu":
            assert decs[2].seen == ([[1]] if batch == 1 else [("batch", 2, 2)])
            assert decs[0].seen == decs[1].seen == []
        else:
            want = prompts if batch == 1 else [("batch", 3, 2)]
            assert all(d.seen == want for d in decs.values())
