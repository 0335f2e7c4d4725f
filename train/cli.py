"""`mcsd train`: train a learned decision, choose its settings by replayed throughput, and
write its artifact folder. `--decision` picks which of the decoder's choices is learned:

  stop   (default) the depth stopper: after each draft depth, whether to draft one more. A
         decision model (LightGBM or MLP) is fitted on collected runs (--runs, written by
         `mcsd collect`); decode it with `mcsd eval --methods stopper:PATH`.
  copy   the prompt-lookup copy length: how many tokens of a match to verify each step, if any,
         learned on the target's own outputs of --prompts; with --k-config, whether to copy or
         to draft that tree's first depth. Decode it as lookup-learned:PATH (with --k-config:
         lookup-learned:PATH+static:1 --k-config K_CONFIG).
  width  the width of the draft's first depth: how many of its candidates a drafted step
         verifies, learned on the target's greedy outputs of --prompts; decode it as width:PATH
         on a --k-config whose first depth is the one it was trained for.
  schedule the draft length K by batch size for a serving engine, chosen from acceptance
         traces (--runs: engine traces or dense chain collections) at an engine profile's
         step costs (--cost-profile); export it with `mcsd export FOLDER --engine vllm`.
  sts    DSpark's per-position confidence calibration (sequential temperature scaling): one
         temperature per draft position, fitted against the survival on dense collections
         (--runs) or on SGLang's or TensorRT-LLM's captured shards (--from-shards GLOB); no
         cost profile. Its sts.json is read by our budget (survival-sts:PATH@PROFILE) and by
         the engines (docs/sts.md).

Every decision is trained by the same stages (`train.decision`): prepare the data, fit the
model, choose its settings by replayed throughput, write the artifact folder (`decision.json`
last, into a staging folder that replaces --out once complete), and with --check-prompts decode
held-out prompts end to end beside the replay (check.json). Every decision but sts needs a cost
profile of the pair on this machine (`mcsd profile`) to price steps (the stopper without one
replays relative costs); each option below says which decisions take it, and one that the decision
does not take is refused. `mcsd train --decision D --help` shows D's own documentation.

    mcsd collect --target toy --prompts toy-code-collect --dense --k-config 1,1,1,1,1,1,1,1 \\
        --max-new-tokens 64 --out data/runs/dense
    mcsd profile --target toy --k-config 1,1,1,1,1,1,1,1 --out data/runs/cost.json
    mcsd train --runs data/runs/dense --model lightgbm --cost-profile data/runs/cost.json \\
        --out data/runs/stoppers/lightgbm
    mcsd eval --target toy --methods ar,static:4,heuristic,stopper:data/runs/stoppers/lightgbm
    mcsd train --bench-latency --out data/runs/stoppers/lightgbm  # decision latency
    mcsd train --decision copy --prompts inst-explain,inst-qa --eval-prompts inst-mix-eval \\
        --cost-profile data/runs/cost.json --out data/runs/copy
    mcsd train --decision width --prompts inst-explain,inst-qa --k-config 4 \\
        --cost-profile data/runs/cost.json --out data/runs/width
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from mcsd_runtime.cli.args import (
    add_batch_size_arg,
    add_cost_profile_arg,
    add_eos_arg,
    add_force_arg,
    add_k_config_arg,
    add_limit_arg,
    add_max_new_tokens_arg,
    add_out_arg,
    add_pair_args,
    add_prompts_arg,
    add_runs_arg,
    add_seed_arg,
    add_temperature_arg,
    add_threads_arg,
    parse_batch_sizes,
)
from mcsd_runtime.constants import STOPPER_KINDS
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts.chat import add_chat_arg
from replay.data import REPLAY_MODES
from train.budget.config import BudgetConfig
from train.copy.config import CopyConfig
from train.outputs import OutputsConfig
from train.schedule.config import ScheduleConfig
from train.stop.config import LABEL_DOC, TRAJECTORIES, TrainConfig, default_label
from train.sts.config import StsConfig
from train.width.config import WidthConfig

D = TrainConfig  # the defaults, read off its fields (and off CopyConfig and OutputsConfig)
DECISIONS = ("stop", "copy", "width", "budget", "schedule", "sts")
STOP_DOC = """--decision stop fits a stopper's decision model on collected runs, chooses its
aggregation and threshold by replayed throughput on validation prompts, and writes the artifact
folder (stopper.json, the model, metrics.json, replay_curve.json/png, calibration.png and, except
for mlp-hidden, importance.png: LightGBM's gain and SHAP, an MLP's permutation importance).

