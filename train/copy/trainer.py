"""`mcsd train --decision copy`: a learned prompt-lookup copy length (`lookup-learned:PATH`),
trained on the target's outputs of training prompts (greedy, or sampled at --temperature), its
replayed speed reported by category, on the training prompts and on held-out ones, against
static copy lengths and the hindsight oracle; with --check-prompts, the replay checked against
end-to-end decoding of held-out prompts. With --k-config, it learns to copy or draft
(`lookup-learned:PATH+static:1`) against `lookup:K:N+static:1`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.progress import working
from replay.copy import BESIDE, DEPLOY, compare, draft_step_costs, step_costs, write_report
from replay.result import Comparison
from train.copy import fit as fitting
from train.copy.config import CopyConfig
from train.outputs import Outputs, load_profile, prepare_outputs

if TYPE_CHECKING:
    from mcsd_runtime.decisions.copy_length import CopyLength
    from mcsd_runtime.serving.engine_profile import EngineProfile

VERIFY = "mcss"  # the decoder's default sampling verifier, which sampled drafted steps replay
CHECK_STATICS = ("lookup:15:3", "lookup:12:2")  # decoded beside it by --check-prompts


@dataclass
class Priced(Outputs):
    """The outputs (with the draft's candidates along them where the policy learns to copy or
    draft, `collect.outputs.draft_hits`) and what prices their steps: a copy of each length
    (`replay.copy.step_costs`) and, beside a tree, a drafted step (`draft_step_costs`)."""

    costs: list[float]
    draft_costs: list[float] | None


@dataclass
class Fitted:
    """The policy, its LightGBM model file and its training facts."""

    policy: CopyLength
    text: str  # the LightGBM model file
    facts: dict


@dataclass
class CopyReport:
    """The replayed report: by prompt set, and on the training mix (cross-fitted)."""

    report: list[dict]
    training_mix: dict

    def fields(self) -> dict:
        """What the copy length's artifact keeps of it."""
        return {"report": self.report, "training_mix": self.training_mix}


