"""The GPU check in a simulated device layout, on this CPU: no git, no network, a carried wheel
that fails to install, a stage over its allowance, a call killed mid-stage and its resume, the
deadline's clock from the device command, SIGTERM; the engine check's JSON written as it is
measured, and the figures' captured/eager column."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_gpu_check import _wheel as make_wheel

from mcsd_runtime.gpu_check import check_report, engine_check, figures, lease, plan, staging
from mcsd_runtime.gpu_check.runner import Options, Runner, reap_stale

ROOT = Path(__file__).resolve().parents[1]


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def test_without_git_the_commit_comes_from_the_staged_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no git anywhere on the path
    assert staging.git_commit(tmp_path) is None
    stage_dir = tmp_path / "stage"
    assert staging.read_commit(stage_dir, tmp_path) is None
    (stage_dir / "call1").mkdir(parents=True)
    (stage_dir / "call1" / staging.COMMIT).write_text('{"commit": "abc1234", "dirty": true}')
    assert staging.read_commit(stage_dir, tmp_path) == "abc1234+dirty"
    monkeypatch.setattr(staging, "STAGE_DIR", stage_dir)
    monkeypatch.setattr(check_report, "read_commit",
                        lambda: staging.read_commit(stage_dir, tmp_path))
    meta = check_report.meta("gpu", plan.GPU, ["run"])
    assert meta["commit"] == "abc1234+dirty" and meta["torch"]


def test_the_stages_run_offline():
    env = __import__("mcsd_runtime.gpu_check", fromlist=["child_env"]).child_env(Path("/no"))
    assert env["HF_HUB_OFFLINE"] == "1" or os.environ.get("HF_HUB_OFFLINE")


def _wheel(folder: Path, name: str, version: str, broken: bool = False) -> Path:
    """A pure-Python wheel of one package (`test_gpu_check._wheel`), or a broken file named
    like one."""
    if broken:
        whl = folder / f"{name}-{version}-py3-none-any.whl"
        whl.write_bytes(b"not a zip")
        return whl
    return make_wheel(folder, f"{name}=={version}", {f"{name}/__init__.py": b"__version__ = '1'\n"})


def test_a_wheel_that_fails_to_install_skips_only_the_stages_that_need_it(tmp_path):
    site = tmp_path / "site"
    wheels = [_wheel(tmp_path, "goodpkg", "1.0"), _wheel(tmp_path, "badpkg", "1.0", broken=True)]
    failed = staging.install(wheels, site)
    assert failed == [wheels[1].name] and (site / "goodpkg" / "__init__.py").is_file()
    run = tmp_path / "run"
    preflight = ("import json, sys; json.dump({'unimportable': ['badpkg']}, "
                 "open(sys.argv[1], 'w'))")
    stages = [plan.Stage("preflight", 30, (), "", lambda r: [*_py(preflight),
                                                             str(r / "preflight.json")],
                         always=True),
              plan.Stage("uses-bad", 30, ("preflight",), "", lambda r: _py("print(1)"),
                         packages=("badpkg",)),
              plan.Stage("uses-good", 30, ("preflight",), "", lambda r: _py("print(1)"),
                         packages=("goodpkg",))]
    got = {r["stage"]: r for r in Runner(stages, Options(run=run, quiet=True),
                                         lambda r: None).run()}
    assert got["uses-bad"]["status"] == "skipped" and "badpkg" in got["uses-bad"]["reason"]
    assert got["uses-good"]["status"] == "done"
    again = {r["stage"]: r for r in Runner(stages, Options(run=run, quiet=True),
                                           lambda r: None).run()}
    assert not again["preflight"].get("resumed") and again["uses-good"]["resumed"]


def test_the_deadline_counts_from_the_device_commands_start(tmp_path):
    stages = [plan.Stage("a", 30, (), "", lambda r: _py("print(1)"))]
    late = Options(run=tmp_path, deadline_s=60, quiet=True, start=time.time() - 55)
    assert Runner(stages, late, lambda r: None).run()[0]["status"] == "not run"
    fresh = Options(run=tmp_path / "b", deadline_s=60, quiet=True, start=time.time())
    assert Runner(stages, fresh, lambda r: None).run()[0]["status"] == "done"


RUNNER = """
import sys, pathlib
from mcsd_runtime.gpu_check import check_report, plan
from mcsd_runtime.gpu_check.runner import Options, Runner
run, flag = pathlib.Path(sys.argv[1]), sys.argv[2]
code = ("import pathlib, time, sys\\n"
        "while not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.1)")
