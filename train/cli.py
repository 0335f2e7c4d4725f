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

Every decision is trained by the same stages (`train.decision`): prepare the data, fit the
model, choose its settings by replayed throughput, write the artifact folder (`decision.json`
last, into a staging folder that replaces --out once complete), and with --check-prompts decode
held-out prompts end to end beside the replay (check.json). Every decision needs a cost profile
of the pair on this machine (`mcsd profile`) to price steps (the stopper without one replays
relative costs); each option below says which decisions take it, and one that the decision
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
    add_renamed,
    add_runs_arg,
    add_seed_arg,
    add_temperature_arg,
    add_threads_arg,
)
from mcsd_runtime.constants import STOPPER_KINDS
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts.chat import add_chat_arg
from replay.data import REPLAY_MODES
from train.stop.config import LABEL_DOC, TRAJECTORIES, TrainConfig, default_label

D = TrainConfig  # the defaults, read off its fields
DECISIONS = ("stop", "copy", "width", "budget")
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
# the options some decisions do not take: dest -> the decisions that take it (every other option
# is every decision's); such an option's parser default is None, resolved per decision by `resolve`
OUTPUTS = ("copy", "width")  # trained on the target's own outputs of --prompts
TAKES = {
    **dict.fromkeys(("runs", "model", "val_frac", "test_frac", "trajectory", "features",
                     "batch_size", "max_epochs"), ("stop", "budget")),
    **dict.fromkeys(("label", "aggregations", "replay", "decision_us", "online", "domains",
                     "bench_latency"), ("stop",)),
    **dict.fromkeys(("target", "draft", "device", "dtype", "attention", "prompts",
                     "eval_prompts", "limit", "eval_limit", "max_new_tokens", "eos", "traces",
                     "chat", "k_config"), OUTPUTS),
    **dict.fromkeys(("max_copy", "min_ngram", "temperature", "folds"), ("copy",)),
}
PER_DECISION = {"k_config": {"copy": None, "width": "4"}}
CHECK_PROMPTS = {"stop": 8}  # --check-prompts by default (the others: 0)
RENAMED = {"train-lookup": "copy", "train-width": "width"}  # removed commands (docs/cli.md)
_DEFAULTS: dict[str, object] = {}  # dest -> the option's own default (`add_args` records it)
_OPTIONS: dict[str, str] = {}  # dest -> its option string


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a learned decision: the depth stopper (LightGBM or "
                                     "MLP on collected runs), the copy length or the width",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       add_help=False)
    add_args(p)
    p.set_defaults(func=run)
    for old, decision in RENAMED.items():  # hidden: they only say what replaced them
        gone = sub.add_parser(old, add_help=False, prefix_chars="\0")  # every word a value
        gone.add_argument("rest", nargs="*")
        gone.set_defaults(func=_removed, decision=decision, removed=old)


def _removed(args: argparse.Namespace) -> int:
    raise MCSDError(f"`mcsd {args.removed}` was removed: use `mcsd train --decision "
                    f"{args.decision}` with the same options (docs/cli.md)")


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
        from mcsd_runtime.stop import verify_budget
        from train.budget import trainer

        return f"{trainer.__doc__}\n{verify_budget.__doc__}"
    if decision == "copy":
        from replay import copy as replay_copy
        from train import copy
        from train.copy import fit

        return f"{copy.__doc__}\n{fit.__doc__}\n{replay_copy.__doc__}"
    from mcsd_runtime.stop import width as runtime_width
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
    _defer_defaults(p)


def _add_common_args(p: argparse.ArgumentParser) -> None:
    """-h/--help and the group of options every decision takes."""
    p.add_argument("-h", "--help", action=_DecisionHelp,
                   help="show this help (after --decision D: D's own documentation) and exit")
    g = p.add_argument_group("every decision")
    g.add_argument("--decision", choices=DECISIONS, default=None,
                   help="the learned decision: stop (default), copy, width or budget (the "
                        "verification budget of a ragged batch)")
    add_out_arg(g, "artifact folder to write", required=True)
    add_force_arg(g, "replace an existing --out folder")
    add_cost_profile_arg(g, "forward-latency profile JSON of this pair on this machine (`mcsd "
                            "profile`) that prices replayed steps; copy and width require one, "
                            "timing forwards of up to --max-copy + 1 (copy) or k + 1 (width) "
                            "tokens", renamed=("--profile",))
    add_seed_arg(g, "split and model seed; for copy also of sampled outputs and of the check's "
                    "decoding (default %(default)s)", default=D.seed)
    g.add_argument("--check-prompts", type=int, default=None, metavar="N",
                   help="then decode held-out prompts end to end and report the replay's error "
                        "against reality (check.json); stop: N test prompts with every static "
                        "depth and the stopper (needs a measured --cost-profile and the "
                        "collection's pair; default 8); copy and width: N held-out prompts per "
                        "category of --eval-prompts with ar, the statics and the learned "
                        "decision (default 0); 0 skips")
    add_renamed(g, "--check", "--check-prompts", "check_prompts", type=int)
    add_threads_arg(g)


