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

import argparse
from dataclasses import dataclass
from pathlib import Path

from mcsd_runtime.errors import MCSDError
from train.outputs import Outputs, check_counts, load_profile, prepare_outputs


@dataclass
class Ranked:
    """The outputs and, by domain, the draft's ranks along them (`collect.outputs.Ranked`)."""

    outputs: Outputs
    ranked: dict[str, list]

    def training(self) -> list:
        return [o for name in self.outputs.train_domains for o in self.ranked[name]]


class WidthTrainer:
    """`train.decision.Trainer` of the width."""

    decision = "width"

    def __init__(self, args: argparse.Namespace) -> None:
        from mcsd_runtime.extras import require_toolkit
        from mcsd_runtime.tree import parse_k_config

        require_toolkit("mcsd train --decision width", "sklearn")
        self.k = parse_k_config(args.k_config)[0]
        check_counts(args)
        if self.k < 2:
            raise MCSDError("the first depth of --k-config must be at least 2 (one candidate "
                            "leaves nothing to choose)")
        if args.check_prompts < 0:
            raise MCSDError("--check-prompts must be >= 0 (0: no check)")
        if args.check_prompts and not args.eval_prompts:
            raise MCSDError("--check-prompts decodes held-out prompts: name them with "
                            "--eval-prompts")
        self.args, self.out = args, args.out

    def prepare(self) -> Ranked:
        from collect.outputs import draft_ranks

        a, k = self.args, self.k
        profile = load_profile(a, k + 1, f"verifying {k} candidates takes {k + 1}")
        if not any(" width " in name for name in profile.static.get("tokens_per_s", {})):
            print(f"note: --cost-profile {a.cost_profile} timed forwards of 2..{k} tokens in "
                  f"isolation, not in the decoder, and the widths trade exactly those: measure "
                  f"it with `mcsd profile --widths`", flush=True)
        data = prepare_outputs(a, profile)
        ranked = {name: draft_ranks(data.pair, traces, k, desc=f"draft candidates: {name}")
                  for name, traces in data.traces.items()}
        data = Ranked(data, ranked)
        train = data.training()
        print(f"training on {len(train)} outputs ({sum(len(o.rank) for o in train)} tokens)",
              flush=True)
        return data

    def fit(self, data: Ranked, folder: Path):
        from train.width.fit import fit

        return fit(data.training(), data.outputs.profile, self.k)

    def choose(self, data: Ranked, fitted) -> list[dict]:
        """The policy chooses by its tuned rate; this replays it (the report)."""
        from replay.width import WidthReplay, compare, write_report

        policy, _ = fitted
        replay, trained = WidthReplay(data.outputs.profile, self.k), data.outputs.train_domains
        report, text = write_report(policy, [compare(policy, replay, outs, name, name in trained)
                                             for name, outs in data.ranked.items()])
        print(text)
        return report

    def write(self, data: Ranked, fitted, chosen: list[dict], folder: Path) -> str:
        a, (policy, facts) = self.args, fitted
        policy.trained = {"training": facts, "prompts": a.prompts, "target": a.target,
                          "draft": str(data.outputs.pair.draft_name),
                          "profile": str(a.cost_profile), "max_new_tokens": a.max_new_tokens,
                          "report": chosen}
        policy.save(folder)
        return f"mcsd eval --methods width:{self.out} --k-config {a.k_config}"

    def check(self, data: Ranked, chosen: list[dict]) -> dict | None:
        if not self.args.check_prompts:
            return None
        from mcsd_runtime.stop.width import WidthPolicy
        from replay.check import format_check, width_check

        out = data.outputs
        held = list(out.eval_domains)
        check = width_check(out.pair, WidthPolicy.load(self.out),
                            {n: out.traces[n] for n in held}, {n: data.ranked[n] for n in held},
                            out.profile, self.args.check_prompts, self.args.seed, progress=True)
        print(format_check(check))
        return check
