"""The GPU check's stages: what each one runs, its time allowance, the stages it needs, where it
writes, and the figures the report takes from its output.

Every command line of the check is built in this module, by the functions under "Command
lines": an option the CLIs rename is renamed there and nowhere else (tests/test_gpu_check.py
parses each planned command with the `mcsd` parser, so a rename the plan missed fails a test).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mcsd_runtime.gpu_check import figures as fig
from mcsd_runtime.gpu_check import lease
from mcsd_runtime.gpu_check.figures import read_json

# ---------------------------------------------------------------------------------------------
# Sizes


@dataclass(frozen=True)
class Sizes:
    """What the check runs at: the real pair on a GPU (`GPU`) or the toy pair on a CPU in a few
    minutes (`SMOKE`); `--set FIELD=VALUE` overrides a field."""

    target: str
    recipe: str  # the distillation recipe of the draft (`--draft distill:RECIPE`)
    device: str
    k_config: str  # the tree collected, profiled, trained and evaluated on
    collect_prompts: str
    collect_limit: int
    tokens: int  # new tokens per prompt, everywhere
    processes: int  # collection processes sharing the device
    batch: int  # collection rows per forward
    profile_max_tokens: int
    profile_rounds: int
    profile_prompts: str
    profile_limit: int
    check_prompts: int  # end-to-end checks of the trained decisions
    mlp_epochs: int  # 0: the trainer's default
    copy_prompts: str  # what the copy-or-draft choice trains on
    copy_limit: int
    copy_eval_limit: int
    eval_prompts: str
    eval_limit: int  # prompts per category
    temperatures: str  # comma-separated
    statics: str  # the static depths evaluated
    deploy: str  # the static schedule a user deploys (prompt lookup beside the draft)
    shapes: str  # the engine's shapes (`engine_check`), comma-separated
    exact_shape: str  # the shape also checked in fp32, captured against eager
    distill_conversations: int  # the draft's recipe, sized for the device (0: the recipe's)
    distill_steps: int  # (0: the recipe's)
    breakdown_draft_layers: int  # for shapes without a draft shape of their own
    breakdown_k_config: str
    breakdown_prompt_tokens: int
    breakdown_tokens: int
    breakdown_repeats: int
    breakdown_eager_repeats: int  # runs of the eager AR and static:1 rows
    breakdown_eager_tokens: int  # their new tokens
    breakdown_eager_batch: str  # the eager batch rows, ROWS:LAYOUT,... ("": none)
    breakdown_copy_mib: int
    allowances: dict = field(default_factory=dict)  # stage -> seconds

    def with_overrides(self, pairs: list[str]) -> Sizes:
        """A copy with `FIELD=VALUE` overrides (allowances as `allowance.STAGE=SECONDS`)."""
        changes, allowances = {}, dict(self.allowances)
        fields = {f.name: f for f in dataclasses.fields(self)}
        for pair in pairs:
            key, eq, value = pair.partition("=")
            key = key.strip().replace("-", "_")
            if key.startswith("allowance."):
                allowances[key.removeprefix("allowance.")] = float(value)
            elif not eq or key not in fields or key == "allowances":
                raise ValueError(f"--set takes FIELD=VALUE with FIELD one of "
                                 f"{', '.join(k for k in fields if k != 'allowances')} or "
                                 f"allowance.STAGE, got {pair!r}")
            else:
                kind = type(getattr(self, key))
                changes[key] = kind(value) if kind is not str else value
        return dataclasses.replace(self, allowances=allowances, **changes)


# Call 2's seconds per stage on a lent H100/H200, from the H200 figures measured so far
# (docs/results-gpu.md, issue 52) times 1.5; call 1's (the engine stages) follow from
# `lease.engine_estimate` (`gpu_allowances`), which prices each of the stage's phases the same way
# and counts the ragged rows. Each call's deadline is its allowances, its reserve (`join`, the
# report) and 10 s of room; with the machine's start and the 30 s between the calls both fit
# 15 minutes with a minute to spare (`lease`, tests/test_gpu_check_lease.py).
# - engine-smollm2 (the first stage of call 1, 20 s more for a cold start) and engine-llama2-7b:
#   56 and 70 s by the estimate, of which the eager rows AR 22.4 / 25 ms, static:1 29.3 / 34 ms,
#   hf 22.4 / 25.7 ms a token take 14-17 s (hf 3 runs of 64 tokens, AR and static:1 a run of
#   32 tokens, plain and timed) and the captured ones, priced at their goals and counting B=8
#   padded and ragged, 13-25 s; the eager batch rows (B=1, and B=8 at 82-92 ms a step in both
#   layouts: 36-40 s more) are left out. 1.5x: 85 + 20 and 105.
# - preflight (call 2's first stage): the imports call 1 did not warm (lightning, sklearn,
#   datasets, ...) and the device's start, written as they land: 25.
# - target: the GGUF's conversion took 23 s on an H200, plus a cold import: 30 x 1.5 = 45.
# - distill: the default recipe generated 576 conversations in 72 s (0.125 s each) and trained
#   360 steps in 14 s; the device's recipe (features, 320 + 64 held-out conversations, 360
#   steps) is 48 + 14 + 8 s of loading = 70 x 1.5 = 105.
# - collect: the goal rate (1,000 tokens/s) over 128 x 64 tokens is 8 s, plus four processes'
#   start (~20 s): 30 x 1.5 = 45. profile: 2 calibration prompts, ~23 s x 1.5 = 35.
# - train-*: the CPU smoke's 28-41 s on 2 cores at toy sizes; with the device's 16 cores
#   (`--threads` its cores) on more rows: 20, 25, 30.
# - eval-*: 1 prompt per category x 6 x ~10 methods x 64 tokens; at the captured goal (5 ms a
#   step) 20 s, plus loading: 30 x 1.5 = 45; at T=0.7 fewer methods: 35. Each record is written
#   as it is decoded (`eval_stage`), so a stopped evaluation keeps what it measured.
# eval-static and the spikes (torch.compile: tens of seconds a shape) come after everything
# else, each with its own hard limit, and run only if time is left.
PIPELINE_ALLOWANCES = {"preflight": 25, "target": 45, "distill": 105, "collect": 45, "profile": 35,
                    "train-lightgbm": 20, "train-mlp": 25, "train-copy": 30, "eval-t0": 45,
                    "eval-t0.7": 35, "eval-static": 60, "spike-smollm2": 60,
                    "spike-llama2-7b": 90}
START_ENV = "MCSD_CHECK_START"  # epoch seconds the device command started: the deadline's zero
LATE = ("eval-static", "spike-")  # stages after everything else: run if time is left


def engine_run(s: Sizes, shape: str) -> lease.EngineRun:
    """What `engine_cmd` runs at `shape`, in the estimate's terms."""
    return lease.EngineRun(
        tokens=s.breakdown_tokens, repeats=s.breakdown_repeats,
        eager_repeats=s.breakdown_eager_repeats, eager_tokens=s.breakdown_eager_tokens,
        eager_batch=tuple(int(x.split(":")[0]) for x in s.breakdown_eager_batch.split(",") if x),
        exact=shape == s.exact_shape)