Prompts are split train/validation/test (grouped: no prompt in two splits, seeded). Labels: a
frontier node at depth d is positive when it is on the accepted path and the path continues past
it (`hard`), or the product of soft acceptance probabilities min(1, p/q) along that path
(`soft`). Without --cost-profile, throughput is relative (a draft forward costs 0.1 of a target
forward); measure one with `mcsd profile`.
"""
# the options each decision takes beyond every decision's (`_add_common_args`), as its config
# names them; one that the decision does not take is refused (`resolve`)
OPTIONS = {"stop": TrainConfig.OPTIONS, "copy": CopyConfig.OPTIONS,
           "width": WidthConfig.OPTIONS, "budget": BudgetConfig.OPTIONS,
           "schedule": ScheduleConfig.OPTIONS, "sts": StsConfig.OPTIONS}
# dest -> the decisions that take it; such an option's parser default is None (not given), and
# its decision's config gives the default (`stop_config`, `budget_config`, `copy_config`,
# `width_config`)
TAKES = {dest: tuple(d for d in DECISIONS if dest in OPTIONS[d])
         for dest in dict.fromkeys(o for d in DECISIONS for o in OPTIONS[d])}
CHECK_PROMPTS = {"stop": 8}  # --check-prompts by default (the others: 0)
_OPTIONS: dict[str, str] = {}  # dest -> its option string (`add_args` records it)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a learned decision: the depth stopper (LightGBM or "
                                     "MLP on collected runs), the copy length or the width",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       add_help=False)
    add_args(p)
    p.set_defaults(func=run)


class _DecisionHelp(argparse.Action):
    """-h/--help: the overview, or after --decision D, D's own documentation."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        decision = getattr(namespace, "decision", None)
        if decision in DECISIONS:
            parser.description = decision_doc(decision)
        parser.print_help()
        parser.exit()


def decision_doc(decision: str) -> str:
    """The documentation `mcsd train --decision DECISION --help` shows."""
    if decision == "stop":
        return STOP_DOC
    if decision == "budget":
        from mcsd_runtime.decisions import verify_budget
        from train.budget import trainer as budget

        return f"{budget.__doc__}\n{verify_budget.__doc__}"
    if decision == "schedule":
        from train.schedule import acceptance
        from train.schedule import trainer as schedule

        return f"{schedule.__doc__}\n{acceptance.__doc__}"
    if decision == "sts":
        from mcsd_runtime.decisions import sts
        from train.sts import chains
        from train.sts import trainer as sts_trainer

        return f"{sts_trainer.__doc__}\n{chains.__doc__}\n{sts.__doc__}"
    if decision == "copy":
        from replay import copy as replay_copy
        from train import copy
        from train.copy import fit

        return f"{copy.__doc__}\n{fit.__doc__}\n{replay_copy.__doc__}"
    from mcsd_runtime.decisions import width as runtime_width
    from replay import width as replay_width
    from train import width

    return f"{width.__doc__}\n{runtime_width.__doc__}\n{replay_width.__doc__}"


def add_args(p: argparse.ArgumentParser) -> None:
    """The options of every decision (a parser made with add_help=False: the help is
    decision-aware)."""
    _add_common_args(p)
    _add_stop_args(p)
    _add_output_args(p)
    _add_copy_args(p)
    _add_schedule_args(p)
    _add_sts_args(p)
    _defer_defaults(p)


