"""`mcsd train`: fit a stopper's decision model on collected runs, choose its aggregation and
threshold by replayed throughput on validation prompts, and write the artifact folder
(stopper.json, the model, metrics.json, replay_curve.json/png, calibration.png and, except for
mlp-hidden, importance.png: LightGBM's gain and SHAP, an MLP's permutation importance).

Prompts are split train/validation/test (grouped: no prompt in two splits, seeded). Labels: a
frontier node at depth d is positive when it is on the accepted path and the path continues past
it (`hard`), or the product of soft acceptance probabilities min(1, p/q) along that path
(`soft`). Without --cost-profile, throughput is relative (a draft forward costs 0.1 of a target
forward); measure one with `mcsd profile`.

    mcsd collect --target toy --prompts toy-code-collect --dense --k-config 1,1,1,1,1,1,1,1 \\
        --max-new-tokens 64 --out data/runs/dense
    mcsd profile --target toy --k-config 1,1,1,1,1,1,1,1 --out data/runs/cost.json
    mcsd train --data data/runs/dense --model lightgbm --cost-profile data/runs/cost.json \\
        --out data/runs/stoppers/lightgbm
    mcsd eval --target toy --methods ar,static:4,heuristic,stopper:data/runs/stoppers/lightgbm
    mcsd train --bench-latency --out data/runs/stoppers/lightgbm  # decision latency
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mcsd_runtime.cli.args import add_threads_arg, apply_threads
from mcsd_runtime.constants import STOPPER_KINDS
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.extras import require_toolkit
from train.config import LABEL_DOC, REPLAY_MODES, TRAJECTORIES, TrainConfig, default_label

D = TrainConfig  # the defaults, read off its fields


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a learned stopper (LightGBM or MLP) on collected runs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(p)
    p.set_defaults(func=run)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", nargs="+", type=Path, metavar="RUN_DIR",
                   help="collection run folders (from `mcsd collect`, full-depth; --dense for "
                        "exact replay)")
    p.add_argument("--model", default=D.model, choices=STOPPER_KINDS,
                   help="lightgbm, mlp on the scalar features, or mlp-hidden (the paper's "
                        "hidden->512->256->1 model on draft hidden states; default %(default)s)")
    p.add_argument("--label", default=None, choices=list(LABEL_DOC),
                   help=f"training target (default: {D.label}; {default_label('mlp-hidden')} "
                        f"for mlp-hidden, as in the paper)")
    p.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    p.add_argument("--cost-profile", type=Path, default=None,
                   help="forward-latency profile JSON (`mcsd profile`) for replayed throughput")
    p.add_argument("--seed", type=int, default=D.seed,
                   help="split and model seed (default %(default)s)")
    p.add_argument("--val-frac", type=float, default=D.val_frac,
                   help="validation prompts (default %(default)s)")
    p.add_argument("--test-frac", type=float, default=D.test_frac,
                   help="test prompts (default %(default)s)")
    p.add_argument("--aggregations", default=D.aggregations,
                   help="frontier aggregations to try, comma-separated (default: all that "
                        "mcsd_runtime.stop.learned.AGGREGATIONS defines)")
    p.add_argument("--replay", default=D.replay_mode, choices=REPLAY_MODES,
                   help="exact walk (dense greedy runs) or per-step estimate (default: "
                        "%(default)s)")
    p.add_argument("--trajectory", default=D.trajectory, choices=TRAJECTORIES,
                   help="trajectory features of dense runs for training: walk recomputes them "
                        "along a full-depth walk (the stored ones leak the label), stored keeps "
                        "them (default %(default)s)")
    p.add_argument("--features", default=D.features,
                   help="what the model reads: all (default), node (the draft's features "
                        "only, not the run's history: tokens generated, previous and recent "
                        "acceptance), or comma-separated names of "
                        "mcsd_runtime.stop.features.DECISION_FEATURES")
    p.add_argument("--decision-us", type=float, default=D.decision_us,
                   help="seconds-profile replay charges this many µs per stopper decision "
                        "(default: benchmarked with the frontier's features computed over the "
                        "target's vocabulary, as in the decoder, where the pair is local)")
    p.add_argument("--check-prompts", type=int, default=8,  # the CLI checks; TrainConfig's 0 skips
                   help="test prompts decoded end to end with every static depth and the trained "
                        "stopper, to report the replay's error against reality (needs a measured "
                        "--cost-profile and the collection's pair; 0 skips; default %(default)s)")
    p.add_argument("--batch-size", default=",".join(map(str, D.batch_sizes)),
                   metavar="B[,B...]",
                   help="batch sizes to choose the stopper's settings for by batched replay "
                        "(stopper.json's `batch` table; the decoder at B rows uses the entry of "
                        "the largest size <= B); sizes above 1 need a --cost-profile measured "
                        "at them (`mcsd profile --batch-sizes`; default %(default)s)")
    p.add_argument("--online", action="store_true",
                   help="also try per-sequence recalibration from the acceptances seen "
                        "(mcsd_runtime.stop.online), kept where it replays faster on validation "
                        "prompts (stopper.json `online_strength`; off by default: at parity end "
                        "to end on the real pair)")
    p.add_argument("--max-epochs", type=int, default=D.max_epochs,
                   help="MLP epochs cap (default: train.config.MLP_EPOCHS)")
    p.add_argument("--domains", nargs="+", type=Path, default=[], metavar="RUN_DIR",
                   help="dense collections of other domains (never trained on): report the "
                        "stopper's calibration (ECE) and replayed speed on each against the "
                        "deploy static, the domain's best static and the tuned heuristic "
                        "(metrics.json `domains`, calibration_domains.png)")
    add_threads_arg(p)
    p.add_argument("--bench-latency", action="store_true",
                   help="measure the decision latency of the artifact in --out (after training, "
                        "or alone without --data)")


def run(args: argparse.Namespace) -> int:
    import warnings

    require_toolkit("mcsd train")
    apply_threads(args)
    if not args.data:
        if not args.bench_latency:
            raise MCSDError("--data RUN_DIR is required (or --bench-latency with an "
                            "existing --out)")
        return _bench(args.out)
    from mcsd_runtime.costmodel.profile import CostProfile
    from train.data import load_runs
    from train.pipeline import train_stopper

    config = config_from_args(args)
    profile = CostProfile.load(args.cost_profile) if args.cost_profile else None
    df, manifests = load_runs(args.data, hidden=config.hidden)
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
    """The TrainConfig of parsed `mcsd train` arguments (MCSDError when one is invalid)."""
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
