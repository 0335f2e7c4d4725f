"""The GPU check's report: `report.json` and `report.md` in the run folder (stage, command, wall
seconds, allowance, key figures, failures with their logs' tails, what the toolkit lacks), copied
with a tarball of the logs and the small outputs to `--copy-to` after every stage."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import platform
import shutil
import tarfile
from pathlib import Path

from mcsd_runtime.gpu_check import figures
from mcsd_runtime.gpu_check.figures import read_json
from mcsd_runtime.gpu_check.lease import TIMEOUT_SLACK_S
from mcsd_runtime.gpu_check.plan import CALL_DEADLINES, MISSING, START_ENV, Sizes
from mcsd_runtime.gpu_check.staging import CALL_LIMIT_MIB, ROOT, STAGE_DIR, read_commit

FORMAT = "mcsd-gpu-check"
# small outputs the tarball takes besides the logs (patterns under the run folder)
SMALL_OUTPUTS = ("preflight.json", "engine-*.json", "spike-*.json", "cost.json",
                 "stoppers/*/metrics.json",
                 "copy-draft/*.json", "eval-*/*.md", "eval-*/*.json", "eval-*/records.jsonl",
                 "eval-*/*/summary.*",
                 "collect/manifest.json", "stages/*.json")
TARBALL_LIMIT = 15 << 20  # bytes: a file $OUT returns is at most 16 MiB


def _versions() -> dict:
    """Versions from the installed packages' metadata (nothing imported: torch's import costs
    seconds the deadline counts) and the commit the staging recorded (no git needed)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "machine": platform.machine()}
    for name in ("torch", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    out["commit"] = read_commit()
    return out


def meta(preset: str, sizes: Sizes, argv: list[str]) -> dict:
    return {"format": FORMAT, "version": 1, "preset": preset,
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "argv": argv, **_versions(), "sizes": dataclasses.asdict(sizes)}


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "; ".join(f"{k} {_cell(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(map(_cell, value))
    return str(value)


def _goal_cell(g: dict) -> str:
    if g.get("value") is None:
        return "-"
    mark = {True: "reached", False: "NOT reached", None: "no goal here"}[g.get("reached")]
    return f"{_cell(g['value'])} ({mark})"


def goals_table(goals: dict) -> list[str]:
    """Every engine goal (rows) at each engine stage (columns, with the stage's status): its
    value so far and whether it is reached; `-` where not measured (yet)."""
    if not goals:
        return []
    names = list(goals)
    first = next(iter(goals.values()))["goals"]
    out = ["", "## Goals so far", "",
           "| goal | target | " + " | ".join(f"{n} ({goals[n]['status']})" for n in names) + " |",
           "|---|---|" + "---|" * len(names)]
    for key, g in first.items():
        cells = [_goal_cell(goals[n]["goals"][key]) for n in names]
        out.append(f"| {key} | {g['goal']} | " + " | ".join(cells) + " |")
    return out


def markdown(rep: dict) -> str:
    """The report as Markdown."""
    head = [f"# GPU check ({rep['preset']})", "",
            f"{rep.get('gpu') or rep.get('machine')}, torch {rep.get('torch')}, transformers "
            f"{rep.get('transformers')}, commit {rep.get('commit')}; started {rep['started']}, "
            f"{rep['total_wall_s']:.0f} s of stages.", "",
            *[f"**{note}**\n" for note in rep.get("notes", [])],
            "| stage | status | wall s | allowance s | key figures |", "|---|---|---|---|---|"]
    for r in rep["stages"]:
        why = f" ({r['reason']})" if r.get("reason") else ""
        again = " (earlier run)" if r.get("resumed") else ""
        wall = f"{r['wall_s']:.1f}" if "wall_s" in r else "-"
        head.append(f"| {r['stage']} | {r['status']}{why}{again} | {wall} | {r['allowance_s']:.0f} "
                    f"| {_cell(r.get('figures') or {}).replace('|', '/')} |")
    body = goals_table(rep.get("goals", {})) + ["", "## Commands", ""]
    body += [f"- {r['stage']}: `{r['command']}`" for r in rep["stages"] if r.get("command")]
    failed = [r for r in rep["stages"] if r["status"] in ("failed", "timeout")]
    if failed:
        body += ["", "## Failures", ""]
        for r in failed:
            body += [f"### {r['stage']}: {r['status']} (exit {r.get('rc')})", "", "```",
                     *r.get("log_tail", []), "```", ""]
    body += ["", "## Missing from the toolkit", "", *[f"- {m}" for m in rep["missing"]]]
    return "\n".join(head + body + _extras(rep)) + "\n"


def _extras(rep: dict) -> list[str]:
    """The breakdowns' tables and the evaluations' tables across categories, when present."""
    run, out = Path(rep["run"]), []
    for r in rep["stages"]:
        if r["status"] != "done":
            continue
        if r["stage"].startswith("breakdown-"):
            from mcsd_runtime.benchmarks.step_breakdown import summary

            data = read_json(run / r["output"])
            if data.get("rows"):
                out += ["", f"## {r['stage']} ({data.get('target')}, {data.get('draft')}, "
                        f"{data.get('device')}, {data.get('dtype')}: ms per step, median of "
                        f"{data.get('repeats')})", "", summary(data)]
        elif r["stage"].startswith("eval-"):
            table = run / r["output"] / "domains.md"
            if table.is_file():
                lines = table.read_text().splitlines()[1:80]
                out += ["", f"## {r['stage']}: across categories", *lines]
    return out


def staging_text(manifest: dict, base_mib: float, stage_dir: Path) -> str:
    """What `stage` staged and the two device calls that carry it."""
    rel = stage_dir.resolve().relative_to(ROOT) if stage_dir.resolve().is_relative_to(
        ROOT) else stage_dir
    lines = [f"staged {manifest['wheel']} ({manifest['size'] / 2**20:.1f} MiB) in two parts and "
             f"{len(manifest['wheels'])} wheel(s): {', '.join(manifest['wheels'])}",
             f"the project sends {base_mib:.1f} MiB a call; the limit is {CALL_LIMIT_MIB:.0f} MiB"]
    for i, mib in enumerate(manifest["call_mib"], 1):
        over = " OVER THE LIMIT" if mib + base_mib > CALL_LIMIT_MIB else ""
        lines.append(f"call {i}: carry [\"{rel}/call{i}\"], {mib:.1f} + {base_mib:.1f} MiB{over}")
    for call in (1, 2):
        lines.append(f"call {call} command: {device_command(call)}   "
                     f"(timeout_s {CALL_DEADLINES[call] + TIMEOUT_SLACK_S})")
    return "\n".join(lines)


def device_command(call: int, deadline: float | None = None) -> str:
    """The shell command of device call `call`: the deadline's clock starts first, `join`
    installs what the call carried (a wheel that fails is reported, and only the stages that
    need it are skipped), then the call's stages run until `deadline` (the call's own)."""
    deadline = CALL_DEADLINES[call] if deadline is None else deadline
    return (f"export {START_ENV}=$(date +%s.%N); python3 scripts/gpu_check.py join; "
            f"python3 scripts/gpu_check.py run --call {call} --deadline {deadline:g} "
            f"--copy-to \"$OUT\"")


def device_calls(stage_dir: Path = STAGE_DIR) -> list[str]:
    """The two device calls as `run(...)` lines to paste: command, carry and timeout."""
    rel = stage_dir.relative_to(ROOT) if stage_dir.is_relative_to(ROOT) else stage_dir
    return [f"call {call}: run(command={device_command(call)!r}, carry=[\"{rel}/call{call}\"], "
            f"timeout_s={CALL_DEADLINES[call] + TIMEOUT_SLACK_S})" for call in (1, 2)]


class Writer:
    """Writes the report after every stage (a callable taking the records so far); `goal_files`
    names the JSON of each stage whose output carries the engine check's `goals`."""

    def __init__(self, run: Path, meta_: dict, copy_to: Path | None,
                 goal_files: dict[str, Path] | None = None) -> None:
        self.run, self.meta, self.copy_to = run, meta_, copy_to
        self.goal_files = goal_files or {}

    def goals(self, records: list[dict]) -> dict:
        """{stage: {"status", "goals"}}: every goal of each engine stage, whatever it left."""
        status = {r["stage"]: r["status"] for r in records}
        return {name: {"status": status.get(name, "not run"), "goals": figures.goals(path)}
                for name, path in self.goal_files.items()}

    def __call__(self, records: list[dict]) -> Path:
        rep = {**self.meta, "gpu": _gpu(self.run, records, self.goal_files),
               "run": str(self.run), "stages": records,
               "total_wall_s": round(sum(r.get("wall_s", 0.0) for r in records
                                         if not r.get("resumed")), 1),
               "failures": [r["stage"] for r in records
                            if r["status"] in ("failed", "timeout")],
               "goals": self.goals(records), "missing": list(MISSING)}
        path = self.run / "report.json"
        path.write_text(json.dumps(rep, indent=1, default=str) + "\n")
        path.with_suffix(".md").write_text(markdown(rep))
        if self.copy_to is not None:
            self.copy_to.mkdir(parents=True, exist_ok=True)
            for p in (path, path.with_suffix(".md")):
                shutil.copy2(p, self.copy_to / p.name)
            (self.copy_to / "outputs.tar.gz").write_bytes(tarball(self.run))
        return path


def _gpu(run: Path, records: list[dict], goal_files: dict[str, Path]) -> str | None:
    """The device's name: the preflight's, else an engine check's."""
    for r in records:
        if r["stage"] == "preflight" and r.get("figures", {}).get("device"):
            return r["figures"]["device"]
    return next((read_json(p)["gpu"] for p in goal_files.values() if read_json(p).get("gpu")),
                None)


RETURNED = {"files": 8, "file_mib": 16, "total_mib": 64, "depth": 2}  # what $OUT gives back


def out_problems(out: Path) -> list[str]:
    """What in `out` the device would not give back (`RETURNED`: at most 8 files of at most
    16 MiB, 64 MiB in all, 2 folders deep, names of letters, digits, '.', '_', '-')."""
    import re

    files = [p for p in out.rglob("*") if p.is_file()]
    problems = [f"{len(files)} files (at most {RETURNED['files']})"] \
        if len(files) > RETURNED["files"] else []
    for p in files:
        rel = p.relative_to(out)
        if p.stat().st_size > RETURNED["file_mib"] << 20:
            problems.append(f"{rel}: over {RETURNED['file_mib']} MiB")
        if len(rel.parts) > RETURNED["depth"] + 1:
            problems.append(f"{rel}: deeper than {RETURNED['depth']} folders")
        if not all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in rel.parts):
            problems.append(f"{rel}: a name the device does not return")
    if sum(p.stat().st_size for p in files) > RETURNED["total_mib"] << 20:
        problems.append(f"over {RETURNED['total_mib']} MiB in all")
    return problems


def tarball(run: Path, limit: int = TARBALL_LIMIT) -> bytes:
    """The logs and `SMALL_OUTPUTS` of `run` as a .tar.gz, files added while it stays under
    `limit` bytes (logs last, largest skipped first)."""
    files = [p for pat in SMALL_OUTPUTS for p in sorted(run.glob(pat)) if p.is_file()]
    files += sorted((run / "logs").glob("*.log"))
    buf, total = io.BytesIO(), 0
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in dict.fromkeys(files):
            size = p.stat().st_size
            if total + size > limit:
                continue
            tar.add(p, arcname=str(p.relative_to(run)))
            total += size
    return buf.getvalue()
