"""`mcsd train --decision stop`: the depth stopper (and its skip gate: drafting at all), trained
on collected runs by the stages of `train.stop.pipeline`, run as `train.decision` runs every
decision's; `train_stopper` is the same in a Python call, writing into a folder in place."""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from train.decision import run_stages
from train.stop import pipeline as P
from train.stop.config import TrainConfig, default_label


@dataclass
class Runs:
    """The collected rows and their runs' manifests, prepared (`pipeline.prepare`)."""

    prep: P.Prepared
    manifests: list[dict]


class StopTrainer:
    """`train.decision.Trainer` of the depth stopper: collected rows (`df` and `manifests`, or
    the run folders `runs`) in, a stopper folder out. `domains`: run folders of other domains
    replayed by the check (`train.stop.domains`)."""

    decision = "stop"

    def __init__(self, out: str | Path, config: TrainConfig, profile: CostProfile | None = None,
                 log: P.Log = print, runs: list[Path] | None = None,
                 df: pd.DataFrame | None = None, manifests: list[dict] | None = None,
                 domains: list[Path] | tuple = ()) -> None:
        P.check_batch_sizes(config, profile)
        self.out, self.config, self.profile, self.log = Path(out), config, profile, log
        self.runs, self.df, self.manifests, self.domains = runs, df, manifests, domains
        self.summary: dict = {}

    def prepare(self) -> Runs:
        from replay.runs import load_runs

        df, manifests = self.df, self.manifests
        if df is None:
            df, manifests = load_runs(self.runs, hidden=self.config.hidden)
        self.started = time.perf_counter()
        return Runs(P.prepare(df, manifests or [], self.config, self.log), manifests or [])

    def fit(self, data: Runs, folder: Path) -> P.Fit:
        self.folder = folder
        return P.fit(data.prep, self.config, folder, self.log)

    def choose(self, data: Runs, fitted: P.Fit) -> P.Choice:
        return P.choose(data.prep, data.manifests, self.folder, self.config, self.profile,
                        self.log)

    def write(self, data: Runs, fitted: P.Fit, chosen: P.Choice, folder: Path) -> str:
        self.summary = P.write(data.prep, fitted, chosen, data.manifests, folder, self.config,
                               self.log, self.started)
        self.log(f"decision latency {self.summary['latency']['median_us']:.0f} µs at frontier 16")
        return f"mcsd eval --methods stopper:{self.out}"

    def check(self, data: Runs, chosen: P.Choice) -> dict | None:
        """The end-to-end check (config.check_prompts, with a measured profile) and the other
        domains' replay (`domains`), into metrics.json; None when neither ran."""
        from mcsd_runtime.stop.learned import load_stopper

        c, summary = self.config, self.summary
        ran = {}
        if c.check_prompts and chosen.measured and not c.hidden:
            P.replay_checks(chosen, load_stopper(self.out), data.manifests, c, summary, self.log)
            ran["replay_check"] = summary["replay_check"]
            ran["batches"] = {b: v["replay_check"] for b, v in summary.get("batches", {}).items()
                              if "replay_check" in v}
        if self.domains:
            ran["domains"] = self._check_domains()
        if ran:
            P.write_json(self.out / "metrics.json", summary)
        return ran or None

    def _check_domains(self) -> dict:
        """The stopper's figures on other domains, into the summary, with their reliability
        plot."""
        from mcsd_runtime.stop.learned import load_stopper
        from train.stop import report
        from train.stop.domains import check_domains, format_domains

        summary = self.summary
        domains = check_domains(self.domains, load_stopper(self.out), summary,
                                self.profile or CostProfile.relative())
        self.log(format_domains(domains))
        summary["domains"] = domains
        curves = {"training (test prompts)": summary["calibration"]}
        curves |= {f"{name} (ECE {d['ece']:.3f})": d["calibration"]
                   for name, d in domains.items()}
        report.plot_calibration(curves, "reliability of node scores by domain",
                                self.out / "calibration_domains.png")
        return domains


def train_stopper(df: pd.DataFrame, manifests: list[dict], out: str | Path,
                  config: TrainConfig | None = None, *, profile: CostProfile | None = None,
                  log: P.Log = print, **options: Any) -> dict:
    """Train one stopper into the folder `out` (in place: other files there stay), with its
    end-to-end check when `config.check_prompts`; returns the summary (also metrics.json).

    `config`, or TrainConfig's fields as keywords (`model="mlp", label="soft"`: they override
    `config`'s). `profile`: a measured cost profile (seconds); None replays relative costs."""
    config = replace(config, **options) if config else TrainConfig(**options)
    trainer = StopTrainer(out, config, profile, log, df=df, manifests=manifests)
    trainer.out.mkdir(parents=True, exist_ok=True)
    data, chosen, _ = run_stages(trainer, trainer.out)
    trainer.check(data, chosen)
    return trainer.summary


def config_from_args(args) -> TrainConfig:
    """The TrainConfig of parsed `mcsd train --decision stop` arguments, resolved
    (`train.cli.resolve`); MCSDError when one is invalid."""
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


def from_args(args) -> StopTrainer:
    """The trainer of parsed `mcsd train --decision stop` arguments (MCSDError when one is
    invalid)."""
    from mcsd_runtime.cli.args import apply_threads
    from mcsd_runtime.extras import require_toolkit

    require_toolkit("mcsd train")
    apply_threads(args)
    if not args.runs:
        raise MCSDError("--runs RUN_DIR is required (or --bench-latency with an existing --out)")
    profile = CostProfile.load(args.cost_profile) if args.cost_profile else None
    return StopTrainer(args.out, config_from_args(args), profile, runs=args.runs,
                       domains=args.domains)


@contextlib.contextmanager
def quiet_training():
    """Lightning's hardware lines and tips and library warnings off, for a while."""
    import logging

    for name in ("lightning.pytorch", "lightning.fabric", "lightning",
                 "lightning.pytorch.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def bench(out: Path) -> int:
    """Print the decision latency of the stopper in `out` at frontiers of 4, 16 and 64 nodes."""
    from mcsd_runtime.costmodel.decision_cost import bench_latency
    from mcsd_runtime.stop.learned import load_stopper

    stopper = load_stopper(out)
    size = stopper.spec.hidden_size if stopper.needs_hidden else None
    rows = [bench_latency(stopper, n, hidden_size=size) for n in (4, 16, 64)]
    print(json.dumps({"artifact": str(out), "kind": stopper.kind,
                      "aggregation": stopper.aggregation, "latency": rows}, indent=1))
    return 0