def gpu_allowances(s: Sizes) -> dict[str, float]:
    """Every stage's allowance at `s`: the engine stages' from their estimate, the others'
    `PIPELINE_ALLOWANCES`."""
    shapes = [x for x in s.shapes.split(",") if x]
    return {**{f"engine-{x}": lease.engine_allowance(lease.SHAPES[x], engine_run(s, x), i == 0)
               for i, x in enumerate(shapes)}, **PIPELINE_ALLOWANCES}


def call_deadlines(s: Sizes) -> dict[int, int]:
    """Each device call's deadline: its stages' allowances (the late ones run in what is left),
    its reserve and room (`lease.call_deadline`)."""
    calls = {1: [b for n, b in s.allowances.items() if n.startswith("engine-")],
             2: [b for n, b in s.allowances.items()
                 if not n.startswith(("engine-", *LATE))]}
    return {call: lease.call_deadline(b, call) for call, b in calls.items()}


_GPU = Sizes(
    target="smollm2", recipe="features", device="cuda", k_config="4,1/1,1,1,1,1",
    collect_prompts="inst-mix", collect_limit=128, tokens=64, processes=4, batch=8,
    profile_max_tokens=16, profile_rounds=3, profile_prompts="inst-mix", profile_limit=2,
    check_prompts=2, mlp_epochs=0, copy_prompts="inst-explain,inst-docstring-code,inst-qa",
    copy_limit=24, copy_eval_limit=2, eval_prompts="inst-mix-eval", eval_limit=1,
    temperatures="0,0.7", statics="static:1,static:2,static:3,static:4",
    deploy="lookup:8:3+static:1", shapes="smollm2,llama2-7b", exact_shape="smollm2",
    distill_conversations=320, distill_steps=360, breakdown_draft_layers=4,
    breakdown_k_config="4,2,2,1", breakdown_prompt_tokens=256, breakdown_tokens=64,
    breakdown_repeats=3, breakdown_eager_repeats=1, breakdown_eager_tokens=32,
    breakdown_eager_batch="", breakdown_copy_mib=1024)
