"""`mcsd train --decision stop`: the depth stopper (and its skip gate: drafting at all), trained
on collected runs by the stages of `train.stop.pipeline`, run as `train.decision` runs every
decision's; `train_stopper` is the same in a Python call, writing into a folder in place."""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.progress import working
from train import node_model as N
from train.decision import run_stages
from train.stop import pipeline as P
from train.stop.config import TrainConfig


@dataclass
class Runs:
    """The collected rows and their runs' manifests, prepared (`node_model.prepare`), and when
    the run started (time.perf_counter(), for metrics.json's elapsed_s)."""

    prep: N.Prepared
    manifests: list[dict]
    started: float


class StopTrainer:
    """`train.decision.Trainer` of the depth stopper, `Trainer[Runs, node_model.Fit,
    pipeline.Choice, dict]` (write gives the summary, metrics.json): collected rows (`df` and
    `manifests`, or the run folders `runs`) in, a stopper folder out. `domains`: run folders of
    other domains replayed by the check (`train.stop.domains`)."""

    decision = "stop"

    def __init__(self, out: str | Path, config: TrainConfig, profile: CostProfile | None = None,
                 log: N.Log = print, runs: list[Path] | None = None,
                 df: pd.DataFrame | None = None, manifests: list[dict] | None = None,
                 domains: Sequence[Path] = ()) -> None:
        P.check_batch_sizes(config, profile)
        self.out, self.config, self.profile, self.log = Path(out), config, profile, log
        self.runs, self.df, self.manifests, self.domains = runs, df, manifests, domains

    def decode(self) -> str:
        return f"mcsd eval --methods stopper:{self.out}"

    def prepare(self) -> Runs:
        from replay.runs import load_runs

        df, manifests = self.df, self.manifests
        if df is None:
            assert self.runs is not None, "a StopTrainer is given the rows or their runs"
            df, manifests = load_runs(self.runs, hidden=self.config.hidden)
        started = time.perf_counter()
        return Runs(N.prepare(df, manifests or [], self.config, self.log), manifests or [],
                    started)

    def fit(self, data: Runs, folder: Path) -> N.Fit:
        return N.fit(data.prep, self.config, folder, self.log)

    def choose(self, data: Runs, fitted: N.Fit) -> P.Choice:
        with working(f"choosing the settings by replaying {len(data.prep.df)} collected rows"):
            return P.choose(data.prep, data.manifests, fitted.folder, self.config,
                            self.profile, self.log)

    def write(self, data: Runs, fitted: N.Fit, chosen: P.Choice, folder: Path) -> dict:
        """The artifact's files; returns the summary (metrics.json)."""
        summary = P.write(data.prep, fitted, chosen, data.manifests, folder, self.config,
                          self.log, data.started)
        self.log(f"decision latency {summary['latency']['median_us']:.0f} µs at frontier 16")
        return summary

    def check(self, data: Runs, chosen: P.Choice, summary: dict) -> dict | None:
        """The end-to-end check (config.check_prompts, with a measured profile) and the other
        domains' replay (`domains`), added to metrics.json (`with_checks`); None when neither
        ran."""
        from mcsd_runtime.decisions.learned import load_stopper

        c = self.config
        ran: dict[str, Any] = {}
        if c.check_prompts and chosen.measured and not c.hidden:
            ran |= P.replay_checks(chosen, load_stopper(self.out), data.manifests, c, self.log)
        if self.domains:
            ran["domains"] = self._check_domains(summary)
        if ran:
            N.write_json(self.out / "metrics.json", with_checks(summary, ran))
        return ran or None

    def _check_domains(self, summary: dict) -> dict:
        """The stopper's figures on other domains (beside those of the training `summary`),
        with their reliability plot."""
        from mcsd_runtime.decisions.learned import load_stopper
        from train.stop import report
        from train.stop.domains import check_domains, format_domains

        domains = check_domains(self.domains, load_stopper(self.out), summary,
                                self.profile or CostProfile.relative())
        self.log(format_domains(domains))
        curves = {"training (test prompts)": summary["calibration"]}
        curves |= {f"{name} (ECE {d['ece']:.3f})": d["calibration"]
                   for name, d in domains.items()}
        report.plot_calibration(curves, "reliability of node scores by domain",
                                self.out / "calibration_domains.png")
        return domains


def with_checks(summary: dict, ran: dict) -> dict:
    """The summary (metrics.json) with the checks that `StopTrainer.check` ran: the end-to-end
    check at batch size 1 (`replay_check`) and at each larger one (in its `batches` entry), and
    the other domains (`domains`)."""
    summary = dict(summary)
    if "replay_check" in ran:
        if "batches" in summary:  # in place: its entries keep their order
            summary["batches"] = {b: v | {"replay_check": ran["batches"][b]}
                                  for b, v in summary["batches"].items()}
        summary["replay_check"] = ran["replay_check"]
    if "domains" in ran:
        summary["domains"] = ran["domains"]
    return summary


def train_stopper(df: pd.DataFrame, manifests: list[dict], out: str | Path,
                  config: TrainConfig | None = None, *, profile: CostProfile | None = None,
                  log: N.Log = print, **options: Any) -> dict:
    """Train one stopper into the folder `out` (in place: other files there stay), with its
    end-to-end check when `config.check_prompts`; returns the summary (also metrics.json).

    `config`, or TrainConfig's fields as keywords (`model="mlp", label="soft"`: they override
    `config`'s). `profile`: a measured cost profile (seconds); None replays relative costs."""
    config = replace(config, **options) if config else TrainConfig(**options)
    trainer = StopTrainer(out, config, profile, log, df=df, manifests=manifests)
    trainer.out.mkdir(parents=True, exist_ok=True)
    data, chosen, summary = run_stages(trainer, trainer.out)
    return with_checks(summary, trainer.check(data, chosen, summary) or {})


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
    from mcsd_runtime.benchmarks.decision_cost import bench_latency
    from mcsd_runtime.decisions.learned import load_stopper

    stopper = load_stopper(out)
    size = stopper.spec.hidden_size if stopper.needs_hidden else None
    rows = [bench_latency(stopper, n, hidden_size=size) for n in (4, 16, 64)]
    print(json.dumps({"artifact": str(out), "kind": stopper.kind,
                      "aggregation": stopper.aggregation, "latency": rows}, indent=1))
    return 0