def _add_stop_args(p: argparse.ArgumentParser) -> None:
    """The group of --decision stop: a stopper trained on collected runs."""
    g = p.add_argument_group("--decision stop: a stopper trained on collected runs")
    _add_stop_model_args(g)
    _add_stop_replay_args(g)


def _add_stop_model_args(g: argparse._ArgumentGroup) -> None:
    """--decision stop's data, model, label, splits, replay and features."""
    add_runs_arg(g, "collection run folders (from `mcsd collect`, full-depth; --dense for exact "
                    "replay)", renamed=("--data",))
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
                        "mcsd_runtime.stop.learned.AGGREGATIONS defines)")
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
                        "mcsd_runtime.stop.features.DECISION_FEATURES")


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
                        "(mcsd_runtime.stop.online), kept where it replays faster on validation "
                        "prompts (stopper.json `online_strength`; off by default: at parity end "
                        "to end on the real pair)")
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
                              "(default 4: decode on a --k-config starting with it)")
    add_renamed(g, "--beside-draft", "--k-config", "k_config")
    add_renamed(g, "--k", "--k-config", "k_config")
    add_max_new_tokens_arg(g, 64, "output tokens per prompt (default 64)")
    add_eos_arg(g, "ignore", renamed=("--stop-at-eos",),
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
    g.add_argument("--max-copy", type=int, default=15,
                   help="most tokens copied in a step (default 15)")
    g.add_argument("--min-ngram", type=int, default=None,
                   help="shortest match considered (default 1, the policy deciding which short "
                        "matches pay; 2 with --k-config, where a copy after a one-token match "
                        "rarely beats the draft)")
    add_temperature_arg(g, "the temperature the policy will decode at: outputs are sampled at it "
                           "(default 0: greedy)")
    g.add_argument("--folds", type=int, default=5,
                   help="also replay the training mix out of fold: a policy fitted on the other "
                        "folds decides each output (default 5 folds; 0: skip)")


def _defer_defaults(p: argparse.ArgumentParser) -> None:
    """Record the own default and option string of every option some decisions do not take
    (`TAKES`), and set its parser default to None for `resolve` to fill in per decision."""
    for action in p._actions:
        if action.dest in TAKES and action.help is not argparse.SUPPRESS:  # not an old spelling
            _DEFAULTS.setdefault(action.dest, action.default)
            _OPTIONS.setdefault(action.dest, action.option_strings[0])
            action.default = None


def add_prompt_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--prompts, --eval-prompts, --limit and --eval-limit (`load_prompt_domains` reads them)."""
    add_prompts_arg(p, "training prompt sets, comma-separated (e.g. inst-explain,inst-qa); "
                       "required")
    p.add_argument("--eval-prompts", default=None,
                   help="held-out prompt sets to report on, split by category (e.g. "
                        "inst-mix-eval); never trained on")
    add_limit_arg(p, "prompts per set (default 40)", default=40)
    p.add_argument("--eval-limit", type=int, default=10,
                   help="held-out prompts per category (default 10)")


def resolve(args: argparse.Namespace) -> str:
    """Fill in the options of `args.decision` (default stop) that were not given, with that
    decision's defaults; MCSDError for an option given that the decision does not take."""
    decision = args.decision = args.decision or "stop"
    for dest, takes in TAKES.items():
        value = getattr(args, dest, None)
        if decision not in takes:
            if value not in (None, False):
                raise MCSDError(f"{_OPTIONS[dest]} is an option of --decision "
                                f"{' and '.join(takes)}, not of --decision {decision}")
        elif value is None:
            setattr(args, dest, PER_DECISION.get(dest, {}).get(decision, _DEFAULTS[dest]))
    if args.check_prompts is None:
        args.check_prompts = CHECK_PROMPTS.get(decision, 0)
    needs = {"copy": ("cost_profile", "prompts"), "width": ("cost_profile", "prompts"),
             "budget": ("cost_profile",)}
    for dest in needs.get(decision, ()):
        if getattr(args, dest) is None:
            raise MCSDError(f"--decision {decision} needs --{dest.replace('_', '-')}")
    if decision == "budget" and args.check_prompts:
        raise MCSDError("--decision budget has no --check-prompts: measure it end to end with "
                        "`mcsd eval --methods budget:PATH --batch-layout ragged --batch-depth "
                        "row --batch-size ...`")
    return decision


def run(args: argparse.Namespace) -> int:
    from train.decision import train

    decision = resolve(args)
    if decision == "copy":
        from train.copy.trainer import CopyTrainer

        return train(CopyTrainer(args), args.force)
    if decision == "width":
        from train.width.trainer import WidthTrainer

        return train(WidthTrainer(args), args.force)
    if decision == "budget":
        from train.budget.trainer import from_args as budget_from_args
        from train.stop.trainer import quiet_training

        trainer = budget_from_args(args)
        with quiet_training():
            return train(trainer, args.force)
    from train.stop.trainer import bench, from_args, quiet_training

    if not args.runs and args.bench_latency:
        return bench(args.out)
    trainer = from_args(args)
    with quiet_training():
        train(trainer, args.force)
    return bench(args.out) if args.bench_latency else 0