GPU = dataclasses.replace(_GPU, allowances=gpu_allowances(_GPU))
GPU_ALLOWANCES = GPU.allowances
CALL_DEADLINES = call_deadlines(GPU)  # seconds, `run --call N --deadline ...` on the device

# the toy pair on this CPU: every stage at toy sizes, a few minutes in all
SMOKE = Sizes(
    target="toy:tiny", recipe="tiny", device="cpu", k_config="2,1/1,1",
    collect_prompts="inst-mix", collect_limit=4, tokens=8, processes=2, batch=2,
    profile_max_tokens=8, profile_rounds=1, profile_prompts="inst-mix", profile_limit=1,
    check_prompts=1, mlp_epochs=2, copy_prompts="inst-qa", copy_limit=2, copy_eval_limit=1,
    eval_prompts="inst-mix-eval", eval_limit=1, temperatures="0,0.7",
    statics="static:1,static:3", deploy="lookup:8:3+static:1", shapes="tiny",
    exact_shape="tiny", distill_conversations=6, distill_steps=10, breakdown_draft_layers=1,
    breakdown_k_config="2,1", breakdown_prompt_tokens=16, breakdown_tokens=8,
    breakdown_repeats=1, breakdown_eager_repeats=1, breakdown_eager_tokens=8,
    breakdown_eager_batch="1:padded,8:padded,8:ragged", breakdown_copy_mib=8,
    allowances={"preflight": 60, "engine-tiny": 120, "target": 120, "distill": 120, "collect": 180})
SMOKE_ALLOWANCE = 120  # seconds, a smoke stage without an allowance of its own
SMOKE_DEADLINES = {1: 200, 2: 1200}


# ---------------------------------------------------------------------------------------------
# Command lines: the only place the check names a command or an option

PY = [sys.executable]
MCSD = [*PY, "-m", "mcsd_runtime"]
EOS_IGNORE = ["--eos", "ignore"]  # every output runs to its full length
THREADS = ["--threads", "1"]  # a GPU stage's host work: one thread (collect: one a process)
RECORDS = "records.jsonl"  # in an evaluation's folder: each record as it is decoded


def cores() -> int:
    """CPU cores this process may use (the device's 16 where the check runs)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def train_threads() -> list[str]:
    """Training's threads: every core of the machine it runs on."""
    return ["--threads", str(cores())]


def draft_path(run: Path) -> Path:
    """The draft the check distils (`distill_cmd`) and every later stage decodes with."""
    return run / "draft" / "draft"


def pair_args(s: Sizes, run: Path) -> list[str]:
    return ["--target", s.target, "--draft", str(draft_path(run)), "--device", s.device]


def target_cmd(s: Sizes) -> list[str]:
    """Make the target loadable once: the toy pair's build, or a named model's GGUF file
    converted into the cache (a stage of its own, so its minute is not charged elsewhere)."""
    if s.target.startswith("toy"):
        preset = s.target.partition(":")[2] or "default"
        return [*MCSD, "toy", "build", "--recipe", preset]
    code = ("import sys; from mcsd_runtime.backend.named import is_named, resolve_named; "
            "print(resolve_named(sys.argv[1]) if is_named(sys.argv[1]) else sys.argv[1])")
    return [*PY, "-c", code, s.target]


