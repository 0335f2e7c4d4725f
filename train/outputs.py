"""What the decisions trained on the target's own outputs (copy, width) share: their options
(`OutputsConfig`: prompts, cost profile, pair, outputs), and the prompts, cost profile, pair and
outputs (`collect.outputs`) those name, prepared once by `prepare_outputs`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts.chat import DEFAULT_CHAT

if TYPE_CHECKING:
    from mcsd_runtime.models.pair import Pair
    from mcsd_runtime.pricing.profile import CostProfile


@dataclass(frozen=True)
class OutputsConfig:
    """The options that prepare the target's outputs (`prepare_outputs`), the same for copy
    and width; their defaults are `mcsd train`'s. Checked on construction (MCSDError)."""

    prompts: str  # training prompt sets, comma-separated (`prompts.sets.load_domains`)
    cost_profile: Path  # forward-latency profile of the pair (`mcsd profile`)
    eval_prompts: str | None = None  # held-out prompt sets, split by category
    limit: int = 40  # prompts per training set
    eval_limit: int = 10  # held-out prompts per category
    max_new_tokens: int = 64  # output tokens per prompt
    eos: str = "ignore"  # stop: end each output at EOS; ignore: run to max_new_tokens
    traces: Path | None = None  # JSON cache of the outputs (`collect.outputs.TraceCache`)
    chat: str = DEFAULT_CHAT  # the prompt format (`mcsd_runtime.prompts.chat`)
    seed: int = 0  # of sampled outputs (and of the decision's model and check)
    # the pair (`mcsd_runtime.cli.args.load_command_pair`)
    target: str = "toy"
    draft: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    attention: str = "mcsd_sdpa"
    # its `mcsd train` options that only the decisions trained on outputs take (the cost
    # profile and the seed are every decision's)
    OPTIONS: ClassVar[tuple[str, ...]] = (
        "target", "draft", "device", "dtype", "attention", "prompts", "eval_prompts", "limit",
        "eval_limit", "max_new_tokens", "eos", "traces", "chat")

    def __post_init__(self) -> None:
        check_positive(limit=self.limit, eval_limit=self.eval_limit,
                       max_new_tokens=self.max_new_tokens)


@dataclass
class Outputs:
    """The prompt sets (training ones one domain each; held-out ones by category), the cost
    profile, the pair and the outputs by domain (`collect.outputs.Trace`)."""

    train_domains: dict
    eval_domains: dict
    profile: CostProfile | None  # None: steps priced by a serving engine's profile
    pair: Pair
    traces: dict[str, list]

    def training(self) -> list:
        """The training domains' outputs, pooled."""
        return [t for name in self.train_domains for t in self.traces[name]]


def check_positive(**counts: int) -> None:
    """MCSDError unless every count is positive, naming them as options (`max_copy`:
    --max-copy)."""
    if min(counts.values()) < 1:
        names = [f"--{name.replace('_', '-')}" for name in counts]
        listed = f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]
        raise MCSDError(f"{listed} must be positive")


def check_held_out(check_prompts: int, config: OutputsConfig) -> None:
    """MCSDError unless `check_prompts` (held-out prompts decoded end to end per category; 0:
    no check) is >= 0, with held-out prompts to decode where positive."""
    if check_prompts < 0:
        raise MCSDError("--check-prompts must be >= 0 (0: no check)")
    if check_prompts and not config.eval_prompts:
        raise MCSDError("--check-prompts decodes held-out prompts: name them with "
                        "--eval-prompts")


def load_prompt_domains(config: OutputsConfig) -> tuple[dict, dict]:
    """The training sets (one domain each) and the held-out categories; MCSDError when a
    held-out category is named like a training set."""
    from mcsd_runtime.prompts.sets import load_domains

    train = load_domains(config.prompts, config.limit, by_category=False)
    held_out = (load_domains(config.eval_prompts, config.eval_limit) if config.eval_prompts
                else {})
    if both := sorted(set(train) & set(held_out)):
        raise MCSDError(f"--eval-prompts has a category named like a training set "
                        f"({', '.join(both)}): held-out prompts must come from other sets")
    return train, held_out


def load_profile(config: OutputsConfig, tokens: int, why: str, temperature: float = 0.0):
    """The cost profile, which must time forwards of `tokens` tokens (`why` says what needs
    them); its note on the temperature printed."""
    from mcsd_runtime.pricing.profile import CostProfile

    profile = CostProfile.load(config.cost_profile)
    if profile.tokens[-1] < tokens:
        raise MCSDError(f"--cost-profile {config.cost_profile} times forwards of up to "
                        f"{profile.tokens[-1]} tokens; {why}: measure with `mcsd profile "
                        f"--max-tokens {tokens}`")
    if note := profile.temperature_note(temperature):
        print(note, flush=True)
    return profile


def prepare_outputs(config: OutputsConfig, profile, temperature: float = 0.0,
                    drafted: Callable[[object], dict | None] | None = None) -> Outputs:
    """The prompts, the pair and the target's outputs of every training and held-out prompt
    (cached in `config.traces`), sampled at `temperature` (`drafted(pair)`, when it gives a
    dict: drawn through a draft's first depth, `collect.outputs.drafted_traces`)."""
    from collect.outputs import TraceCache
    from mcsd_runtime.cli.args import load_command_pair

    c = config
    train_domains, eval_domains = load_prompt_domains(c)
    pair = load_command_pair(c.target, c.draft, c.device, c.dtype, c.attention)
    cache = TraceCache(c.traces, c.target, c.max_new_tokens, c.eos == "stop", temperature,
                       c.seed, drafted(pair) if drafted else None)
    traces = {name: cache.get(pair, prompts, c.chat, name)
              for name, (_, prompts) in (train_domains | eval_domains).items()}
    return Outputs(train_domains, eval_domains, profile, pair, traces)