stages = [plan.Stage("slow", 600, (), "", lambda r: [sys.executable, "-c", code, flag])]
write = check_report.Writer(run, {"preset": "test", "started": "now"}, None)
write(Runner(stages, Options(run=run, quiet=True), write).run())
"""


def _start_runner(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    run, flag = tmp_path / "run", tmp_path / "flag"
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(run), str(flag)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    pid_file = run / "stages" / "slow.pid"
    for _ in range(300):
        if pid_file.is_file() and json.loads(pid_file.read_text() or "{}").get("pid"):
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("the stage did not start")
    return proc, run, flag


def test_a_call_killed_mid_stage_leaves_a_stage_the_resume_ends(tmp_path):
    proc, run, flag = _start_runner(tmp_path)
    stage_pid = json.loads((run / "stages" / "slow.pid").read_text())["pid"]
    proc.kill()  # the call is killed: the runner goes, its stage stays
    proc.wait(timeout=10)
    assert _alive(stage_pid)
    ended = reap_stale(run / "stages", say=lambda *a, **k: None)
    assert ended == ["slow"] and not (run / "stages" / "slow.pid").exists()
    for _ in range(50):
        if not _alive(stage_pid):
            break
        time.sleep(0.1)
    assert not _alive(stage_pid)
    flag.touch()  # the resumed stage now finishes at once
    stages = [plan.Stage("slow", 30, (), "", lambda r: _py("print('again')"))]
    assert Runner(stages, Options(run=run, quiet=True), lambda r: None).run()[0]["status"] \
        == "done"


def test_sigterm_stops_the_stage_and_writes_the_report(tmp_path):
    proc, run, _ = _start_runner(tmp_path)
    stage_pid = json.loads((run / "stages" / "slow.pid").read_text())["pid"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    rep = json.loads((run / "report.json").read_text())
    assert rep["stages"][0]["status"] == "timeout" and "stopped" in rep["stages"][0]["reason"]
    time.sleep(0.5)
    assert not _alive(stage_pid)


def test_a_stage_over_its_allowance_is_stopped_as_a_group(tmp_path):
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(p.pid, flush=True); time.sleep(60)")
    stages = [plan.Stage("over", 1.0, (), "", lambda r: _py(code))]
    rec = Runner(stages, Options(run=tmp_path, quiet=True), lambda r: None).run()[0]
    assert rec["status"] == "timeout" and rec["wall_s"] < 10
    child = int((tmp_path / "logs" / "over.log").read_text().splitlines()[1])
    time.sleep(0.5)
    assert not _alive(child)  # the stage's own child went with it


def test_the_engine_json_is_rewritten_as_each_measurement_lands(tmp_path):
    path = tmp_path / "e.json"
    doc = engine_check.Doc(path, {"shape": "smollm2"})
    assert json.loads(path.read_text())["rows"] == []
    doc.append("rows", {"method": "ar", "graphs": "on", "step_ms": 2.0, "path": "captured"})
    doc.append("rows", {"method": "hf", "graphs": "off", "step_ms": 8.0, "path": "eager"})
    got = json.loads(path.read_text())
    assert [r["method"] for r in got["rows"]] == ["ar", "hf"]
    assert got["goals"]["ar_vs_hf"] == {"value": 4.0, "goal": ">= 3.0", "reached": True}
    assert got["goals"]["ar_ms"]["reached"] is True and got["goals"]["gpu_busy"]["value"] is None
    doc.put("bound", {"target_forward_ms": 0.5})
    assert json.loads(path.read_text())["goals"]["ar_over_bound"]["reached"] is False


def test_the_figures_say_which_path_each_row_ran(tmp_path):
    data = {"rows": [{"method": "ar", "graphs": "on", "step_ms": 2.0, "path": "captured"},
                     {"method": "ar", "graphs": "on", "step_ms": 9.0, "path": "fixed"},
                     {"method": "ar", "graphs": "off", "step_ms": 9.0, "path": "eager"}],
            "batch": [{"rows": 8, "layout": "padded", "graphs": "on", "step_ms": 3.0,
                       "path": "captured"}]}
    (tmp_path / "e.json").write_text(json.dumps(data))
    steps = figures.engine(tmp_path / "e.json")["ms_per_step"]
    assert steps == {"ar on (captured)": 2.0, "ar on (fixed)": 9.0, "ar off (eager)": 9.0,
                     "ar B=8 padded on (captured)": 3.0}
    (tmp_path / "b.json").write_text(json.dumps({"rows": [{**data["rows"][0], "error": None}]}))
    assert figures.breakdown(tmp_path / "b.json")["ms_per_step"] == {"ar on (captured)": 2.0}


def test_the_engine_check_writes_every_measurement_on_a_cpu(tmp_path):
    out = tmp_path / "engine.json"
    s = engine_check.Settings(shape="tiny", device="cpu", k_config="2,1", prompt_tokens=8,
                              tokens=4, repeats=1, batch_repeats=1, draft_layers=1, copy_mib=1,
                              exact=True, exact_tokens=4, eager_tokens=4,
                              eager_batch="1:padded,8:ragged")
    engine_check.measure(s, out, progress=lambda *a: None)
    got = json.loads(out.read_text())
    assert list(got["phases"]) == list(lease.PHASES)  # the bound, captured, exact, then eager
    rows = [(r["method"], r["graphs"]) for r in got["rows"]]
    assert rows == [("ar", "on"), ("static:1", "on"), ("hf", "off"), ("ar", "off"),
                    ("static:1", "off")]
    assert all(r.get("path") in ("fixed", "eager") and not r.get("error") for r in got["rows"])
    assert [(r["rows"], r["layout"], r["graphs"]) for r in got["batch"]] == [
        (1, "padded", "on"), (8, "padded", "on"), (8, "ragged", "on"),  # B=1 is one layout
        (1, "padded", "off"), (8, "ragged", "off")]  # the eager ones --eager-batch names
    assert got["decisions"]["mlp"]["median_us"] > 0 and "ar" in got["launches"]["on"]
    ragged = got["ragged_forward"]
    assert ragged["tokens"] == {"padded": 40, "ragged": 24} and ragged["max_logit_diff"] < 1e-3
    assert got["goals"]["ragged_over_padded"]["value"] == ragged["ratio"]
    assert got["exact"]["tokens"]["ar"]["equal"] and got["exact"]["tokens"]["static:1"]["equal"]
    assert all(v["argmax_equal"] for v in got["exact"]["logits"].values())
    assert got["replay"]["unchanged"] and got["replay"]["second_differs"]
    assert got["uploads"]["values_equal"] and "probe" in got and "wall_s" in got
    assert got["goals"]["fp32_captured_equals_eager"]["reached"] is True
    assert list(got["goals"]) == list(figures.GOALS)  # every goal, measured or not
    assert got["goals"]["gpu_busy"]["value"] is None  # a CPU has no busy share
    assert got["goals"]["ar_ms"]["reached"] is None and got["goals"]["ar_ms"]["value"] > 0
    assert got["versions"]["torch"] == torch.__version__ and got["startup_s"] > 0
    with pytest.raises(ValueError, match="ROWS:LAYOUT"):
        engine_check.batch_rows("8:diagonal")
