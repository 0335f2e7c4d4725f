"""The GPU check against the lease it must fit, simulated on this CPU: the allowances and the
15 minutes, a preflight slower than its allowance (a cold start) that still leaves the engine its
captured rows, a stage stopped at its allowance whose figures reach the report, an evaluation that
keeps each record as it is decoded, call 2 on a fresh machine without call 1's parts, and the
whole device command against a fake $OUT. Stages are stand-in processes: nothing here decodes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from test_gpu_check import _wheel

from mcsd_runtime.gpu_check import (
    check_report,
    engine_check,
    figures,
    lease,
    main,
    plan,
    staging,
)
from mcsd_runtime.gpu_check.runner import Options, Runner

ROOT = Path(__file__).resolve().parents[1]


def _py(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def test_the_lease_fits_15_minutes_with_a_minute_to_spare():
    allowances, deadlines = plan.GPU.allowances, plan.CALL_DEADLINES
    late = [n for n in allowances if n.startswith(plan.LATE)]
    by_call = {1: [n for n in allowances if n.startswith("engine-")],
               2: [n for n in allowances if not n.startswith("engine-") and n not in late]}
    for call, names in by_call.items():  # each call's allowances, reserve and room
        used = sum(allowances[n] for n in names) + lease.CALL_RESERVE_S[call]
        assert used + lease.CALL_ROOM_S == deadlines[call] and lease.CALL_ROOM_S >= 10
    # the machine's start, both calls and the gap between them, with 60 s to spare
    stages = sum(allowances[n] for names in by_call.values() for n in names)
    total = stages + sum(lease.CALL_RESERVE_S.values()) + 2 * lease.CALL_ROOM_S
    assert 120 + total + 30 + 60 <= 15 * 60 and lease.lease_left(deadlines) >= 60
    # even if both calls run to their timeouts
    assert 120 + sum(d + lease.TIMEOUT_SLACK_S for d in deadlines.values()) + 30 <= 15 * 60
    assert {c: d for c, d in deadlines.items()} == {1: 235, 2: 445}


def test_each_engine_stage_fits_its_estimate_with_a_1_5x_margin():
    for i, shape in enumerate(plan.GPU.shapes.split(",")):
        run = plan.engine_run(plan.GPU, shape)
        assert run.layouts == 2 and run.exact == (shape == "smollm2")  # ragged rows counted
        estimate = lease.engine_estimate(lease.SHAPES[shape], run)
        assert list(estimate)[1:] == list(lease.PHASES)
        cold = lease.COLD_START_S if i == 0 else 0
        assert plan.GPU.allowances[f"engine-{shape}"] - cold >= 1.5 * sum(estimate.values())
        # the eager batch rows at both layouts (B=1, B=8 padded and ragged) would not fit
        full = dataclasses.replace(run, eager_batch=(1, 8, 8), eager_repeats=3, eager_tokens=64)
        assert lease.engine_allowance(lease.SHAPES[shape], full) > plan.GPU.allowances[
            f"engine-{shape}"]
    estimate = lease.engine_estimate(lease.SHAPES["smollm2"], plan.engine_run(plan.GPU,
                                                                                "smollm2"))
    assert round(sum(estimate.values())) == 56  # the allowance note in plan.py and the docs


def test_the_docs_give_the_plans_allowances_and_deadlines():
    doc = (ROOT / "docs" / "gpu-check.md").read_text()
    for call, deadline in plan.CALL_DEADLINES.items():
        row = next(line for line in doc.splitlines() if line.startswith(f"| {call} "))
        assert f"| {deadline} ({deadline + lease.TIMEOUT_SLACK_S}) |" in row, row
        for name, seconds in re.findall(r"([a-z0-9.-]+) (\d+)", row.split("|")[2]):
            assert plan.GPU.allowances[name] == int(seconds), (name, seconds)
    for line in check_report.device_calls():
        assert line.split(": ", 1)[1] in doc  # the calls to paste, as the script prints them


def test_a_cold_machine_gets_a_recovery_that_fits_or_is_told_to_wait():
    assert lease.recovery_deadline(300, plan.CALL_DEADLINES[2]) is None
    got = lease.recovery_deadline(500, plan.CALL_DEADLINES[2])
    assert lease.MIN_RECOVERY_S <= got < plan.CALL_DEADLINES[2]
    assert lease.recovery_deadline(2000, plan.CALL_DEADLINES[2]) == plan.CALL_DEADLINES[2]
    left = 500
    assert (lease.MACHINE_START_S + lease.RECOVERY_JOIN_S + lease.CALL_GAP_S
            + got + lease.TIMEOUT_SLACK_S <= left)


def _engine_json(path: Path, shape: str = "smollm2") -> Path:
    """An engine check's JSON as far as its captured rows (the real `Doc`, goals included)."""
    doc = engine_check.Doc(path, {"shape": shape, "gpu": "Fake GPU"})
    doc.put("bound", {"target_forward_ms": 1.0})
    for method, ms in (("ar", 2.0), ("static:1", 2.4)):
        doc.append("rows", {"method": method, "graphs": "on", "step_ms": ms, "path": "captured"})
    for rows, layout, ms in ((1, "padded", 2.0), (8, "padded", 2.8), (8, "ragged", 2.5)):
        doc.append("batch", {"method": "ar", "rows": rows, "graphs": "on", "layout": layout,
                             "step_ms": ms, "path": "captured"})
    doc.put("launches", {"on": {"ar": {"device_busy": 0.85}}})
    doc.data["phases"] = {"bound": 0.5, "captured": 9.0}
    doc.write()
    return path