def engine_cmd(s: Sizes, shape: str, out: Path) -> list[str]:
    """The engine's measurements at one shape (`gpu_check.engine_check`), fp32 too at
    `exact_shape`."""
    exact = ["--exact"] if shape == s.exact_shape else []
    return [*PY, "-m", "mcsd_runtime.gpu_check.engine_check", "--shape", shape,
            "--device", s.device, "--draft-layers", str(s.breakdown_draft_layers),
            "--k-config", s.breakdown_k_config, "--prompt-tokens", str(s.breakdown_prompt_tokens),
            "--tokens", str(s.breakdown_tokens), "--repeats", str(s.breakdown_repeats),
            "--eager-repeats", str(s.breakdown_eager_repeats),
            "--eager-tokens", str(s.breakdown_eager_tokens),
            *(["--eager-batch", s.breakdown_eager_batch] if s.breakdown_eager_batch else []),
            "--copy-mib", str(s.breakdown_copy_mib), *exact, "--out", str(out)]


def preflight_cmd(out: Path, found: tuple[str, ...] = ()) -> list[str]:
    """The preflight; `found`: carried packages it finds without importing them."""
    return [*PY, "-m", "mcsd_runtime.gpu_check.preflight", "--out", str(out), "--found",
            ",".join(found)]


def spike_cmd(s: Sizes, shape: str, out: Path) -> list[str]:
    """One target forward eager, fixed-shape (captured) and compiled, at 1 and 8 rows."""
    return [*PY, "-m", "mcsd_runtime.benchmarks.capture_spike", "--shape", shape,
            "--device", s.device, "--context", str(s.breakdown_prompt_tokens),
            "--out", str(out)]


def distill_cmd(s: Sizes, run: Path) -> list[str]:
    """The draft, distilled into the run folder (`draft_path`) by `recipe` sized for the
    device: its fields differ from the preset's, and so does its hash (its data are cached as
    the preset's, so a stopped run continues the generation)."""
    sized = [*(["--conversations", str(s.distill_conversations)]
               if s.distill_conversations else []),
             *(["--steps", str(s.distill_steps)] if s.distill_steps else [])]
    return [*MCSD, "draft", "distill", "--target", s.target, "--recipe", s.recipe, *sized,
            "--device", s.device, "--out", str(draft_path(run).parent)]


def collect_cmd(s: Sizes, out: Path) -> list[str]:
    procs = ["--processes-per-device", str(s.processes)] if s.processes > 1 else []
    return [*MCSD, "collect", *pair_args(s, out.parent), "--k-config", s.k_config, "--dense",
            "--max-new-tokens", str(s.tokens), "--prompts", s.collect_prompts,
            "--limit", str(s.collect_limit), *procs, "--batch-size", str(s.batch), *THREADS,
            "--no-progress", "--out", str(out)]


def profile_cmd(s: Sizes, out: Path) -> list[str]:
    return [*MCSD, "profile", *pair_args(s, out.parent), "--out", str(out),
            "--max-tokens", str(s.profile_max_tokens), "--rounds", str(s.profile_rounds),
            "--k-config", s.k_config, "--prompts", s.profile_prompts,
            "--limit", str(s.profile_limit), "--max-new-tokens", str(min(s.tokens, 48)), *THREADS]


def train_stop_cmd(s: Sizes, model: str, runs: Path, profile: Path, out: Path) -> list[str]:
    epochs = ["--max-epochs", str(s.mlp_epochs)] if s.mlp_epochs and model == "mlp" else []
    return [*MCSD, "train", "--decision", "stop", "--runs", str(runs), "--model", model,
            "--cost-profile", str(profile), "--val-frac", "0.3",
            "--check-prompts", str(s.check_prompts), *epochs, *train_threads(), "--force",
            "--out", str(out)]


def train_copy_cmd(s: Sizes, profile: Path, traces: Path, out: Path) -> list[str]:
    return [*MCSD, "train", "--decision", "copy", *pair_args(s, out.parent),
            "--k-config", s.k_config,
            "--prompts", s.copy_prompts, "--limit", str(s.copy_limit),
            "--eval-prompts", s.eval_prompts, "--eval-limit", str(s.copy_eval_limit),
            "--max-new-tokens", str(s.tokens), *EOS_IGNORE, "--cost-profile", str(profile),
            "--max-copy", str(s.profile_max_tokens - 1),  # the longest the profile prices
            "--traces", str(traces), "--check-prompts", str(s.check_prompts), "--force",
            *train_threads(), "--out", str(out)]


