"""Running the GPU check's stages: one process per stage, each with its time allowance, each
writing its output and, when it finishes, a done-marker; a rerun skips the finished stages; a
stage that fails or runs out of time is recorded and the next one runs. The report (one JSON,
one Markdown) is rewritten after every stage, so a check cut off still leaves one.

The deadline counts from `Options.start` (the device command sets `plan.START_ENV` first, so
`join` and the imports count too). Each stage runs in a process group of its own within the
call's session (so the device ends it with the call) and is stopped as a group; while it runs,
`stages/NAME.pid` names it, so a stage left running by a call killed mid-stage is ended at the
next `run` before anything else starts (its locks are then a dead process's, which `collect`
takes over). SIGTERM stops the running stage and writes the report."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mcsd_runtime.gpu_check.figures import read_json
from mcsd_runtime.gpu_check.plan import Stage
from mcsd_runtime.gpu_check.staging import ROOT

REPORT_RESERVE_S = 10.0  # seconds kept for the report when a deadline is set
MIN_STAGE_S = 5.0  # a stage is not started with less time left than this
TAIL_LINES = 20  # log lines a failure's record keeps


@dataclass
class Options:
    run: Path  # the run folder
    deadline_s: float | None = None  # seconds from the start for everything, report included
    allowance_scale: float = 1.0
    only: set[str] = field(default_factory=set)
    skip: set[str] = field(default_factory=set)
    force: set[str] = field(default_factory=set)  # stages rerun even if done ("all": every)
    env: dict[str, str] = field(default_factory=dict)  # added to the stages' environment
    quiet: bool = False  # print stage headers and results only, not the stages' output
    calls: set[int] = field(default_factory=set)  # the device calls whose stages run (empty: all)
    start: float | None = None  # epoch seconds of the deadline's zero (None: now)
    absent: dict[str, str] = field(default_factory=dict)  # package -> why it is not here


class Stopped(Exception):
    """The check got SIGTERM: the running stage is stopped and the report written."""


def _on_sigterm(signum, frame) -> None:
    raise Stopped(f"signal {signum}")


def _alive_group(pid: int, pgid: int) -> bool:
    try:
        return os.getpgid(pid) == pgid
    except (ProcessLookupError, PermissionError):
        return False


def reap_stale(stages_dir: Path, say=print) -> list[str]:
    """End the process groups of stages a killed call left running (`NAME.pid`); returns the
    stages ended."""
    ended = []
    for path in sorted(stages_dir.glob("*.pid")):
        info = read_json(path)
        pid, pgid = info.get("pid"), info.get("pgid")
        if isinstance(pid, int) and isinstance(pgid, int) and _alive_group(pid, pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
                ended.append(path.stem)
                say(f"== {path.stem}: ended the process group {pgid} an earlier call left "
                    f"running", flush=True)
            except ProcessLookupError:
                pass
        path.unlink(missing_ok=True)
    return ended


def _tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [x for x in text.replace("\r", "\n").splitlines() if x.strip()][-lines:]


def _pump(stream, log, prefix: str, quiet: bool) -> None:
    """Copy a child's output to its log and, unless quiet, to stdout line by line."""
    for raw in iter(stream.readline, b""):
        log.write(raw)
        log.flush()
        if not quiet:
            for line in raw.decode(errors="replace").replace("\r", "\n").splitlines():
                if line.strip():
                    print(f"{prefix}{line}", flush=True)