SLOW = "import time\ntime.sleep(60)\n"
HANG = "import shutil, sys, time; shutil.copy(sys.argv[1], sys.argv[2]); time.sleep(60)"


def test_a_slow_preflight_is_stopped_and_the_engine_still_returns_its_captured_rows(tmp_path):
    (tmp_path / "pkgs").mkdir()
    (tmp_path / "pkgs" / "slowpkg.py").write_text(SLOW)  # a cold import slower than the allowance
    run, src = tmp_path / "run", _engine_json(tmp_path / "measured.json")
    preflight = [sys.executable, "-m", "mcsd_runtime.gpu_check.preflight", "--out",
                 str(run / "preflight.json"), "--packages", "json,slowpkg,csv", "--found", ""]
    stages = [plan.Stage("preflight", 2.0, (), "preflight.json", lambda r: preflight,
                         lambda r: figures.preflight(r / "preflight.json"), always=True),
              plan.Stage("engine-smollm2", 1.5, (), "engine-smollm2.json",  # stopped mid-eager
                         lambda r: _py(HANG, str(src), str(r / "engine-smollm2.json")),
                         lambda r: figures.engine(r / "engine-smollm2.json"), goals=True)]
    write = check_report.Writer(run, {"preset": "test", "started": "now"}, tmp_path / "out",
                                {"engine-smollm2": run / "engine-smollm2.json"})
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "pkgs"), str(ROOT)])}
    records = Runner(stages, Options(run=run, quiet=True, env=env, deadline_s=60,
                                     start=time.time() - 20), write).run()  # a late start
    write(records)
    pre, eng = records
    assert pre["status"] == "timeout" and eng["status"] == "timeout"  # neither waits on the other
    assert pre["figures"]["versions"] == {"json": json.__version__}  # written as it went
    done = json.loads((run / "preflight.json").read_text())
    assert not done["complete"] and "csv" not in done["packages"]
    assert eng["figures"]["goals"]["ar_ms"] == 2.0 and eng["figures"]["phases_s"]["captured"]
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    goals = rep["goals"]["engine-smollm2"]
    assert goals["status"] == "timeout" and list(goals["goals"]) == list(figures.GOALS)
    assert goals["goals"]["gpu_busy"] == {"value": 0.85, "goal": ">= 0.8", "reached": True}
    assert goals["goals"]["b8_over_b1"]["value"] == 1.25  # ragged B=8 over B=1
    assert goals["goals"]["ar_vs_hf"]["value"] is None and rep["gpu"] == "Fake GPU"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| goal | target | engine-smollm2 (timeout) |" in md
    assert "| gpu_busy | >= 0.8 | 0.85 (reached) |" in md and "| ar_vs_hf | >= 3.0 | - |" in md


