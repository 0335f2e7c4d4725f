"""`mcsd train --decision budget`: the verification budget of a ragged batch
(`mcsd_runtime.decisions.verify_budget`) with a learned node model, trained by the stages every
decision runs (`train.decision`).

- **prepare**: the collected runs (a dense greedy collection of a chain tree: the budget's
  replay walks it), labelled and split by prompt as for the stopper (`train.stop.pipeline`);
- **fit**: the stopper's node model (LightGBM or MLP, hard label: P(a node and its child are
  accepted), the gain of drafting the child), then its isotonic calibration on validation
  prompts: the budget reads probabilities;
- **choose**: nothing to tune (the budget maximises expected tokens per second of each step
  under the profile); the learned budget is replayed on the test prompts at every
  `--batch-size` beside the padded static depths, the training-free rules (ragged static,
  `cumprod`, `survival:Q`, vLLM's `survival-online`, each at its best setting on validation
  prompts) and the oracles
  (`replay.ragged.compare`), and the report gives its ratio to the best padded configuration
  (AR or a static depth), to the best training-free rule, and its share of the oracle's gain;
- **write**: the node model's files and `stopper.json`, the profile (`cost.json`) and
  `budget.json` (calibration and report), then `decision.json`.

Decode it with `mcsd eval --methods budget:PATH --batch-layout ragged --batch-depth row`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.progress import working
from replay.result import Column, Comparison, Report, pct
from train import node_model as N
from train.budget.config import BudgetConfig

if TYPE_CHECKING:
    from mcsd_runtime.decisions.artifact import ArtifactSpec
    from mcsd_runtime.decisions.expected_rate import Calibration

# the training-free rules beside it
PEERS = ("ragged static", "cumprod", "survival", "survival-online")
PROFILE_FILE = "cost.json"


@dataclass
class Runs:
    """The collected rows and their runs' manifests, prepared as for the stopper."""

    prep: N.Prepared
    manifests: list[dict]


@dataclass
class Fitted:
    """The node model, its provisional spec and its calibration."""

    fit: N.Fit
    spec: ArtifactSpec  # the node model's
    calibration: Calibration  # its calibration on validation prompts
    folder: Path  # where its model files are


@dataclass
class BudgetReport:
    """The replayed report: each batch size's record (what budget.json keeps) and the replay's
    result (`replay.ragged.compare`), both by batch size."""

    batch_sizes: dict
    replay: dict

    def fields(self) -> dict:
        """What metrics.json keeps of it."""
        return {"batch_sizes": self.batch_sizes, "replay": self.replay}