def _add_common_args(p: argparse.ArgumentParser) -> None:
    """-h/--help and the group of options every decision takes."""
    p.add_argument("-h", "--help", action=_DecisionHelp,
                   help="show this help (after --decision D: D's own documentation) and exit")
    g = p.add_argument_group("every decision")
    g.add_argument("--decision", choices=DECISIONS, default=None,
                   help="the learned decision: stop (default), copy, width, budget (the "
                        "verification budget of a ragged batch), schedule (K by batch size "
                        "for a serving engine) or sts (per-position confidence calibration, "
                        "DSpark's STS)")
    add_out_arg(g, "artifact folder to write", required=True)
    add_force_arg(g, "replace an existing --out folder")
    add_cost_profile_arg(g, "forward-latency profile JSON of this pair on this machine (`mcsd "
                            "profile`) that prices replayed steps; copy and width require one, "
                            "timing forwards of up to --max-copy + 1 (copy) or k + 1 (width) "
                            "tokens; copy also takes a serving engine's (`mcsd profile --engine "
                            "vllm`, K=0..--max-copy) to price its steps as that engine runs "
                            "them")
    add_seed_arg(g, "split and model seed; for copy also of sampled outputs and of the check's "
                    "decoding (default %(default)s)", default=D.seed)
    g.add_argument("--check-prompts", type=int, default=None, metavar="N",
                   help="then decode held-out prompts end to end and report the replay's error "
                        "against reality (check.json); stop: N test prompts with every static "
                        "depth and the stopper (needs a measured --cost-profile and the "
                        "collection's pair; default 8); copy and width: N held-out prompts per "
                        "category of --eval-prompts with ar, the statics and the learned "
                        "decision (default 0); 0 skips")
    add_threads_arg(g)


def _add_stop_args(p: argparse.ArgumentParser) -> None:
    """The group of --decision stop: a stopper trained on collected runs."""
    g = p.add_argument_group("--decision stop: a stopper trained on collected runs")
    _add_stop_model_args(g)
    _add_stop_replay_args(g)


def _add_stop_model_args(g: argparse._ArgumentGroup) -> None:
    """--decision stop's data, model, label, splits, replay and features."""
    add_runs_arg(g, "collection run folders (from `mcsd collect`, full-depth; --dense for exact "
                    "replay)")
    g.add_argument("--model", default=D.model, choices=STOPPER_KINDS,
                   help="lightgbm, mlp on the scalar features, or mlp-hidden (the paper's "
                        f"hidden->512->256->1 model on draft hidden states; default {D.model})")
    g.add_argument("--label", default=None, choices=list(LABEL_DOC),
                   help=f"training target (default: {D.label}; {default_label('mlp-hidden')} "
                        f"for mlp-hidden, as in the paper)")
    g.add_argument("--val-frac", type=float, default=D.val_frac,
                   help=f"validation prompts (default {D.val_frac})")
    g.add_argument("--test-frac", type=float, default=D.test_frac,
                   help=f"test prompts (default {D.test_frac})")
    g.add_argument("--aggregations", default=D.aggregations,
                   help="frontier aggregations to try, comma-separated (default: all that "
                        "mcsd_runtime.decisions.learned.AGGREGATIONS defines)")
    g.add_argument("--replay", default=D.replay_mode, choices=REPLAY_MODES,
                   help="exact walk (dense greedy runs) or per-step estimate (default: "
                        f"{D.replay_mode})")
    g.add_argument("--trajectory", default=D.trajectory, choices=TRAJECTORIES,
                   help="trajectory features of dense runs for training: walk recomputes them "
                        "along a full-depth walk (the stored ones leak the label), stored keeps "
                        f"them (default {D.trajectory})")
    g.add_argument("--features", default=D.features,
                   help="what the model reads: all (default), node (the draft's features "
                        "only, not the run's history: tokens generated, previous and recent "
                        "acceptance), or comma-separated names of "
                        "mcsd_runtime.decisions.features.DECISION_FEATURES")


def _add_stop_replay_args(g: argparse._ArgumentGroup) -> None:
    """--decision stop's decision cost, batch sizes, online recalibration, epochs, other
    domains and latency benchmark."""
    g.add_argument("--decision-us", type=float, default=D.decision_us,
                   help="seconds-profile replay charges this many µs per stopper decision "
                        "(default: benchmarked with the frontier's features computed over the "
                        "target's vocabulary, as in the decoder, where the pair is local)")
    add_batch_size_arg(g, "batch sizes to choose the stopper's settings for by batched replay "
                          "(stopper.json's `batch` table; the decoder at B rows uses the entry "
                          "of the largest size <= B); sizes above 1 need a --cost-profile "
                          "measured at them (`mcsd profile --batch-size`; default "
                          f"{','.join(map(str, D.batch_sizes))})", several=True,
                       default=",".join(map(str, D.batch_sizes)))
    g.add_argument("--online", action="store_true",
                   help="also try per-sequence recalibration from the acceptances seen "
                        "(mcsd_runtime.decisions.online), kept where it replays faster on "
                        "validation prompts (stopper.json `online_strength`; off by default: at "
                        "parity end to end on the real pair)")
    g.add_argument("--max-epochs", type=int, default=D.max_epochs,
                   help="MLP epochs cap (default: train.stop.config.MLP_EPOCHS)")
    g.add_argument("--domains", nargs="+", type=Path, default=[], metavar="RUN_DIR",
                   help="dense collections of other domains (never trained on): report the "
                        "stopper's calibration (ECE) and replayed speed on each against the "
                        "deploy static, the domain's best static and the tuned heuristic "
                        "(metrics.json `domains`, calibration_domains.png)")
    g.add_argument("--bench-latency", action="store_true",
                   help="measure the decision latency of the artifact in --out (after training, "
                        "or alone without --runs)")


