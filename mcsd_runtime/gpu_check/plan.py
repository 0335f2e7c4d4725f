"""The GPU check's stages: what each one runs, its time budget, the stages it needs, where it
writes, and the figures the report takes from its output.

Every command line of the check is built in this module, by the functions under "Command
lines": an option the CLIs rename is renamed there and nowhere else (tests/test_gpu_check.py
parses each planned command with the `mcsd` parser, so a rename the plan missed fails a test).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mcsd_runtime.gpu_check import figures as fig
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
    shapes: str  # step_breakdown shapes, comma-separated
    breakdown_methods: str
    breakdown_draft_layers: int  # for shapes without a draft shape of their own
    breakdown_k_config: str
    breakdown_prompt_tokens: int
    breakdown_tokens: int
    breakdown_repeats: int
    breakdown_copy_mib: int
    budgets: dict = field(default_factory=dict)  # stage -> seconds

    def with_overrides(self, pairs: list[str]) -> Sizes:
        """A copy with `FIELD=VALUE` overrides (budgets as `budget.STAGE=SECONDS`)."""
        changes, budgets = {}, dict(self.budgets)
        fields = {f.name: f for f in dataclasses.fields(self)}
        for pair in pairs:
            key, eq, value = pair.partition("=")
            key = key.strip().replace("-", "_")
            if key.startswith("budget."):
                budgets[key.removeprefix("budget.")] = float(value)
            elif not eq or key not in fields or key == "budgets":
                raise ValueError(f"--set takes FIELD=VALUE with FIELD one of "
                                 f"{', '.join(k for k in fields if k != 'budgets')} or "
                                 f"budget.STAGE, got {pair!r}")
            else:
                kind = type(getattr(self, key))
                changes[key] = kind(value) if kind is not str else value
        return dataclasses.replace(self, budgets=budgets, **changes)


# seconds per stage on a lent H100/H200, 560 in all, so that the check fits one ten-minute
# call: the captured engine's goals (issue 52); a stage past its budget is stopped and the next
# one runs. The feature draft's distillation (data generation, then training) is the longest:
# the default recipe took 114 s on an H200 and the feature recipe generates three times the
# conversations; its generated data are cached, so a rerun continues where it was stopped.
GPU_BUDGETS = {"target": 30, "breakdown-smollm2": 40, "breakdown-llama2-7b": 70, "distill": 210,
               "collect": 45, "profile": 25, "train-lightgbm": 20, "train-mlp": 20,
               "train-copy": 30, "eval-t0": 35, "eval-t0.7": 35, "eval-static": 45,
               # last: one forward eager, captured and compiled (torch.compile compiles each
               # shape for tens of seconds); `--only target,spike-smollm2,...` runs them first
               "spike-smollm2": 90, "spike-llama2-7b": 120}

GPU = Sizes(
    target="smollm2", recipe="features", device="cuda", k_config="4,1/1,1,1,1,1",
    collect_prompts="inst-mix", collect_limit=200, tokens=64, processes=4, batch=8,
    profile_max_tokens=16, profile_rounds=5, profile_prompts="inst-mix", profile_limit=4,
    check_prompts=2, mlp_epochs=0, copy_prompts="inst-explain,inst-docstring-code,inst-qa",
    copy_limit=24, copy_eval_limit=2, eval_prompts="inst-mix-eval", eval_limit=2,
    temperatures="0,0.7", statics="static:1,static:2,static:3,static:4",
    deploy="lookup:8:3+static:1", shapes="smollm2,llama2-7b",
    breakdown_methods="hf,ar,static:1,static:4", breakdown_draft_layers=4,
    breakdown_k_config="4,2,2,1", breakdown_prompt_tokens=256, breakdown_tokens=64,
    breakdown_repeats=3, breakdown_copy_mib=1024, budgets=GPU_BUDGETS)

# the toy pair on this CPU: every stage at toy sizes, a few minutes in all
SMOKE = Sizes(
    target="toy:tiny", recipe="tiny", device="cpu", k_config="2,1/1,1",
    collect_prompts="inst-mix", collect_limit=4, tokens=8, processes=2, batch=2,
    profile_max_tokens=8, profile_rounds=1, profile_prompts="inst-mix", profile_limit=1,
    check_prompts=1, mlp_epochs=2, copy_prompts="inst-qa", copy_limit=2, copy_eval_limit=1,
    eval_prompts="inst-mix-eval", eval_limit=1, temperatures="0,0.7",
    statics="static:1,static:3", deploy="lookup:8:3+static:1", shapes="tiny",
    breakdown_methods="hf,ar,static:2", breakdown_draft_layers=1, breakdown_k_config="1,1",
    breakdown_prompt_tokens=16, breakdown_tokens=8, breakdown_repeats=1, breakdown_copy_mib=8,
    budgets={"target": 120, "distill": 120, "collect": 180, "breakdown-tiny": 120})
SMOKE_BUDGET = 120  # seconds, a smoke stage without a budget of its own


# ---------------------------------------------------------------------------------------------
# Command lines: the only place the check names a command or an option

PY = [sys.executable]
MCSD = [*PY, "-m", "mcsd_runtime"]
EOS_IGNORE = ["--eos", "ignore"]  # every output runs to its full length
THREADS = ["--threads", "1"]


def pair_args(s: Sizes) -> list[str]:
    return ["--target", s.target, "--draft", f"distill:{s.recipe}", "--device", s.device]


def target_cmd(s: Sizes) -> list[str]:
    """Make the target loadable once: the toy pair's build, or a named model's GGUF file
    converted into the cache (a stage of its own, so its minute is not charged elsewhere)."""
    if s.target.startswith("toy"):
        preset = s.target.partition(":")[2] or "default"
        return [*MCSD, "toy", "build", "--recipe", preset]
    code = ("import sys; from mcsd_runtime.backend.named import is_named, resolve_named; "
            "print(resolve_named(sys.argv[1]) if is_named(sys.argv[1]) else sys.argv[1])")
    return [*PY, "-c", code, s.target]


def breakdown_cmd(s: Sizes, shape: str, out: Path) -> list[str]:
    return [*MCSD, "step-breakdown", "--shape", shape,
            "--draft-layers", str(s.breakdown_draft_layers), "--device", s.device,
            "--graphs", "off,on", "--methods", s.breakdown_methods,
            "--k-config", s.breakdown_k_config, "--prompt-tokens", str(s.breakdown_prompt_tokens),
            "--max-new-tokens", str(s.breakdown_tokens), "--prompt-count", "1",
            "--rounds", str(s.breakdown_repeats), "--copy-mib", str(s.breakdown_copy_mib),
            "--out", str(out)]


def spike_cmd(s: Sizes, shape: str, out: Path) -> list[str]:
    """One target forward eager, fixed-shape (captured) and compiled, at 1 and 8 rows."""
    return [*PY, "-m", "mcsd_runtime.costmodel.capture_spike", "--shape", shape,
            "--device", s.device, "--context", str(s.breakdown_prompt_tokens),
            "--out", str(out)]


def distill_cmd(s: Sizes) -> list[str]:
    return [*MCSD, "draft", "distill", "--target", s.target, "--recipe", s.recipe,
            "--device", s.device]


def collect_cmd(s: Sizes, out: Path) -> list[str]:
    procs = ["--processes-per-device", str(s.processes)] if s.processes > 1 else []
    return [*MCSD, "collect", *pair_args(s), "--k-config", s.k_config, "--dense",
            "--max-new-tokens", str(s.tokens), "--prompts", s.collect_prompts,
            "--limit", str(s.collect_limit), *procs, "--batch-size", str(s.batch), *THREADS,
            "--no-progress", "--out", str(out)]


def profile_cmd(s: Sizes, out: Path) -> list[str]:
    return [*MCSD, "profile", *pair_args(s), "--out", str(out),
            "--max-tokens", str(s.profile_max_tokens), "--rounds", str(s.profile_rounds),
            "--k-config", s.k_config, "--prompts", s.profile_prompts,
            "--limit", str(s.profile_limit), "--max-new-tokens", str(min(s.tokens, 48)), *THREADS]


def train_stop_cmd(s: Sizes, model: str, runs: Path, profile: Path, out: Path) -> list[str]:
    epochs = ["--max-epochs", str(s.mlp_epochs)] if s.mlp_epochs and model == "mlp" else []
    return [*MCSD, "train", "--decision", "stop", "--runs", str(runs), "--model", model,
            "--cost-profile", str(profile), "--val-frac", "0.3",
            "--check-prompts", str(s.check_prompts), *epochs, *THREADS, "--force",
            "--out", str(out)]


def train_copy_cmd(s: Sizes, profile: Path, traces: Path, out: Path) -> list[str]:
    return [*MCSD, "train", "--decision", "copy", *pair_args(s), "--k-config", s.k_config,
            "--prompts", s.copy_prompts, "--limit", str(s.copy_limit),
            "--eval-prompts", s.eval_prompts, "--eval-limit", str(s.copy_eval_limit),
            "--max-new-tokens", str(s.tokens), *EOS_IGNORE, "--cost-profile", str(profile),
            "--max-copy", str(s.profile_max_tokens - 1),  # the longest the profile prices
            "--traces", str(traces), "--check-prompts", str(s.check_prompts), "--force",
            *THREADS, "--out", str(out)]


def eval_cmd(s: Sizes, temperature: str, methods: list[str], out: Path) -> list[str]:
    return [*MCSD, "eval", *pair_args(s), "--prompts", s.eval_prompts,
            "--limit", str(s.eval_limit), "--k-config", s.k_config,
            "--max-new-tokens", str(s.tokens), "--temperature", temperature, *EOS_IGNORE,
            "--deploy", s.deploy, "--methods", ",".join(methods), *THREADS, "--out", str(out)]


# GPU baselines the issue asks for beside `hf`: the target's generate() on a static cache,
# compiled (`hf-static`, compiled on CUDA). They run in a stage of their own (`eval-static`,
# greedy, beside `ar` and `hf`), so that a compile slower than its budget costs only them. Those
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
    budget_s: float
    needs: tuple[str, ...]
    output: str  # what it writes, relative to the run folder
    argv: Callable[[Path], list[str]]  # its command line, built when it starts
    figures: Callable[[Path], dict] = lambda run: {}  # key figures, from the run folder


def done(run: Path, stage: str) -> bool:
    """Whether `stage` finished in the run folder `run` (its done-marker says so)."""
    return read_json(run / "stages" / f"{stage}.json").get("status") == "done"


def stages(s: Sizes) -> list[Stage]:
    """The check's stages in the order they run."""
    out = [Stage("target", s.budgets.get("target", SMOKE_BUDGET), (), "",
                 lambda run: target_cmd(s))]
    for shape in filter(None, s.shapes.split(",")):
        name = f"breakdown-{shape}"
        out.append(Stage(name, s.budgets.get(name, SMOKE_BUDGET), (), f"{name}.json",
                         lambda run, shape=shape, name=name: breakdown_cmd(
                             s, shape, run / f"{name}.json"),
                         lambda run, name=name: fig.breakdown(run / f"{name}.json")))
    out += [
        Stage("distill", s.budgets.get("distill", SMOKE_BUDGET), ("target",), "",
              lambda run: distill_cmd(s)),
        Stage("collect", s.budgets.get("collect", SMOKE_BUDGET), ("distill",), "collect",
              lambda run: collect_cmd(s, run / "collect"),
              lambda run: fig.collect(run / "collect", run)),
        Stage("profile", s.budgets.get("profile", SMOKE_BUDGET), ("distill",), "cost.json",
              lambda run: profile_cmd(s, run / "cost.json"),
              lambda run: fig.profile(run / "cost.json")),
    ]
    for model in ("lightgbm", "mlp"):
        name = f"train-{model}"
        out.append(Stage(name, s.budgets.get(name, SMOKE_BUDGET), ("collect", "profile"),
                         f"stoppers/{model}",
                         lambda run, model=model: train_stop_cmd(
                             s, model, run / "collect", run / "cost.json",
                             run / "stoppers" / model),
                         lambda run, model=model: fig.stopper(run / "stoppers" / model)))
    out.append(Stage("train-copy", s.budgets.get("train-copy", SMOKE_BUDGET), ("profile",),
                     "copy-draft", lambda run: train_copy_cmd(
                         s, run / "cost.json", run / "traces.json", run / "copy-draft"),
                     lambda run: fig.copy_policy(run / "copy-draft")))
    for temp in filter(None, s.temperatures.split(",")):
        name = f"eval-t{temp}"
        out.append(Stage(name, s.budgets.get(name, SMOKE_BUDGET), ("distill",), name,
                         lambda run, temp=temp, name=name: eval_cmd(
                             s, temp, eval_methods(s, run), run / name),
                         lambda run, name=name: fig.evaluation(run / name)))
    out.append(Stage("eval-static", s.budgets.get("eval-static", SMOKE_BUDGET), ("distill",),
                     "eval-static", lambda run: eval_cmd(
                         s, "0", ["ar", "hf", *GPU_BASELINES], run / "eval-static"),
                     lambda run: fig.evaluation(run / "eval-static")))
    for shape in filter(None, s.shapes.split(",")):
        name = f"spike-{shape}"
        out.append(Stage(name, s.budgets.get(name, SMOKE_BUDGET), (), f"{name}.json",
                         lambda run, shape=shape, name=name: spike_cmd(
                             s, shape, run / f"{name}.json"),
                         lambda run, name=name: spike_figures(run / f"{name}.json")))
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
