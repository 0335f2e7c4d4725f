"""`mcsd train --decision sts`: a per-position temperature table (DSpark's sequential temperature
scaling, `mcsd_runtime.decisions.sts`), through the stages every decision runs
(`train.decision`).

- **prepare**: the samples, one per drafting step: the draft's chain in collected runs (--runs:
  `confidence_logit` of each drafted token's draft probability), or the confidence head's
  logits in DSpark's captured shards (--from-shards); and the held-out split, by prompt (shards:
  by sample; seeded, --test-frac): `train.sts.chains`;
- **fit**: each position's temperature on the samples not held out, against the survival;
- **choose**: nothing to tune (the grid search is the fit); the report, on the held-out
  samples: per position, its samples, T and the ECE, Brier score and AUROC of the survival
  before (T = 1) and after, and whether the ECE halved at every position (printed);
- **write**: `report.json`, `report.md`, and last `sts.json` (the table both engines read),
  into a staging folder that replaces --out once complete (`run_sts`; no `decision.json`: the
  table is read with a cost profile, `survival-sts:PATH@PROFILE`, or by an engine, and
  `sts.json` marks the folder complete).

A table fitted on our collections calibrates our budget (`survival-sts:PATH@PROFILE`); one
fitted on an engine's shards calibrates that engine (SGLang
`--speculative-dspark-confidence-sts-path PATH/sts.json`, TensorRT-LLM's speculative config
`confidence_sts_path`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from mcsd_runtime.decisions.sts import (
    STS_FILE,
    StsCalibration,
    StsFit,
    fit_sts,
    position_metrics,
)
from mcsd_runtime.paths import atomic_write_text, build_folder
from train.decision import refuse_existing
from train.sts.chains import Samples, collection_samples, shard_samples, split_groups
from train.sts.config import StsConfig

METRICS = ("ece", "brier", "auroc")


@dataclass
class Data:
    """The samples, which are held out, what they were read from, and what a group is."""

    samples: Samples
    held_out: np.ndarray
    dataset: str
    sources: list[dict]
    unit: str  # "prompt" (collections) or "sample" (shards)


@dataclass
class Chosen:
    calibration: StsCalibration
    report: dict[str, Any]
    markdown: str


class StsTrainer:
    """`train.decision.Trainer` of the per-position temperature table (module docstring),
    `Trainer[Data, StsFit, Chosen, None]`."""

    decision = "sts"

    def __init__(self, config: StsConfig, log=print) -> None:
        self.out, self.config, self.log = config.out, config, log

    def decode(self) -> str:
        return (f"mcsd eval --methods survival-sts:{self.out}@PROFILE.json --batch-layout "
                f"ragged --batch-depth row")

    def prepare(self) -> Data:
        c = self.config
        if c.from_shards:
            samples, sources = shard_samples(c.from_shards, c.gamma)
            dataset, unit = c.from_shards, "sample"
        else:
            samples, sources = collection_samples(list(c.runs), c.gamma)
            dataset, unit = ",".join(str(r) for r in c.runs), "prompt"
        held_out = split_groups(samples.groups, c.test_frac, c.seed)
        return Data(samples, held_out, dataset, sources, unit)

    def fit(self, data: Data, folder: Path) -> StsFit:
        s = data.samples.take(~data.held_out)
        return fit_sts(s.logits, s.valid, s.prefix_mask, offsets=self.config.offsets)

    def choose(self, data: Data, fitted: StsFit) -> Chosen:
        """The held-out report (printed) and the table."""
        test = data.samples.take(data.held_out)
        ones = [1.0] * data.samples.gamma
        before = position_metrics(test.logits, test.valid, test.prefix_mask, ones)
        after = position_metrics(test.logits, test.valid, test.prefix_mask,
                                 fitted.temperatures, fitted.offsets)
        offsets: Sequence[float | None] = fitted.offsets or [None] * len(fitted.temperatures)
        positions = [_position(b, a, t, o, n) for b, a, t, o, n in
                     zip(before, after, fitted.temperatures, offsets, fitted.samples,
                         strict=True)]
        report = self._report(data, fitted, positions)
        markdown = report_markdown(report)
        self.log(markdown.split("\n\n", 1)[1].rstrip())  # all but the title
        return Chosen(self._calibration(data, fitted, report), report, markdown)

    def write(self, data: Data, fitted: StsFit, chosen: Chosen, folder: Path) -> None:
        import json

        atomic_write_text(folder / "report.json",
                          json.dumps(chosen.report, indent=1, allow_nan=False) + "\n")
        atomic_write_text(folder / "report.md", chosen.markdown)
        chosen.calibration.write(folder / STS_FILE)  # last

    def check(self, data: Data, chosen: Chosen, written: None) -> dict | None:
        return None

    def _report(self, data: Data, fitted: StsFit, positions: list[dict]) -> dict[str, Any]:
        groups = data.samples.groups
        counted = [p for p in positions if p["ece_halved"] is not None]
        return {"dataset": data.dataset, "sources": data.sources, "gamma": data.samples.gamma,
                "unit": data.unit, "seed": self.config.seed,
                "test_frac": self.config.test_frac,
                "fit": {"samples": int((~data.held_out).sum()),
                        "groups": len(set(groups[~data.held_out].tolist()))},
                "held_out": {"samples": int(data.held_out.sum()),
                             "groups": len(set(groups[data.held_out].tolist()))},
                "positions": positions,
                "ece_halved_every_position": bool(counted) and all(p["ece_halved"]
                                                                   for p in counted)}

    def _calibration(self, data: Data, fitted: StsFit, report: dict) -> StsCalibration:
        """The table, with the ECE on the samples it was fitted on (as SGLang's fitter writes
        it) and ours: the held-out report's summary."""
        held = {"samples": [p["samples"] for p in report["positions"]],
                **{f"{m}_{w}": [p[w][m] for p in report["positions"]]
                   for m in METRICS for w in ("before", "after")}}
        extra = {"gamma": data.samples.gamma, "source": data.sources[0]["kind"],
                 "created": datetime.now(UTC).isoformat(timespec="seconds"),
                 "fit_samples_per_position": fitted.samples, "held_out": held,
                 "ece_halved_every_position": report["ece_halved_every_position"]}
        return StsCalibration(tuple(fitted.temperatures), data.dataset,
                              report["fit"]["samples"], tuple(fitted.ece_before),
                              tuple(fitted.ece_after), extra, tuple(fitted.offsets))