def _add_output_args(p: argparse.ArgumentParser) -> None:
    """The pair and the group of --decision copy and width, trained on the target's own
    outputs."""
    add_pair_args(p, "--decision copy and width: the model pair whose target's outputs they "
                     "learn on")
    g = p.add_argument_group("--decision copy and width: trained on the target's own outputs")
    add_prompt_args(g)
    add_k_config_arg(g, None, "copy: learn to copy or draft, a step that copies nothing "
                              "drafting this tree's first depth (decode as "
                              "`lookup-learned:PATH+static:1 --k-config K_CONFIG`; with "
                              "--temperature, each output is drawn through the first depth's "
                              "mcss verification; default: the target decodes such a step "
                              "alone); width: the first depth's candidates, the widest width "
                              f"(default {WidthConfig.k_config}: decode on a --k-config starting "
                              "with it)")
    add_max_new_tokens_arg(g, OutputsConfig.max_new_tokens,
                           f"output tokens per prompt (default {OutputsConfig.max_new_tokens})")
    add_eos_arg(g, OutputsConfig.eos,
                help="stop: end each output at EOS; ignore (default): run to --max-new-tokens, "
                     "as `mcsd eval --eos ignore` decodes")
    g.add_argument("--traces", type=Path, default=None,
                   help="JSON cache of the target's outputs, shared by copy and width: reused "
                        "where it holds a prompt, extended where not (outputs of another "
                        "target, length, temperature or seed are refused)")
    add_chat_arg(g)


def _add_copy_args(p: argparse.ArgumentParser) -> None:
    """The group of --decision copy."""
    g = p.add_argument_group("--decision copy")
    g.add_argument("--max-copy", type=int, default=CopyConfig.max_copy,
                   help=f"most tokens copied in a step (default {CopyConfig.max_copy})")
    g.add_argument("--min-ngram", type=int, default=None,
                   help="shortest match considered (default 1, the policy deciding which short "
                        "matches pay; 2 with --k-config, where a copy after a one-token match "
                        "rarely beats the draft)")
    add_temperature_arg(g, "the temperature the policy will decode at: outputs are sampled at it "
                           "(default 0: greedy)", default=CopyConfig.temperature)
    g.add_argument("--folds", type=int, default=CopyConfig.folds,
                   help="also replay the training mix out of fold: a policy fitted on the other "
                        f"folds decides each output (default {CopyConfig.folds} folds; 0: skip)")


def _add_schedule_args(p: argparse.ArgumentParser) -> None:
    """The group of --decision schedule (it also takes --runs, --batch-size and --test-frac)."""
    g = p.add_argument_group("--decision schedule: K by batch size for a serving engine (it "
                             "also takes --runs, --batch-size: where bands start, default the "
                             "profile's concurrencies; and --test-frac)")
    g.add_argument("--max-k", type=int, default=None, metavar="N",
                   help="the largest K tried (default: the largest the profile measured and "
                        "the traces drafted)")


def _add_sts_args(p: argparse.ArgumentParser) -> None:
    """The group of --decision sts (it also takes --runs and --test-frac)."""
    g = p.add_argument_group("--decision sts: per-position confidence calibration, DSpark's "
                             "STS (it also takes --runs: dense collections; and --test-frac: "
                             "held-out prompts, default 0.3)")
    g.add_argument("--from-shards", default=None, metavar="GLOB",
                   help="fit on DSpark's captured .pt shards (SGLang's or TensorRT-LLM's "
                        "calibration capture: dicts of [n, gamma] logits and prefix_mask) "
                        "instead of --runs; quote the glob")
    g.add_argument("--gamma", type=int, default=None, metavar="N",
                   help="draft positions fitted, the engine's draft length (default: the "
                        "deepest the data drafted; deeper chains are cut at N)")
    g.add_argument("--offsets", action="store_true",
                   help="fit a per-position offset beside each temperature (the confidence "
                        "sigmoid(logit / T + b)): a raw draft's logit(q) is overconfident by "
                        "an offset no temperature removes. The engines do not read offsets, so "
                        "such a table calibrates our budget (survival-sts) only")