def eval_cmd(s: Sizes, temperature: str, methods: list[str], out: Path) -> list[str]:
    """`mcsd eval` through `gpu_check.eval_stage`, which appends each record to `RECORDS` in
    `out` as it is decoded."""
    return [*PY, "-m", "mcsd_runtime.gpu_check.eval_stage", "--records", str(out / RECORDS),
            "eval", *pair_args(s, out.parent), "--prompts", s.eval_prompts,
            "--limit", str(s.eval_limit), "--k-config", s.k_config,
            "--max-new-tokens", str(s.tokens), "--temperature", temperature, *EOS_IGNORE,
            "--deploy", s.deploy, "--methods", ",".join(methods), *THREADS, "--out", str(out)]


# GPU baselines the issue asks for beside `hf`: the target's generate() on a static cache,
# compiled (`hf-static`, compiled on CUDA). They run in a stage of their own (`eval-static`,
# greedy, beside `ar` and `hf`), so that a compile slower than its allowance costs only them. Those
# `mcsd eval` has no method for are named in the report as missing; when eval gains one, add
# its name to GPU_BASELINES.
GPU_BASELINES: tuple[str, ...] = ("hf-static",)
MISSING = ("HF assisted generation (hf-assisted) cannot run a feature draft (generate() does "
           "not hand it the target's states)",)


# ---------------------------------------------------------------------------------------------
# Stages


@dataclass
class Stage:
    name: str
    allowance_s: float
    needs: tuple[str, ...]
    output: str  # what it writes, relative to the run folder
    argv: Callable[[Path], list[str]]  # its command line, built when it starts
    figures: Callable[[Path], dict] = lambda run: {}  # key figures, from the run folder
    call: int = 2  # the device call that runs it (`run --call N`)
    packages: tuple[str, ...] = ()  # carried packages it imports (skipped if one does not)
    always: bool = False  # run at every `run` of its call, never resumed (the preflight)
    goals: bool = False  # its output JSON carries `goals` (the engine check's), for the report


def done(run: Path, stage: str) -> bool:
    """Whether `stage` finished in the run folder `run` (its done-marker says so)."""
    return read_json(run / "stages" / f"{stage}.json").get("status") == "done"


def _engine_stages(s: Sizes) -> list[Stage]:
    out = []
    for shape in filter(None, s.shapes.split(",")):
        name = f"engine-{shape}"
        out.append(Stage(name, s.allowances.get(name, SMOKE_ALLOWANCE), (), f"{name}.json",
                         lambda run, shape=shape, name=name: engine_cmd(
                             s, shape, run / f"{name}.json"),
                         lambda run, name=name: fig.engine(run / f"{name}.json"), call=1,
                         goals=True))
    return out


def target_packages(s: Sizes) -> tuple[str, ...]:
    """What the target stage needs carried: gguf, and a named model's package (its GGUF)."""
    if s.target.startswith("toy"):
        return ()
    from mcsd_runtime.backend.named import NAMED_MODELS

    named = NAMED_MODELS.get(s.target)
    return ("gguf", *((named.package,) if named else ()))


def _train_stages(s: Sizes) -> list[Stage]:
    out = []
    for model in ("lightgbm", "mlp"):
        name = f"train-{model}"
        out.append(Stage(name, s.allowances.get(name, SMOKE_ALLOWANCE), ("collect", "profile"),
                         f"stoppers/{model}",
                         lambda run, model=model: train_stop_cmd(
                             s, model, run / "collect", run / "cost.json",
                             run / "stoppers" / model),
                         lambda run, model=model: fig.stopper(run / "stoppers" / model),
                         packages=("lightgbm",) if model == "lightgbm" else ()))
    out.append(Stage("train-copy", s.allowances.get("train-copy", SMOKE_ALLOWANCE), ("profile",),
                     "copy-draft", lambda run: train_copy_cmd(
                         s, run / "cost.json", run / "traces.json", run / "copy-draft"),
                     lambda run: fig.copy_policy(run / "copy-draft"), packages=("lightgbm",)))
    return out