def _finite(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _position(before: dict, after: dict, temperature: float, offset: float | None,
              fit_samples: int) -> dict:
    """One position's row of the report (None where a metric is undefined; offset None
    without offsets)."""
    b, a = _finite(before["ece"]), _finite(after["ece"])
    return {"position": before["position"], "samples": before["samples"],
            "accepted": before["accepted"], "fit_samples": fit_samples,
            "temperature": temperature, "offset": offset,
            "before": {m: _finite(before[m]) for m in METRICS},
            "after": {m: _finite(after[m]) for m in METRICS},
            "ece_halved": None if b is None or a is None else a <= b / 2}


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def report_markdown(report: dict[str, Any]) -> str:
    """`report.md`: the settings and the held-out table."""
    fit, held = report["fit"], report["held_out"]

    def of(part: dict) -> str:
        return f" of {part['groups']} prompts" if report["unit"] == "prompt" else ""

    lines = [f"# Per-position calibration (DSpark STS), gamma {report['gamma']}",
             f"Fitted on {fit['samples']} samples{of(fit)} of `{report['dataset']}`, reported "
             f"on {held['samples']} held-out samples{of(held)}: the survival of "
             f"position j, the product of sigmoid(logit_i / T_i + b_i) over i <= j, against "
             f"whether the first j drafted tokens were all accepted; before: T = 1 (b = 0), "
             f"after: the fitted T" + (" and b (`--offsets`: our budget's only; the engines "
             "read T alone)." if report["positions"][0]["offset"] is not None else
             " (b = 0)."),
             _table(report["positions"]),
             f"ECE halved at every held-out position: "
             f"{'yes' if report['ece_halved_every_position'] else 'no'}."]
    return "\n\n".join(lines) + "\n"


def _table(positions: list[dict]) -> str:
    rows = ["| position | samples | accepted | T | ECE before | ECE after | Brier before | "
            "Brier after | AUROC before | AUROC after | ECE halved |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in positions:
        b, a = p["before"], p["after"]
        halved = {True: "yes", False: "no", None: "-"}[p["ece_halved"]]
        scale = f"{p['temperature']:.3f}" + ("" if p["offset"] is None else
                                            f", b {p['offset']:+.2f}")
        rows.append(f"| {p['position']} | {p['samples']} | {p['accepted']} | "
                    f"{scale} | {_num(b['ece'])} | {_num(a['ece'])} | "
                    f"{_num(b['brier'])} | {_num(a['brier'])} | {_num(b['auroc'])} | "
                    f"{_num(a['auroc'])} | {halved} |")
    return "\n".join(rows)


def run_sts(trainer: StsTrainer, force: bool = False) -> int:
    """The stages into a staging folder that then replaces `trainer.out` (as `train.decision.
    train`, without `decision.json`: `sts.json` is written last and marks it complete)."""
    out = trainer.out
    refuse_existing(out, force)

    def stages(folder: Path) -> None:
        data = trainer.prepare()
        fitted = trainer.fit(data, folder)
        trainer.write(data, fitted, trainer.choose(data, fitted), folder)

    build_folder(out, "the STS table", "pass another --out", stages)
    if trainer.config.offsets:
        trainer.log(f"-> {out / STS_FILE} (with offsets, which the engines do not read: for "
                    f"our budget only, `{trainer.decode()}`)")
        return 0
    trainer.log(f"-> {out / STS_FILE} (SGLang: --speculative-dspark-confidence-sts-path "
                f"{out / STS_FILE}; TensorRT-LLM: speculative_config confidence_sts_path; "
                f"our budget: `{trainer.decode()}`)")
    return 0