def test_a_stopped_evaluation_reports_each_method_it_finished(tmp_path):
    """Its records so far, not an earlier run's table."""
    run = tmp_path / "run"
    lines = [{"method": m, "prompt_id": p, "sample": 0, "tokens_per_s": v}
             for p, ar, s1 in (("a", 10.0, 15.0), ("b", 20.0, 20.0)) for m, v in
             (("ar", ar), ("static:1", s1))] + [{"method": "ar", "prompt_id": "c",
                                                 "tokens_per_s": 30.0}]
    text = "".join(json.dumps(x) + "\n" for x in lines) + '{"method": "stat'  # cut mid-line
    code = ("import pathlib, sys, time; p = pathlib.Path(sys.argv[1]); "
            "p.write_text(sys.argv[2]); time.sleep(60)")
    old = run / "eval-t0" / "domains.json"  # an earlier run's table, finished before this one
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"rows": [{"method": "static:1", "vs_ar": 9.0}]}))
    os.utime(old, (time.time() - 60, time.time() - 60))
    stages = [plan.Stage("eval-t0", 1.5, (), "eval-t0",
                         lambda r: _py(code, str(r / "eval-t0" / plan.RECORDS), text),
                         lambda r: figures.evaluation(r / "eval-t0"))]
    write = check_report.Writer(run, {"preset": "test", "started": "now"}, None)
    rec = Runner(stages, Options(run=run, quiet=True), write).run()[0]
    assert rec["status"] == "timeout"
    assert rec["figures"] == {"vs_ar": {"static:1": pytest.approx(1.5 ** 0.5, abs=1e-3)},
                              "ar_tokens_per_s": 20.0, "prompts_done": 3, "records": 5,
                              "partial": True}
    write([rec])
    assert "prompts_done 3" in (run / "report.md").read_text()


def test_eval_appends_each_record_as_it_is_decoded(tmp_path):
    from mcsd_runtime.evaluate.loop import RECORD_OBSERVERS, run_runners
    from mcsd_runtime.evaluate.record import Record
    from mcsd_runtime.gpu_check.eval_stage import Appender

    class Stub:
        def __init__(self, speed: float) -> None:
            self.speed = speed

        def generate(self, ids: list[int]) -> Record:
            return Record(method="", prompt_id="", token_ids=[1] * 4, new_tokens=4,
                          wall_time=4 / self.speed, target_calls=4, draft_calls=0,
                          drafted_tokens=None, accepted_tokens=None, acceptance_rate=None,
                          lossless=True, steps=[])

    path = tmp_path / "eval" / plan.RECORDS
    seen: list[int] = []
    RECORD_OBSERVERS.extend([Appender(path), lambda r: seen.append(
        len(path.read_text().splitlines()))])
    try:
        run_runners(None, {"ar": Stub(10.0), "static:1": Stub(20.0)},
                    [("p1", [1, 2]), ("p2", [3])], greedy=False, progress=False)
    finally:
        del RECORD_OBSERVERS[-2:]
    assert seen == [1, 2, 3, 4]  # on the file before the next decode started
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert {(r["method"], r["prompt_id"]) for r in rows} == {
        (m, p) for m in ("ar", "static:1") for p in ("p1", "p2")}
    assert figures.partial_evaluation(path)["vs_ar"] == {"static:1": 2.0}


def _stage_call2_only(tmp_path: Path) -> tuple[Path, Path]:
    """A staging split for two calls, with only call 2's folder carried (a fresh machine)."""
    src = tmp_path / "download"
    src.mkdir()
    big = _wheel(src, "fake-smollm2==0.1.2", {"fake_smollm2/model.gguf": b"G" * 50_000})
    small = _wheel(src, "fake-extra==1.0", {"fake_extra/__init__.py": b""})
    stage_dir = tmp_path / "stage"
    staging.split(big, [small], stage_dir)
    return stage_dir, tmp_path / "site"


def _quick(stages_: list[plan.Stage], engine_src: Path | None = None) -> list[plan.Stage]:
    """The plan's stages, each a process that prints (an engine stage copies `engine_src`)."""
    copy = "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])"
    return [dataclasses.replace(
        st, argv=lambda run, st=st: _py(copy, str(engine_src), str(run / st.output))
        if st.goals else _py("print('ran')")) for st in stages_]


def test_call_2_on_a_fresh_machine_says_what_it_skips_and_runs_the_rest(tmp_path, monkeypatch,
                                                                        capsys):
    stage_dir, site = _stage_call2_only(tmp_path)
    (stage_dir / "call1").rename(tmp_path / "gone-with-the-machine")
    got = staging.join(stage_dir, site, progress=print)
    assert not got["joined"] and got["missing"] and "fake_extra-1.0-py3-none-any.whl" in got[
        "wheels"]  # call 2's own wheels install
    assert "call 2 on a fresh machine" in capsys.readouterr().out
    real = plan.stages
    monkeypatch.setattr(plan, "stages", lambda sizes: _quick(real(sizes)))
    run = tmp_path / "run"
    code = main(["run", "--call", "2", "--out", str(run), "--dir", str(stage_dir), "--site",
                 str(site), "--quiet"])
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("== call 2 on a fresh")]
    assert len(notes) == 1  # one line says what is skipped and why
    skipped = plan.needing(real(plan.GPU), "target")
    assert f"so {', '.join(skipped)} are skipped" in notes[0] and "docs/gpu-check.md" in notes[0]
    rep = json.loads((run / "report.json").read_text())
    status = {r["stage"]: r for r in rep["stages"]}
    assert status["target"]["status"] == "skipped" and "fresh machine" in status["target"][
        "reason"]
    assert all(status[n]["status"] == "skipped" for n in skipped)
    assert {n for n, r in status.items() if r["status"] == "done"} == {
        "preflight", "spike-smollm2", "spike-llama2-7b"}  # what needs no real pair runs
    assert status["engine-smollm2"]["status"] == "not selected" and code == 1
    assert rep["notes"] == [notes[0].removeprefix("== ")]
    assert notes[0].removeprefix("== ") in (run / "report.md").read_text()