class CopyTrainer:
    """`train.decision.Trainer` of the copy length, `Trainer[Priced, Fitted, CopyReport, None]` (the
    replayed report chosen)."""

    decision = "copy"

    def __init__(self, config: CopyConfig) -> None:
        from mcsd_runtime.extras import require_toolkit
        from mcsd_runtime.tree import Tree, parse_k_config

        require_toolkit("mcsd train --decision copy", "lightgbm")
        self.config, self.out = config, config.out
        self.tree = None if config.k_config is None else Tree(parse_k_config(config.k_config))
        self.engine = engine_profile(config.outputs.cost_profile)
        if self.engine is not None and self.tree is not None:
            raise MCSDError(f"--cost-profile {config.outputs.cost_profile} is a serving engine's "
                            f"profile, which prices prompt lookup's steps only: drop --k-config, "
                            f"or price a copy length beside a draft with this toolkit's `mcsd "
                            f"profile`")

    def decode(self) -> str:
        if self.engine is not None:
            return f"mcsd eval --engine vllm --methods proposer:{self.out}"
        if self.tree is None:
            return f"mcsd eval --methods lookup-learned:{self.out}"
        return (f"mcsd eval --methods lookup-learned:{self.out}+{BESIDE} --k-config "
                f"{self.config.k_config}")

    def prepare(self) -> Priced:
        from collect.outputs import draft_hits

        c, tree = self.config, self.tree
        profile, draft_costs = None, None
        if self.engine is not None:
            costs = engine_costs(self.engine, c.outputs.cost_profile, c.max_copy)
        else:
            profile = load_profile(c.outputs, c.max_copy + 1, f"copying {c.max_copy} verifies "
                                   f"{c.max_copy + 1} (or lower --max-copy)", c.temperature)
            costs = step_costs(profile, c.max_copy)
            if tree is not None:
                draft_costs = draft_step_costs(profile, tree, c.max_copy + 2)

        def drafted(pair) -> dict | None:  # sampled beside a draft: through its first depth
            if tree is None or c.temperature <= 0:
                return None
            return {"draft": str(pair.draft_name), "width": tree.sizes[0], "verify": VERIFY}

        data = prepare_outputs(c.outputs, profile, c.temperature, drafted)
        traces = data.traces
        if tree is not None and drafted(data.pair) is None:
            traces = {name: draft_hits(data.pair, outs, tree.sizes[0],
                                       desc=f"draft candidates: {name}")
                      for name, outs in traces.items()}
        data = Priced(data.train_domains, data.eval_domains, profile, data.pair, traces, costs,
                      draft_costs)
        train = data.training()
        print(f"training on {len(train)} outputs ({sum(len(t.tokens) for t in train)} tokens)",
              flush=True)
        return data

    def fit(self, data: Priced, folder: Path) -> Fitted:
        c = self.config
        assert c.min_ngram is not None, "CopyConfig fills in the default"
        policy, text, facts = fitting.fit(data.training(), data.costs, c.min_ngram,
                                          seed=c.outputs.seed, draft_costs=data.draft_costs)
        policy.temperature, policy.draft_tree = c.temperature, c.k_config
        return Fitted(policy, text, facts)

    def choose(self, data: Priced, fitted: Fitted) -> CopyReport:
        """The policy chooses by its tuned rate; this replays it (the report)."""
        policy, a = fitted.policy, self.config
        with working(f"replaying the copy length and its peers on {len(data.traces)} sets"):
            domains = {name: compare(policy, data.costs, outs, name, name in data.train_domains)
                       for name, outs in data.traces.items()}
        train = data.training()
        mix = mix_comparison(policy, data.costs, train,
                             [domains[n] for n in data.train_domains],
                             min(a.folds, len(train)), a.outputs.seed)
        report, mixed, text = write_report(policy, list(domains.values()), mix)
        print(text)
        return CopyReport(report, mixed)

    def write(self, data: Priced, fitted: Fitted, chosen: CopyReport, folder: Path) -> None:
        o = self.config.outputs
        fitted.policy.save(folder, fitted.text, {
            "training": fitted.facts, "prompts": o.prompts, "target": o.target,
            "profile": str(o.cost_profile), "max_new_tokens": o.max_new_tokens, **chosen.fields()})

    def check(self, data: Priced, chosen: CopyReport, written: None) -> dict | None:
        c = self.config
        if not c.check_prompts:
            return None
        if data.profile is None:
            print("(no end-to-end check: it decodes in this toolkit's decoder, and the policy is "
                  "priced for the engine of --cost-profile; measure it there, e.g. `mcsd eval "
                  f"--engine vllm --methods proposer:{self.out}`)", flush=True)
            return None
        from mcsd_runtime.decisions.copy_length import CopyLength
        from replay.check import capped, copy_check, format_check

        policy = CopyLength.load(self.out)
        statics = capped([f"lookup:{DEPLOY[0]}:{DEPLOY[1]}", *CHECK_STATICS], policy.max_copy,
                         BESIDE if self.tree is not None else None)
        check = copy_check(data.pair, policy, {n: data.traces[n] for n in data.eval_domains},
                           statics, c.check_prompts, c.outputs.seed, progress=True,
                           tree=None if self.tree is None else self.tree.k_config,
                           profile=data.profile)
        print(format_check(check))
        return check


def engine_profile(path: Path) -> EngineProfile | None:
    """The serving engine's profile (`mcsd profile --engine vllm`) that `path` holds, or None
    where it holds another (this toolkit's cost profile, which `load_profile` reads and checks)."""
    import json

    from mcsd_runtime.serving.engine_profile import FORMAT, EngineProfile

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return EngineProfile.from_json(data, str(path))


def engine_costs(profile: EngineProfile, path: Path, max_copy: int) -> list[float]:
    """Seconds of a step verifying k copied tokens, k = 0..max_copy, at one request, from the
    serving engine's `profile` (read from `path`): its step drafting K=k (K=0: the speculative
    engine copying nothing, as the proposer class runs it, never priced below the engine
    without speculation, where the profile holds it: that step still runs the speculative
    path, and the profiler's K=0 point can time below plain). MCSDError where a K is missing,
    or where it holds no point at one request (the profile's other concurrencies would price
    it clamped)."""
    if 1 not in profile.concurrencies:
        raise MCSDError(f"--cost-profile {path} times {', '.join(map(str, profile.concurrencies))}"
                        f" requests, not one, which prices a copy: measure with `mcsd profile "
                        f"--engine {profile.engine} --batch-size 1,...`")
    if missing := [k for k in range(max_copy + 1) if k not in profile.ks]:
        raise MCSDError(f"--cost-profile {path} times K={', '.join(map(str, profile.ks))}; "
                        f"copying up to {max_copy} needs K={', '.join(map(str, missing))} too: "
                        f"measure with `mcsd profile --engine {profile.engine} --draft-lengths "
                        f"{','.join(map(str, range(max_copy + 1)))}`, or lower --max-copy")
    costs = [profile.step_seconds(1, k) for k in range(max_copy + 1)]
    if (plain := profile.plain_step_seconds(1)) is not None:
        costs[0] = max(costs[0], plain)
    return costs


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


