"""What the decisions trained on the target's own outputs (copy, width) share: their prompts,
cost profile, pair and outputs (`collect.outputs`), prepared once by `prepare_outputs`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from mcsd_runtime.errors import MCSDError


@dataclass
class Outputs:
    """The prompt sets (training ones one domain each; held-out ones by category), the cost
    profile, the pair and the outputs by domain (`collect.outputs.Trace`)."""

    train_domains: dict
    eval_domains: dict
    profile: object  # CostProfile
    pair: object  # Pair
    traces: dict[str, list]

    def training(self) -> list:
        """The training domains' outputs, pooled."""
        return [t for name in self.train_domains for t in self.traces[name]]


def load_prompt_domains(args: argparse.Namespace) -> tuple[dict, dict]:
    """The training sets (one domain each) and the held-out categories; MCSDError when a
    held-out category is named like a training set."""
    from mcsd_runtime.prompts.sets import load_domains

    train = load_domains(args.prompts, args.limit, by_category=False)
    held_out = load_domains(args.eval_prompts, args.eval_limit) if args.eval_prompts else {}
    if both := sorted(set(train) & set(held_out)):
        raise MCSDError(f"--eval-prompts has a category named like a training set "
                        f"({', '.join(both)}): held-out prompts must come from other sets")
    return train, held_out


def check_counts(args: argparse.Namespace, *more: str) -> None:
    """MCSDError unless --limit, --eval-limit, --max-new-tokens and the options `more` (dests)
    are positive."""
    dests = ("limit", "eval_limit", "max_new_tokens", *more)
    if min(getattr(args, d) for d in dests) < 1:
        names = [f"--{d.replace('_', '-')}" for d in dests]
        raise MCSDError(f"{', '.join(names[:-1])} and {names[-1]} must be positive")


def load_profile(args: argparse.Namespace, tokens: int, why: str, temperature: float = 0.0):
    """--cost-profile, which must time forwards of `tokens` tokens (`why` says what needs
    them); its note on the temperature printed."""
    from mcsd_runtime.pricing.profile import CostProfile

    profile = CostProfile.load(args.cost_profile)
    if profile.tokens[-1] < tokens:
        raise MCSDError(f"--cost-profile {args.cost_profile} times forwards of up to "
                        f"{profile.tokens[-1]} tokens; {why}: measure with `mcsd profile "
                        f"--max-tokens {tokens}`")
    if note := profile.temperature_note(temperature):
        print(note, flush=True)
    return profile


def prepare_outputs(args: argparse.Namespace, profile, temperature: float = 0.0,
                    drafted: Callable[[object], dict | None] | None = None) -> Outputs:
    """The prompts, the pair and the target's outputs of every training and held-out prompt
    (cached in --traces), sampled at `temperature` (`drafted(pair)`, when it gives a dict: drawn
    through a draft's first depth, `collect.outputs.drafted_traces`)."""
    from collect.outputs import TraceCache
    from mcsd_runtime.cli.args import apply_threads, pair_from_args

    train_domains, eval_domains = load_prompt_domains(args)
    apply_threads(args)
    pair = pair_from_args(args)
    cache = TraceCache(args.traces, args.target, args.max_new_tokens, args.eos == "stop",
                       temperature, args.seed, drafted(pair) if drafted else None)
    traces = {name: cache.get(pair, prompts, args.chat, name)
              for name, (_, prompts) in (train_domains | eval_domains).items()}
    return Outputs(train_domains, eval_domains, profile, pair, traces)