SHIM = """import dataclasses, sys
sys.path.insert(0, {root!r})
from mcsd_runtime.gpu_check import main, plan
copy = "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])"
real = plan.stages
plan.stages = lambda sizes: [dataclasses.replace(  # what _quick does, without this test's torch
    st, argv=lambda run, st=st: [sys.executable, "-c", copy, {src!r}, str(run / st.output)]
    if st.goals else [sys.executable, "-c", "print('ran')"]) for st in real(sizes)]
extra = {{"join": ["--dir", {stage!r}, "--site", {site!r}],
         "run": ["--dir", {stage!r}, "--site", {site!r}, "--out", {run!r}, "--quiet"]}}
sys.exit(main(sys.argv[1:] + extra.get(sys.argv[1], [])))
"""


def _device(tmp_path: Path, call: int, src: Path, stage_dir: Path) -> tuple[int, Path, str]:
    """`device_command(call)` run by bash as the device runs it (in a folder holding only
    scripts/gpu_check.py, a shim onto this checkout's stand-in stages; `python3` on the path,
    no git), with $OUT an empty folder; returns (exit code, $OUT, output)."""
    root, out = tmp_path / f"device{call}", tmp_path / f"out{call}"
    (root / "scripts").mkdir(parents=True)
    out.mkdir()
    (root / "scripts" / "gpu_check.py").write_text(SHIM.format(
        root=str(ROOT), src=str(src), stage=str(stage_dir),
        site=str(tmp_path / "site"), run=str(tmp_path / "run")))
    (tmp_path / "bin").mkdir(exist_ok=True)
    python3 = tmp_path / "bin" / "python3"  # the device's python3 is its torch's
    python3.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python3.chmod(0o755)
    env = {**os.environ, "OUT": str(out), "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    done = subprocess.run(["bash", "-c", check_report.device_command(call)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, out, done.stdout + done.stderr


def test_the_device_commands_against_a_fake_out(tmp_path):
    stage_dir, _ = _stage_call2_only(tmp_path)
    src = _engine_json(tmp_path / "measured.json")
    for call in (1, 2):
        if call == 1:  # call 1 carries call1/ alone; call 2 finds it on the warm machine
            (stage_dir / "call2").rename(tmp_path / "not-yet")
        else:
            (tmp_path / "not-yet").rename(stage_dir / "call2")
        code, out, log = _device(tmp_path, call, src, stage_dir)
        assert code == 0, log
        assert sorted(p.name for p in out.iterdir()) == ["outputs.tar.gz", "report.json",
                                                         "report.md"]
        assert check_report.out_problems(out) == [], log  # all of it comes back
        rep = json.loads((out / "report.json").read_text())
        ran = {r["stage"] for r in rep["stages"] if r["status"] == "done"}
        assert ran == {s.name for s in plan.stages(plan.GPU) if s.call == call}, log
        assert f"--deadline {plan.CALL_DEADLINES[call]}" in " ".join(rep["argv"])
        assert set(rep["goals"]) == {"engine-smollm2", "engine-llama2-7b"}
        assert "call 1's part" not in log and not rep["notes"]
    assert rep["goals"]["engine-smollm2"]["status"] == "not selected"  # call 1's stage
    assert rep["goals"]["engine-smollm2"]["goals"]["ar_ms"]["value"] == 2.0  # its JSON stays
    assert "joined and installed fake_smollm2" in log
    with tarfile.open(out / "outputs.tar.gz") as tar:
        assert {"logs/target.log", "engine-smollm2.json"} <= set(tar.getnames())
    problems = check_report.out_problems(_fake_out(tmp_path / "bad"))
    assert len(problems) == 3  # nine files, a bad name, a folder too deep


def _fake_out(out: Path) -> Path:
    (out / "a" / "b" / "c").mkdir(parents=True)
    for i in range(7):
        (out / f"f{i}").write_text("x")
    (out / "bad name").write_text("x")
    (out / "a" / "b" / "c" / "deep").write_text("x")
    return out