def _defer_defaults(p: argparse.ArgumentParser) -> None:
    """Record the option string of every option some decisions do not take (`TAKES`), and set
    its parser default to None: not given, it takes its decision's config default."""
    for action in p._actions:
        if action.dest in TAKES:
            _OPTIONS.setdefault(action.dest, action.option_strings[0])
            action.default = None


def add_prompt_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--prompts, --eval-prompts, --limit and --eval-limit (`load_prompt_domains` reads them)."""
    add_prompts_arg(p, "training prompt sets, comma-separated (e.g. inst-explain,inst-qa); "
                       "required")
    p.add_argument("--eval-prompts", default=None,
                   help="held-out prompt sets to report on, split by category (e.g. "
                        "inst-mix-eval); never trained on")
    add_limit_arg(p, f"prompts per set (default {OutputsConfig.limit})",
                  default=OutputsConfig.limit)
    p.add_argument("--eval-limit", type=int, default=OutputsConfig.eval_limit,
                   help=f"held-out prompts per category (default {OutputsConfig.eval_limit})")


def resolve(args: argparse.Namespace) -> str:
    """`args.decision` (default stop) and its --check-prompts default filled in; MCSDError for an
    option given that the decision does not take, or one it needs that is not given."""
    decision = args.decision = args.decision or "stop"
    for dest, takes in TAKES.items():
        if decision not in takes and getattr(args, dest, None) not in (None, False):
            listed = " and ".join(filter(None, (", ".join(takes[:-1]), takes[-1])))
            raise MCSDError(f"{_OPTIONS[dest]} is an option of --decision {listed}, not of "
                            f"--decision {decision}")
    if args.check_prompts is None:
        args.check_prompts = CHECK_PROMPTS.get(decision, 0)
    needs = {"copy": ("cost_profile", "prompts"), "width": ("cost_profile", "prompts"),
             "budget": ("cost_profile",), "schedule": ("cost_profile", "runs")}
    for dest in needs.get(decision, ()):
        if getattr(args, dest) is None:
            raise MCSDError(f"--decision {decision} needs --{dest.replace('_', '-')}")
    return decision


def _given(args: argparse.Namespace, names) -> dict:
    """The options among `names` given on the command line (`resolve`d): the others are None
    (`_defer_defaults`) and left to their config's default."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _node_model(args: argparse.Namespace, *more: str) -> dict:
    """The TrainConfig fields that --decision stop and budget share, and `more`, as given."""
    given = _given(args, ("model", "seed", "val_frac", "test_frac", "max_epochs", "trajectory",
                          "features", "check_prompts", *more))
    if args.batch_size is not None:
        given["batch_sizes"] = parse_batch_sizes(args.batch_size, "--batch-size")
    return given


