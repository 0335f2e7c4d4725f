"""`mcsd train --decision width`: a learned width (`width:PATH`), trained on the target's greedy
outputs of training prompts, its replayed speed reported by category, on the training prompts
and on held-out ones, against every static width and the hindsight-best width at every step;
with --check-prompts, the replay checked against end-to-end decoding of held-out prompts. The
first depth of --k-config (default 4) is the widest width. Decode it with `mcsd eval --methods
width:PATH` (the first depth alone) or after prompt lookup (`lookup:8:3+width:PATH`,
`lookup-learned:COPY+width:PATH`), on a --k-config whose first depth drafts the k it was trained
for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mcsd_runtime.progress import working
from train.outputs import Outputs, load_profile, prepare_outputs
from train.width.config import WidthConfig

if TYPE_CHECKING:
    from mcsd_runtime.decisions.width import WidthPolicy
    from mcsd_runtime.pricing.profile import CostProfile


@dataclass
class Ranked:
    """The outputs and, by domain, the draft's ranks along them (`collect.outputs.Ranked`)."""

    outputs: Outputs
    ranked: dict[str, list]

    @property
    def profile(self) -> CostProfile:
        """The outputs' cost profile (a width is priced by this toolkit's, never an engine's)."""
        assert self.outputs.profile is not None, "prepare loads this toolkit's profile"
        return self.outputs.profile

    def training(self) -> list:
        return [o for name in self.outputs.train_domains for o in self.ranked[name]]


@dataclass
class WidthFit:
    """The fitted width policy and its training facts."""

    policy: WidthPolicy
    facts: dict


@dataclass
class WidthReport:
    """The replayed report, one entry per prompt set."""

    sets: list[dict]


class WidthTrainer:
    """`train.decision.Trainer` of the width: `Trainer[Ranked, WidthFit, WidthReport, None]`."""

    decision = "width"

    def __init__(self, config: WidthConfig) -> None:
        from mcsd_runtime.extras import require_toolkit

        require_toolkit("mcsd train --decision width", "sklearn")
        self.config, self.out, self.k = config, config.out, config.k

    def decode(self) -> str:
        return f"mcsd eval --methods width:{self.out} --k-config {self.config.k_config}"

    def prepare(self) -> Ranked:
        from collect.outputs import draft_ranks

        o, k = self.config.outputs, self.k
        profile = load_profile(o, k + 1, f"verifying {k} candidates takes {k + 1}")
        if not any(" width " in name for name in profile.static.get("tokens_per_s", {})):
            print(f"note: --cost-profile {o.cost_profile} timed forwards of 2..{k} tokens in "
                  f"isolation, not in the decoder, and the widths trade exactly those: measure "
                  f"it with `mcsd profile --widths`", flush=True)
        outputs = prepare_outputs(o, profile)
        ranked = {name: draft_ranks(outputs.pair, traces, k, desc=f"draft candidates: {name}")
                  for name, traces in outputs.traces.items()}
        data = Ranked(outputs, ranked)
        train = data.training()
        print(f"training on {len(train)} outputs ({sum(len(o.rank) for o in train)} tokens)",
              flush=True)
        return data

    def fit(self, data: Ranked, folder: Path) -> WidthFit:
        from train.width.fit import fit

        return WidthFit(*fit(data.training(), data.profile, self.k))

    def choose(self, data: Ranked, fitted: WidthFit) -> WidthReport:
        """The policy chooses by its tuned rate; this replays it (the report)."""
        from replay.width import WidthReplay, compare, write_report

        policy = fitted.policy
        replay, trained = WidthReplay(data.profile, self.k), data.outputs.train_domains
        with working(f"replaying the width and its peers on {len(data.ranked)} sets"):
            compared = [compare(policy, replay, outs, name, name in trained)
                        for name, outs in data.ranked.items()]
        report, text = write_report(policy, compared)
        print(text)
        return WidthReport(report)

    def write(self, data: Ranked, fitted: WidthFit, chosen: WidthReport, folder: Path) -> None:
        o, policy = self.config.outputs, fitted.policy
        policy.trained = {"training": fitted.facts, "prompts": o.prompts, "target": o.target,
                          "draft": str(data.outputs.pair.draft_name),
                          "profile": str(o.cost_profile), "max_new_tokens": o.max_new_tokens,
                          "report": chosen.sets}
        policy.save(folder)

    def check(self, data: Ranked, chosen: WidthReport, written: None) -> dict | None:
        c = self.config
        if not c.check_prompts:
            return None
        from mcsd_runtime.decisions.width import WidthPolicy
        from replay.check import format_check, width_check

        out = data.outputs
        held = list(out.eval_domains)
        check = width_check(out.pair, WidthPolicy.load(self.out),
                            {n: out.traces[n] for n in held}, {n: data.ranked[n] for n in held},
                            data.profile, c.check_prompts, c.outputs.seed, progress=True)
        print(format_check(check))
        return check
