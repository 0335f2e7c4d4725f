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

Every decision needs a cost profile of the pair on this machine (`mcsd profile`) to price steps
(the stopper without one replays relative costs); each option below says which decisions take
it, and one that the decision does not take is refused. `mcsd train --decision D --help` shows
D's own documentation.

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
import json
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
    apply_threads,
)
from mcsd_runtime.constants import STOPPER_KINDS
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.extras import require_toolkit
from mcsd_runtime.prompts.chat import add_chat_arg
from train.config import LABEL_DOC, REPLAY_MODES, TRAJECTORIES, TrainConfig, default_label

D = TrainConfig  # the defaults, read off its fields
DECISIONS = ("stop", "copy", "width")
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
    **dict.fromkeys(("runs", "model", "label", "val_frac", "test_frac", "aggregations", "replay",
                     "trajectory", "features", "decision_us", "batch_size", "online",
                     "max_epochs", "domains", "bench_latency"), ("stop",)),
    "check_prompts": ("stop", "copy"),
    **dict.fromkeys(("target", "draft", "device", "dtype", "attention", "prompts",
                     "eval_prompts", "limit", "eval_limit", "max_new_tokens", "eos", "traces",
                     "force", "chat", "k_config"), OUTPUTS),
    **dict.fromkeys(("max_copy", "min_ngram", "temperature", "folds"), ("copy",)),
}
PER_DECISION = {"check_prompts": {"stop": 8, "copy": 0}, "k_config": {"copy": None, "width": "4"}}
_DEFAULTS: dict[str, object] = {}  # dest -> the option's own default (`add_args` records it)
_OPTIONS: dict[str, str] = {}  # dest -> its option string


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a learned decision: the depth stopper (LightGBM or "
                                     "MLP on collected runs), the copy length or the width",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       add_help=False)
    add_args(p)
    p.set_defaults(func=run)
    for old, decision in (("train-lookup", "copy"), ("train-width", "width")):
        # renamed: hidden from the command list, forwarded with a note (docs/cli.md)
        alias = sub.add_parser(old, description=__doc__, add_help=False,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        add_args(alias)
        alias.set_defaults(func=run, decision=decision, renamed=old)


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
    if decision == "copy":
        from train import copy_cli, copy_length

        return f"{copy_cli.__doc__}\n{copy_length.__doc__}"
    from mcsd_runtime.stop import width as runtime_width
    from train import width, width_cli

    return f"{width_cli.__doc__}\n{runtime_width.__doc__}\n{width.__doc__}"


def add_args(p: argparse.ArgumentParser) -> None:
    """The options of every decision (a parser made with add_help=False: the help is
    decision-aware)."""
    p.add_argument("-h", "--help", action=_DecisionHelp,
                   help="show this help (after --decision D: D's own documentation) and exit")
    g = p.add_argument_group("every decision")
    g.add_argument("--decision", choices=DECISIONS, default=None,
                   help="the learned decision: stop (default), copy or width")
    add_out_arg(g, "artifact folder to write", required=True)
    add_cost_profile_arg(g, "forward-latency profile JSON of this pair on this machine (`mcsd "
                            "profile`) that prices replayed steps; copy and width require one, "
                            "timing forwards of up to --max-copy + 1 (copy) or k + 1 (width) "
                            "tokens", renamed=("--profile",))
    add_seed_arg(g, "split and model seed; for copy also of sampled outputs and of the check's "
                    "decoding (default %(default)s)", default=D.seed)
    g.add_argument("--check-prompts", type=int, default=None, metavar="N",
                   help="stop and copy: then decode held-out prompts end to end and report the "
                        "replay's error against reality; stop: N test prompts with every static "
                        "depth and the stopper (needs a measured --cost-profile and the "
                        "collection's pair; default 8); copy: N held-out prompts per category "
                        "of --eval-prompts with ar, static copy lengths and the policy (written "
                        "to check.json; default 0); 0 skips")
    add_renamed(g, "--check", "--check-prompts", "check_prompts", type=int)
    add_threads_arg(g)

    g = p.add_argument_group("--decision stop: a stopper trained on collected runs")
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
                   help="MLP epochs cap (default: train.config.MLP_EPOCHS)")
    g.add_argument("--domains", nargs="+", type=Path, default=[], metavar="RUN_DIR",
                   help="dense collections of other domains (never trained on): report the "
                        "stopper's calibration (ECE) and replayed speed on each against the "
                        "deploy static, the domain's best static and the tuned heuristic "
                        "(metrics.json `domains`, calibration_domains.png)")
    g.add_argument("--bench-latency", action="store_true",
                   help="measure the decision latency of the artifact in --out (after training, "
                        "or alone without --runs)")

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
    add_force_arg(g, "replace an existing --out folder")
    add_chat_arg(g)

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
    if decision != "stop":
        for option, value in (("--cost-profile", args.cost_profile), ("--prompts", args.prompts)):
            if value is None:
                raise MCSDError(f"--decision {decision} needs {option}")
    return decision


