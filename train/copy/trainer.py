"""`mcsd train --decision copy`: a learned prompt-lookup copy length (`lookup-learned:PATH`),
trained on the target's outputs of training prompts (greedy, or sampled at --temperature), its
replayed speed reported by category, on the training prompts and on held-out ones, against
static copy lengths and the hindsight oracle; with --check-prompts, the replay checked against
end-to-end decoding of held-out prompts. With --k-config, it learns to copy or draft
(`lookup-learned:PATH+static:1`) against `lookup:K:N+static:1`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from mcsd_runtime.errors import MCSDError
from replay.copy import BESIDE, DEPLOY, compare, draft_step_costs, step_costs, write_report
from replay.result import Comparison
from train.copy import fit as fitting
from train.outputs import Outputs, check_counts, load_profile, prepare_outputs

VERIFY = "mcss"  # the decoder's default sampling verifier, which sampled drafted steps replay
CHECK_STATICS = ("lookup:15:3", "lookup:12:2")  # decoded beside it by --check-prompts


@dataclass
class Fitted:
    policy: object  # CopyLength
    text: str  # the LightGBM model file
    facts: dict


class CopyTrainer:
    """`train.decision.Trainer` of the copy length."""

    decision = "copy"

    def __init__(self, args: argparse.Namespace) -> None:
        from mcsd_runtime.extras import require_toolkit

        require_toolkit("mcsd train --decision copy", "lightgbm")
        if args.min_ngram is None:
            args.min_ngram = 1 if args.k_config is None else 2
        check_counts(args, "max_copy", "min_ngram")
        if args.temperature < 0 or args.check_prompts < 0 or args.folds < 0 or args.folds == 1:
            raise MCSDError("--temperature, --check-prompts and --folds must be >= 0 (0: greedy; "
                            "no check; no out-of-fold replay) and --folds not 1")
        if args.check_prompts and not args.eval_prompts:
            raise MCSDError("--check-prompts decodes held-out prompts: name them with "
                            "--eval-prompts")
        if args.min_ngram > 4:
            raise MCSDError("--min-ngram: matches are of 1..4 tokens; use 4 at most")
        self.args, self.out = args, args.out
        self.tree = None
        if args.k_config is not None:
            from mcsd_runtime.tree import Tree, parse_k_config

            self.tree = Tree(parse_k_config(args.k_config))

    def prepare(self) -> Outputs:
        from collect.outputs import draft_hits

        a, tree = self.args, self.tree
        profile = load_profile(a, a.max_copy + 1, f"copying {a.max_copy} verifies "
                               f"{a.max_copy + 1} (or lower --max-copy)", a.temperature)
        self.costs = step_costs(profile, a.max_copy)
        self.draft_costs = (None if tree is None
                            else draft_step_costs(profile, tree, a.max_copy + 2))

        def drafted(pair) -> dict | None:  # sampled beside a draft: through its first depth
            if tree is None or a.temperature <= 0:
                return None
            return {"draft": str(pair.draft_name), "width": tree.sizes[0], "verify": VERIFY}

        data = prepare_outputs(a, profile, a.temperature, drafted)
        if tree is not None and drafted(data.pair) is None:
            data.traces = {name: draft_hits(data.pair, outs, tree.sizes[0],
                                            desc=f"draft candidates: {name}")
                           for name, outs in data.traces.items()}
        train = data.training()
        print(f"training on {len(train)} outputs ({sum(len(t.tokens) for t in train)} tokens)",
              flush=True)
        return data

    def fit(self, data: Outputs, folder: Path) -> Fitted:
        policy, text, facts = fitting.fit(data.training(), self.costs, self.args.min_ngram,
                                  seed=self.args.seed, draft_costs=self.draft_costs)
        policy.temperature, policy.draft_tree = self.args.temperature, self.args.k_config
        return Fitted(policy, text, facts)

    def choose(self, data: Outputs, fitted: Fitted) -> dict:
        """The policy chooses by its tuned rate; this replays it (the report)."""
        policy, a = fitted.policy, self.args
        domains = {name: compare(policy, self.costs, outs, name, name in data.train_domains)
                   for name, outs in data.traces.items()}
        train = data.training()
        mix = mix_comparison(policy, self.costs, train,
                             [domains[n] for n in data.train_domains],
                             min(a.folds, len(train)), a.seed)
        report, mixed, text = write_report(policy, list(domains.values()), mix)
        print(text)
        return {"report": report, "training_mix": mixed}

    def write(self, data: Outputs, fitted: Fitted, chosen: dict, folder: Path) -> str:
        a = self.args
        fitted.policy.save(folder, fitted.text, {
            "training": fitted.facts, "prompts": a.prompts, "target": a.target,
            "profile": str(a.cost_profile), "max_new_tokens": a.max_new_tokens, **chosen})
        if self.tree is None:
            return f"mcsd eval --methods lookup-learned:{self.out}"
        return f"mcsd eval --methods lookup-learned:{self.out}+{BESIDE} --k-config {a.k_config}"

    def check(self, data: Outputs, chosen: dict) -> dict | None:
        if not self.args.check_prompts:
            return None
        from mcsd_runtime.stop.copy_length import CopyLength
        from replay.check import capped, copy_check, format_check

        policy = CopyLength.load(self.out)
        statics = capped([f"lookup:{DEPLOY[0]}:{DEPLOY[1]}", *CHECK_STATICS], policy.max_copy,
                         BESIDE if self.tree is not None else None)
        check = copy_check(data.pair, policy, {n: data.traces[n] for n in data.eval_domains},
                           statics, self.args.check_prompts, self.args.seed, progress=True,
                           tree=None if self.tree is None else self.tree.k_config,
                           profile=data.profile)
        print(format_check(check))
        return check


def mix_comparison(policy, costs: list[float], train: list, domains: list[Comparison],
                   folds: int, seed: int) -> Comparison:
    """The training mix: the training `domains`' outputs pooled (`replay.copy.MIX`), and with
    `folds` the policy's speed out of fold (`fit.out_of_fold`; left out where a fold holds too
    few repeats to fit)."""
    mix = Comparison.pooled("training mix", domains, facts={"outputs": len(train),
                                                            "folds": folds})
    if folds:
        try:
            speed = fitting.out_of_fold(train, costs, folds, seed, min_ngram=policy.min_ngram,
                                        max_ngram=policy.max_ngram,
                                        draft_costs=policy.draft_costs)
        except MCSDError:
            return mix
        mix = mix.with_outputs({"out of fold": speed})
    return mix