def execute(argv: list[str], log_path: Path, timeout: float, env: dict[str, str],
            prefix: str = "  | ", quiet: bool = False,
            pid_file: Path | None = None) -> tuple[int | None, float]:
    """Run `argv` from the repository in a process group of its own (in this session), its
    output into `log_path`; stopped (the whole group) after `timeout` seconds, or when this
    process is interrupted. `pid_file` names the group while it runs. Returns (exit code or
    None when stopped, seconds)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log_path.open("wb") as log:
        log.write(f"$ {shlex.join(argv)}\n".encode())
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **env},
                                cwd=ROOT, process_group=0)
        pump = threading.Thread(target=_pump, args=(proc.stdout, log, prefix, quiet),
                                daemon=True)
        try:  # from here on, a SIGTERM (`Stopped`) anywhere stops the group
            if pid_file is not None:
                pid_file.write_text(_dumps({"pid": proc.pid, "pgid": proc.pid, "argv": argv}))
            pump.start()
            code = proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            code = None
        except BaseException:
            _stop_group(proc)
            raise
        finally:
            if pid_file is not None:
                pid_file.unlink(missing_ok=True)
        if pump.is_alive():
            pump.join(timeout=10)
    return code, time.monotonic() - t0


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the stage's process group, SIGKILL after 3 s."""
    for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class Runner:
    """Runs `stages` into `opts.run`, calling `report(records)` after each stage."""

    def __init__(self, stages: list[Stage], opts: Options, report) -> None:
        self.stages, self.opts, self.report = stages, opts, report
        self.records: list[dict] = []
        self.t0 = opts.start if opts.start is not None else time.time()

    def left(self) -> float:
        """Seconds left before the deadline, less the report's reserve (inf without one)."""
        if self.opts.deadline_s is None:
            return float("inf")
        return self.opts.deadline_s - REPORT_RESERVE_S - (time.time() - self.t0)

    def run(self) -> list[dict]:
        """Every stage in order (ending first any stage an earlier call left running); on
        SIGTERM the running stage is stopped, recorded, and the report written."""
        (self.opts.run / "stages").mkdir(parents=True, exist_ok=True)
        reap_stale(self.opts.run / "stages")
        before = signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            for stage in self.stages:
                try:
                    record = self._one(stage)
                except Stopped as err:
                    self._keep({"stage": stage.name, "allowance_s": stage.allowance_s,
                                "status": "timeout", "reason": f"the check was stopped ({err})",
                                "figures": self._figures(stage)})
                    break
                self._keep(record)
        finally:
            signal.signal(signal.SIGTERM, before)
        return self.records

    def _keep(self, record: dict) -> None:
        self.records.append(record)
        if record.get("status") in ("done", "failed", "timeout"):
            marker = self.opts.run / "stages" / f"{record['stage']}.json"
            marker.write_text(_dumps(record))
        self._say(record)
        self.report(self.records)

    def unimportable(self) -> set[str]:
        """Packages the preflight of this run could not import."""
        return set(read_json(self.opts.run / "preflight.json").get("unimportable", []))

    def _held(self, stage: Stage, command: str | None) -> dict | None:
        """The record of a stage done earlier (resumed) or not chosen for this run, else None.
        A stage that runs at every call (`Stage.always`) is never resumed, is chosen whenever
        its call is, and does not make those after it rerun."""
        opts = self.opts
        if opts.calls and stage.call and stage.call not in opts.calls:
            return {"status": "not selected", "reason": f"call {stage.call}"}
        if stage.always:
            return None
        earlier = read_json(opts.run / "stages" / f"{stage.name}.json")
        always = {s.name for s in self.stages if s.always}
        rerun = any(r["stage"] in stage.needs and r["stage"] not in always
                    and r["status"] == "done" and not r.get("resumed") for r in self.records)
        if (earlier.get("status") == "done" and earlier.get("command") == command
                and not rerun and not opts.force & {stage.name, "all"}):
            return {**earlier, "resumed": True}
        if (opts.only and stage.name not in opts.only) or stage.name in opts.skip:
            return {"status": "not selected"}
        return None

    def _status(self, stage: Stage, command: str | None) -> dict | None:
        """The record of a stage that does not run now, or None when it should run: one done
        earlier with the same command is not run again, unless a stage it needs ran again."""
        held = self._held(stage, command)
        if held is not None:
            return held
        states = {r["stage"]: r["status"] for r in self.records}
        missing = [n for n in stage.needs if states.get(n) != "done"]
        if missing:
            return {"status": "skipped", "reason": f"needs {', '.join(missing)}"}
        known = sorted(set(stage.packages) & set(self.opts.absent))
        if known:
            return {"status": "skipped", "reason": "; ".join(
                f"needs {n}: {self.opts.absent[n]}" for n in known)}
        absent = sorted(set(stage.packages) & self.unimportable())
        if absent:
            return {"status": "skipped", "reason": f"needs {', '.join(absent)} (not importable)"}
        if self.left() < MIN_STAGE_S:
            return {"status": "not run", "reason": "out of time"}
        return None

    def _one(self, stage: Stage) -> dict:
        scaled = round(stage.allowance_s * self.opts.allowance_scale, 1)
        base = {"stage": stage.name, "allowance_s": scaled}
        try:
            argv, problem = stage.argv(self.opts.run), None
        except Exception as err:  # noqa: BLE001 - a stage that cannot be planned fails alone
            argv, problem = None, f"planning: {type(err).__name__}: {err}"
        held = self._status(stage, shlex.join(argv) if argv else None)
        if held is not None:
            return {**held, **base}
        if problem:
            return {**base, "status": "failed", "reason": problem, "wall_s": 0.0}
        timeout = min(base["allowance_s"], self.left())
        log = self.opts.run / "logs" / f"{stage.name}.log"
        print(f"== {stage.name}: allowance {base['allowance_s']:.0f} s (stopped after "
              f"{timeout:.0f} s)\n   {shlex.join(argv)}", flush=True)
        code, wall = execute(argv, log, timeout, self.opts.env, f"  {stage.name} | ",
                             self.opts.quiet, self.opts.run / "stages" / f"{stage.name}.pid")
        record = {**base, "command": shlex.join(argv), "wall_s": round(wall, 1), "rc": code,
                  "log": str(log.relative_to(self.opts.run)), "output": stage.output,
                  "status": "done" if code == 0 else "timeout" if code is None else "failed"}
        record["figures"] = self._figures(stage)  # whatever it left, finished or stopped
        if code != 0:
            record["log_tail"] = _tail(log)
        return record

    def _figures(self, stage: Stage) -> dict:
        """The stage's key figures from what it left in the run folder."""
        try:
            return stage.figures(self.opts.run)
        except Exception as err:  # noqa: BLE001 - figures are a report's extra
            return {"error": f"{type(err).__name__}: {err}"}

    def _say(self, r: dict) -> None:
        wall = f" in {r['wall_s']:.1f} s" if "wall_s" in r and not r.get("resumed") else ""
        why = f" ({r['reason']})" if r.get("reason") else ""
        again = " (done earlier)" if r.get("resumed") else ""
        figures = f" {_dumps(r['figures'], None)}" if r.get("figures") and not again else ""
        figures = figures if len(figures) < 2000 else f"{figures[:2000]}..."
        print(f"== {r['stage']}: {r['status']}{wall}{again}{why}{figures}", flush=True)
        if r["status"] in ("failed", "timeout") and self.opts.quiet:
            for line in r.get("log_tail", [])[-8:]:
                print(f"  {r['stage']} | {line}", file=sys.stderr, flush=True)


def _dumps(value, indent: int | None = 1) -> str:
    import json

    return json.dumps(value, indent=indent, default=str) + ("\n" if indent else "")