class BudgetTrainer:
    """`train.decision.Trainer` of the learned verification budget (module docstring),
    `Trainer[Runs, Fitted, BudgetReport, None]`; `profile` prices the replay and goes into the
    artifact."""

    decision = "budget"

    def __init__(self, config: BudgetConfig, profile: CostProfile, log=print) -> None:
        for b in config.batch_sizes:
            profile.check_rows(b)
        self.out, self.config, self.profile, self.log = config.out, config, profile, log

    def decode(self) -> str:
        return (f"mcsd eval --methods budget:{self.out} --batch-layout ragged "
                f"--batch-depth row --batch-size {','.join(map(str, self.config.batch_sizes))}")

    def prepare(self) -> Runs:
        from replay.runs import load_runs

        df, manifests = load_runs(list(self.config.runs))
        return Runs(N.prepare(df, manifests, self.config.training, self.log), manifests)

    def fit(self, data: Runs, folder: Path) -> Fitted:
        from mcsd_runtime.decisions.learned import stopper_from
        from replay.runs import collected_prompt_format, pair_fingerprint
        from train.node_model import fit_calibration

        prep = data.prep
        if prep.k_config is None or any(k != 1 for k in prep.k_config):
            raise MCSDError(f"the budget replays chains: collect with a chain --k-config such as "
                            f"1,1,1,1,1,1 (these runs drafted {prep.k_config})")
        fit = N.fit(prep, self.config.training, folder, self.log)
        spec = N.provisional_spec(prep, self.config.training, pair_fingerprint(data.manifests),
                                   prep.k_config, collected_prompt_format(data.manifests))
        scores = stopper_from(spec, folder).node_scores(prep.x["val"])
        calibration = fit_calibration(scores, prep.parts["val"]["label_hard"].to_numpy())
        return Fitted(fit, spec, calibration, folder)

    def choose(self, data: Runs, fitted: Fitted) -> BudgetReport:
        """The replayed report (module docstring), printed."""
        from mcsd_runtime.decisions.learned import stopper_from
        from mcsd_runtime.decisions.verify_budget import LearnedSurvival
        from replay import ragged as RG

        stopper = stopper_from(fitted.spec, fitted.folder)
        stopper.calibration = fitted.calibration
        val, test = split_data(data)
        learned = RG.Family("learned budget", [RG.Budget(LearnedSurvival(stopper, "budget"))])
        fams = [*RG.families(test.depth), learned]
        sizes = list(self.config.batch_sizes)
        with working(f"replaying {sum(len(f.specs) for f in fams)} rules on "
                     f"{len(val.prompts)} + {len(test.prompts)} prompts at batch sizes "
                     f"{','.join(map(str, sizes))}"):
            result = RG.compare(test, self.profile, sizes, fams, tune=val)
        records, text = REPORT.write([comparison(b, r) for b, r in result.items()])
        self.log(f"replayed on {len(test.prompts)} test prompts (settings of the training-free "
                 f"rules chosen on {len(val.prompts)} validation prompts):")
        self.log(RG.table(result))
        self.log(text + "\n(tokens/s: the learned budget's; share: of the oracle's gain over "
                 "the best padded configuration, the learned budget's)")
        return BudgetReport(dict(zip(result, records, strict=True)), result)

    def write(self, data: Runs, fitted: Fitted, chosen: BudgetReport, folder: Path) -> None:
        from mcsd_runtime.decisions.verify_budget import write_budget

        fitted.spec.write(folder)
        self.profile.save(folder / PROFILE_FILE)
        write_budget(folder, fitted.calibration, PROFILE_FILE, chosen.batch_sizes)
        N.write_json(folder / "metrics.json", {"fit": fitted.fit.metrics, **chosen.fields()})

    def check(self, data: Runs, chosen: BudgetReport, written: None) -> dict | None:
        return None


def split_data(data: Runs):
    """The validation and test prompts' dense walks (`replay.data.ReplayData`)."""
    from replay.data import ReplayData
    from replay.runs import output_lengths, sequence_ids

    prep = data.prep
    whole = ReplayData(prep.df, prep.k_config, mode="exact",
                       new_tokens=output_lengths(data.manifests))
    sequences = sequence_ids(prep.df)
    keys = {k: set(sequences[m].unique()) for k, m in prep.masks.items()}
    return whole.subset(keys["val"]), whole.subset(keys["test"])


def comparison(batch_size: int, result: dict) -> Comparison:
    """One batch size of `replay.ragged.compare`'s result, compared: the learned budget against
    the best padded configuration (AR or a padded static depth, the deployed one), the best
    training-free rule and the oracle."""
    fams = result["families"]
    speeds = {name: f["tokens_per_s"] for name, f in fams.items()} | {"ar": result["ar"]}
    # the bound: the better of the two hindsight rules (verify exactly what is accepted, or
    # the budget fed the truth, which also leaves out depths that do not pay for themselves)
    speeds["hindsight"] = max(speeds["oracle"], speeds["oracle-budget"])
    padded = "padded static" if speeds["padded static"] >= speeds["ar"] else "ar"
    return Comparison(f"B={batch_size}", speeds, padded,
                      peer=max(PEERS, key=speeds.__getitem__), learned="learned budget",
                      oracle="hindsight",
                      facts={"settings": {n: f["best"] for n, f in fams.items()}})


def _best_padded(c: Comparison) -> str:
    return "ar" if c.deployed == "ar" else c.facts["settings"][c.deployed]


# per batch size (`comparison`): the learned budget against the best padded configuration,
# the best training-free rule and the oracle
REPORT = Report(
    (Column("learned_tokens_per_s", Comparison.speed, "tokens/s", "{:.0f}".format),
     Column("best_padded", _best_padded, "best padded", str),
     Column("vs_best_padded", lambda c: c.ratio(), "vs padded"),
     Column("best_peer", lambda c: f"{c.peer} ({c.facts['settings'][c.peer]})", "best peer",
            str),
     Column("vs_best_peer", lambda c: c.ratio(over=c.peer), "vs peer"),
     Column("oracle_vs_best_padded", lambda c: c.ratio(c.oracle), "oracle vs padded"),
     Column("oracle_share", lambda c: c.share(), "share", pct)),
    label=Column("label", lambda c: c.group, "learned budget"))