def _late_stages(s: Sizes) -> list[Stage]:
    """After everything else, each with its own hard limit: run if time is left."""
    out = [Stage("eval-static", s.allowances.get("eval-static", SMOKE_ALLOWANCE), ("distill",),
                 "eval-static", lambda run: eval_cmd(
                     s, "0", ["ar", "hf", *GPU_BASELINES], run / "eval-static"),
                 lambda run: fig.evaluation(run / "eval-static"))]
    for shape in filter(None, s.shapes.split(",")):
        name = f"spike-{shape}"
        out.append(Stage(name, s.allowances.get(name, SMOKE_ALLOWANCE), (), f"{name}.json",
                         lambda run, shape=shape, name=name: spike_cmd(
                             s, shape, run / f"{name}.json"),
                         lambda run, name=name: spike_figures(run / f"{name}.json")))
    return out


def stages(s: Sizes) -> list[Stage]:
    """The check's stages in the order they run: call 1's (the engine at every shape, needing
    nothing but torch), then call 2's (the preflight, the real pair's pipeline, the late stages
    last). No stage needs the preflight: it only tells which carried packages are missing."""
    out = [*_engine_stages(s),
           Stage("preflight", s.allowances.get("preflight", SMOKE_ALLOWANCE), (), "preflight.json",
                 lambda run: preflight_cmd(run / "preflight.json", tuple(
                     p for p in target_packages(s) if p != "gguf")),
                 lambda run: fig.preflight(run / "preflight.json"), always=True),
           Stage("target", s.allowances.get("target", SMOKE_ALLOWANCE), (), "",
                 lambda run: target_cmd(s), packages=target_packages(s)),
           Stage("distill", s.allowances.get("distill", SMOKE_ALLOWANCE), ("target",), "draft",
                 lambda run: distill_cmd(s, run)),
           Stage("collect", s.allowances.get("collect", SMOKE_ALLOWANCE), ("distill",), "collect",
                 lambda run: collect_cmd(s, run / "collect"),
                 lambda run: fig.collect(run / "collect", run)),
           Stage("profile", s.allowances.get("profile", SMOKE_ALLOWANCE), ("distill",), "cost.json",
                 lambda run: profile_cmd(s, run / "cost.json"),
                 lambda run: fig.profile(run / "cost.json")),
           *_train_stages(s)]
    for temp in filter(None, s.temperatures.split(",")):
        name = f"eval-t{temp}"
        out.append(Stage(name, s.allowances.get(name, SMOKE_ALLOWANCE), ("distill",), name,
                         lambda run, temp=temp, name=name: eval_cmd(
                             s, temp, eval_methods(s, run), run / name),
                         lambda run, name=name: fig.evaluation(run / name)))
    return out + _late_stages(s)


def needing(stages_: list[Stage], root: str) -> list[str]:
    """`root` and every stage that needs it, directly or through another."""
    out = [root]
    for st in stages_:
        if set(st.needs) & set(out):
            out.append(st.name)
    return out


def spike_figures(path: Path) -> dict:
    """Milliseconds per forward by way, `rows x new tokens`."""
    return {f"{r['way']} {r['rows']}x{r['new_tokens']}": round(r["ms"], 3)
            for r in read_json(path).get("rows", []) if "ms" in r}


def eval_methods(s: Sizes, run: Path) -> list[str]:
    """AR, generate(), the statics, the tuned heuristic and switch (from the LightGBM stopper's
    training, else the default heuristic), prompt lookup beside the draft, and the learned
    decisions whose training finished."""
    peers = read_json(run / "stoppers" / "lightgbm" / "metrics.json").get("peers", {})
    methods = ["ar", "hf", *filter(None, s.statics.split(",")),
               peers.get("heuristic") or "heuristic"]
    if peers.get("switch"):
        methods.append(peers["switch"])
    methods += [f"stopper:{run / 'stoppers' / m}" for m in ("lightgbm", "mlp")
                if done(run, f"train-{m}")]
    methods.append(s.deploy)
    if done(run, "train-copy"):
        methods.append(f"lookup-learned:{run / 'copy-draft'}+static:1")
    return list(dict.fromkeys(methods))