def stop_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of `mcsd train --decision stop`'s resolved arguments; MCSDError when one
    is invalid."""
    given = _node_model(args, "decision_us", "online")
    given["label"] = args.label or default_label(given.get("model", D.model))
    if args.aggregations is not None:
        given["aggregations"] = tuple(a.strip() for a in args.aggregations.split(",")
                                      if a.strip())
    if args.replay is not None:
        given["replay_mode"] = args.replay
    return TrainConfig(**given)


def schedule_config(args: argparse.Namespace) -> ScheduleConfig:
    """The ScheduleConfig of `mcsd train --decision schedule`'s resolved arguments; MCSDError
    when one is invalid."""
    if args.check_prompts:
        raise MCSDError("--decision schedule has no --check-prompts: serve the exported table "
                        "(`mcsd export`) in the engine and measure it there")
    given = _given(args, ("max_k", "test_frac", "seed"))
    if args.batch_size is not None:
        given["batch_sizes"] = parse_batch_sizes(args.batch_size, "--batch-size")
    return ScheduleConfig(args.out, tuple(args.runs or ()), args.cost_profile, **given)


def sts_config(args: argparse.Namespace) -> StsConfig:
    """The StsConfig of `mcsd train --decision sts`'s resolved arguments; MCSDError when one is
    invalid."""
    if args.cost_profile is not None:
        raise MCSDError("--decision sts takes no --cost-profile: the table prices nothing; our "
                        "budget reads it with one (survival-sts:PATH@PROFILE)")
    if args.check_prompts:
        raise MCSDError("--decision sts has no --check-prompts: the report is on held-out "
                        "prompts (--test-frac); decode with survival-sts:PATH@PROFILE in `mcsd "
                        "eval`")
    given = _given(args, ("from_shards", "gamma", "test_frac", "seed", "offsets"))
    return StsConfig(args.out, tuple(args.runs or ()), **given)


def budget_config(args: argparse.Namespace) -> BudgetConfig:
    """The BudgetConfig of `mcsd train --decision budget`'s resolved arguments (the node model
    trained on the hard label); MCSDError when one is invalid."""
    return BudgetConfig(args.out, tuple(args.runs or ()),
                        TrainConfig(label="hard", **_node_model(args)))


def outputs_config(args: argparse.Namespace) -> OutputsConfig:
    """The OutputsConfig of `mcsd train --decision copy|width`'s resolved arguments."""
    return OutputsConfig(**_given(args, [f.name for f in fields(OutputsConfig)]))


def copy_config(args: argparse.Namespace) -> CopyConfig:
    """The CopyConfig of `mcsd train --decision copy`'s resolved arguments; MCSDError when one
    is invalid."""
    return CopyConfig(args.out, outputs_config(args), **_given(args, _own_fields(CopyConfig)))


def width_config(args: argparse.Namespace) -> WidthConfig:
    """The WidthConfig of `mcsd train --decision width`'s resolved arguments; MCSDError when one
    is invalid."""
    return WidthConfig(args.out, outputs_config(args), **_given(args, _own_fields(WidthConfig)))


def _own_fields(config: type) -> list[str]:
    return [f.name for f in fields(config) if f.name not in ("out", "outputs")]


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.cli.args import apply_threads
    from train.decision import train
    from train.stop.trainer import bench, quiet_training

    decision = resolve(args)
    if decision == "stop" and not args.runs and args.bench_latency:
        return bench(args.out)
    apply_threads(args)
    if decision == "schedule":
        from mcsd_runtime.extras import require_toolkit
        from train.schedule.trainer import ScheduleTrainer, run_schedule

        require_toolkit("mcsd train --decision schedule", "pandas", "pyarrow")
        return run_schedule(ScheduleTrainer(schedule_config(args)), args.force)
    if decision == "sts":
        from train.sts.trainer import StsTrainer, run_sts

        config = sts_config(args)
        if config.runs:
            from mcsd_runtime.extras import require_toolkit

            require_toolkit("mcsd train --decision sts --runs", "pandas", "pyarrow")
        return run_sts(StsTrainer(config), args.force)
    trainer = _trainer(decision, args)
    if decision in ("copy", "width"):
        return train(trainer, args.force)
    with quiet_training():
        train(trainer, args.force)
    return bench(args.out) if args.bench_latency else 0


def _trainer(decision: str, args: argparse.Namespace):
    """The decision's trainer over its config, built from the resolved `args` (MCSDError for
    an invalid option, before any work)."""
    if decision == "copy":
        from train.copy.trainer import CopyTrainer

        return CopyTrainer(copy_config(args))
    if decision == "width":
        from train.width.trainer import WidthTrainer

        return WidthTrainer(width_config(args))
    from mcsd_runtime.extras import require_toolkit
    from mcsd_runtime.pricing.profile import CostProfile

    require_toolkit("mcsd train")
    if decision == "budget":
        from train.budget.trainer import BudgetTrainer

        return BudgetTrainer(budget_config(args), CostProfile.load(args.cost_profile))
    from train.stop.trainer import StopTrainer

    if not args.runs:
        raise MCSDError("--runs RUN_DIR is required (or --bench-latency with an existing --out)")
    config = stop_config(args)
    profile = CostProfile.load(args.cost_profile) if args.cost_profile else None
    return StopTrainer(args.out, config, profile, runs=args.runs, domains=args.domains or ())