def run(args: argparse.Namespace) -> int:
    import sys

    if getattr(args, "renamed", None):
        print(f"mcsd {args.renamed}: renamed: use mcsd train --decision {args.decision} (the old "
              f"command goes in a later release)", file=sys.stderr)
    decision = resolve(args)
    if decision == "copy":
        from train.copy_cli import run as run_copy

        return run_copy(args)
    if decision == "width":
        from train.width_cli import run as run_width

        return run_width(args)
    return run_stop(args)


def run_stop(args: argparse.Namespace) -> int:
    import warnings

    require_toolkit("mcsd train")
    apply_threads(args)
    if not args.runs:
        if not args.bench_latency:
            raise MCSDError("--runs RUN_DIR is required (or --bench-latency with an "
                            "existing --out)")
        return _bench(args.out)
    from mcsd_runtime.costmodel.profile import CostProfile
    from train.data import load_runs
    from train.pipeline import train_stopper

    config = config_from_args(args)
    profile = CostProfile.load(args.cost_profile) if args.cost_profile else None
    df, manifests = load_runs(args.runs, hidden=config.hidden)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _quiet_lightning()
        summary = train_stopper(df, manifests, args.out, config, profile=profile)
    if args.domains:
        _check_domains(args.domains, args.out, summary, profile)
    print(f"stopper written to {args.out} (decision latency "
          f"{summary['latency']['median_us']:.0f} µs at frontier 16)")
    if args.bench_latency:
        _bench(args.out)
    return 0


def _check_domains(run_dirs: list[Path], out: Path, summary: dict, profile) -> None:
    """Add the stopper's figures on other domains to metrics.json, with their reliability plot."""
    import json

    from mcsd_runtime.costmodel.profile import CostProfile
    from mcsd_runtime.stop.learned import load_stopper
    from train import report
    from train.domain_check import check_domains, format_domains

    domains = check_domains(run_dirs, load_stopper(out), summary,
                            profile or CostProfile.relative())
    print(format_domains(domains))
    summary["domains"] = domains
    (out / "metrics.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    curves = {"training (test prompts)": summary["calibration"]}
    curves |= {f"{name} (ECE {d['ece']:.3f})": d["calibration"] for name, d in domains.items()}
    report.plot_calibration(curves, "reliability of node scores by domain",
                            out / "calibration_domains.png")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of parsed `mcsd train` arguments of --decision stop (MCSDError when one
    is invalid)."""
    resolve(args)
    from mcsd_runtime.cli.args import parse_batch_sizes

    aggs = (None if args.aggregations is None
            else tuple(a.strip() for a in args.aggregations.split(",") if a.strip()))
    return TrainConfig(model=args.model, label=args.label or default_label(args.model),
                       seed=args.seed, val_frac=args.val_frac, test_frac=args.test_frac,
                       aggregations=aggs, replay_mode=args.replay, max_epochs=args.max_epochs,
                       trajectory=args.trajectory, decision_us=args.decision_us,
                       check_prompts=args.check_prompts, online=args.online,
                       features=args.features,
                       batch_sizes=parse_batch_sizes(args.batch_size, "--batch-size"))


def _quiet_lightning() -> None:
    import logging

    for name in ("lightning.pytorch", "lightning.fabric", "lightning",
                 "lightning.pytorch.utilities.rank_zero"):  # hardware lines and tips
        logging.getLogger(name).setLevel(logging.ERROR)


def _bench(out: Path) -> int:
    from mcsd_runtime.costmodel.decision_cost import bench_latency
    from mcsd_runtime.stop.learned import load_stopper

    stopper = load_stopper(out)
    size = stopper.spec.hidden_size if stopper.needs_hidden else None
    rows = [bench_latency(stopper, n, hidden_size=size) for n in (4, 16, 64)]
    print(json.dumps({"artifact": str(out), "kind": stopper.kind,
                      "aggregation": stopper.aggregation, "latency": rows}, indent=1))
    return 0
