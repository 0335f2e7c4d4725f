"""`mcsd train --decision copy`: train a learned prompt-lookup copy length
(`lookup-learned:PATH`) on the target's outputs of training prompts (greedy, or sampled at
--temperature), report its replayed speed by category, on the training prompts and on held-out
ones, against static copy lengths and the hindsight oracle, and with --check-prompts, check the
replay against end-to-end decoding of held-out prompts. With --k-config, it learns to copy or
draft (`lookup-learned:PATH+static:1`) against `lookup:K:N+static:1`. (`mcsd train-lookup`
before; `train.cli` parses the options.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

from mcsd_runtime.errors import MCSDError

STATIC_GRID = [(k, n) for k in (8, 12, 15) for n in (2, 3, 4)]  # lookup:K:N replayed beside it
DEPLOY = (8, 3)  # the default `lookup` method
VERIFY = "mcss"  # the decoder's default sampling verifier, which sampled drafted steps replay
CHECK_STATICS = ("lookup:15:3", "lookup:12:2")  # decoded beside it by --check-prompts


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


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.cli.args import apply_threads, pair_from_args
    from mcsd_runtime.costmodel.profile import CostProfile
    from mcsd_runtime.extras import require_toolkit
    from train import copy_length as C

    require_toolkit("mcsd train --decision copy", "lightgbm")
    if args.min_ngram is None:
        args.min_ngram = 1 if args.k_config is None else 2
    if min(args.limit, args.eval_limit, args.max_copy, args.min_ngram, args.max_new_tokens) < 1:
        raise MCSDError("--limit, --eval-limit, --max-copy, --min-ngram and --max-new-tokens "
                        "must be positive")
    if args.temperature < 0 or args.check_prompts < 0 or args.folds < 0 or args.folds == 1:
        raise MCSDError("--temperature, --check-prompts and --folds must be >= 0 (0: greedy; no "
                        "check; no out-of-fold replay) and --folds not 1")
    if args.check_prompts and not args.eval_prompts:
        raise MCSDError("--check-prompts decodes held-out prompts: name them with "
                        "--eval-prompts")
    if args.min_ngram > 4:
        raise MCSDError("--min-ngram: matches are of 1..4 tokens; use 4 at most")
    if args.out.exists() and any(args.out.iterdir()) and not args.force:
        raise MCSDError(f"--out {args.out} exists and is not empty; pass --force to replace it")
    profile = CostProfile.load(args.cost_profile)
    if profile.tokens[-1] < args.max_copy + 1:
        raise MCSDError(f"--cost-profile {args.cost_profile} times forwards of up to "
                        f"{profile.tokens[-1]} tokens; copying {args.max_copy} verifies "
                        f"{args.max_copy + 1}: measure with `mcsd profile --max-tokens "
                        f"{args.max_copy + 1}` or lower --max-copy")
    if note := profile.temperature_note(args.temperature):
        print(note, flush=True)
    costs = C.step_costs(profile, args.max_copy)
    draft_costs = tree = None
    if args.k_config is not None:
        from mcsd_runtime.tree import Tree, parse_k_config

        tree = Tree(parse_k_config(args.k_config))
        draft_costs = C.draft_step_costs(profile, tree, args.max_copy + 2)
    train_domains, eval_domains = load_prompt_domains(args)
    apply_threads(args)
    pair = pair_from_args(args)
    drafted = None  # sampled beside a draft: outputs drawn through the draft's first depth
    if tree is not None and args.temperature > 0:
        drafted = {"draft": str(pair.draft_name), "width": tree.sizes[0], "verify": VERIFY}
    cache = TraceCache(args.traces, args.target, args.max_new_tokens, args.eos == "stop",
                       args.temperature, args.seed, drafted)
    traces = {name: cache.get(pair, prompts, args.chat, name)
              for name, (_, prompts) in (train_domains | eval_domains).items()}
    if tree is not None and drafted is None:
        traces = {name: C.draft_hits(pair, outs, tree.sizes[0], desc=f"draft candidates: {name}")
                  for name, outs in traces.items()}
    train = [t for name in train_domains for t in traces[name]]
    print(f"training on {len(train)} outputs ({sum(len(t.tokens) for t in train)} tokens)",
          flush=True)
    policy, text, facts = C.fit(train, costs, args.min_ngram, seed=args.seed,
                                draft_costs=draft_costs)
    policy.temperature, policy.draft_tree = args.temperature, args.k_config
    speeds = {name: replay_speeds(policy, costs, outs) for name, outs in traces.items()}
    report = replay_report(policy, speeds, set(train_domains))
    mix = mix_report(policy, costs, train, [speeds[n] for n in train_domains],
                     min(args.folds, len(train)), args.seed)
    if args.out.exists():
        shutil.rmtree(args.out)
    policy.save(args.out, text, {"training": facts, "prompts": args.prompts,
                                 "target": args.target, "profile": str(args.cost_profile),
                                 "max_new_tokens": args.max_new_tokens, "report": report,
                                 "training_mix": mix})
    print_report(report, policy.rate, mix)
    method = f"lookup-learned:{args.out}" + (
        f"+{C.BESIDE} --k-config {args.k_config}" if tree is not None else "")
    print(f"-> {args.out} (decode with `mcsd eval --methods {method}`)", flush=True)
    if args.check_prompts:
        from train.copy_check import capped, end_to_end_check, format_check

        statics = capped([f"lookup:{DEPLOY[0]}:{DEPLOY[1]}", *CHECK_STATICS], policy.max_copy,
                         C.BESIDE if tree is not None else None)
        check = end_to_end_check(pair, policy, {n: traces[n] for n in eval_domains}, statics,
                                 args.check_prompts, args.seed, progress=True,
                                 tree=None if tree is None else tree.k_config,
                                 profile=profile)
        (args.out / "check.json").write_text(json.dumps(check, indent=1))
        print(format_check(check))
    return 0


def replay_speeds(policy, costs: list[float], outs: list) -> dict[str, list[float]]:
    """Per output, the replayed speed over AR of the policy (`learned`), of each static
    `lookup:K:N` (composed with `static:1` when the policy was trained beside a draft) and of
    the hindsight oracle; beside a draft also of the draft alone (`draft`) and of the oracle
    over the policy's own choices (`oracle_choices`: copy or draft, never the target alone)."""
    from train import copy_length as C

    top, beside = policy.max_copy, policy.draft_costs
    walk = {"draft_costs": beside, "prior": policy.draft_prior}
    learned = [C.Replay(t, policy.max_copy, policy.min_ngram, policy.max_ngram) for t in outs]
    speeds = {"learned": [r.speedup(policy.choose, costs, **walk) for r in learned],
              "oracle": [r.oracle_speedup(costs, beside) for r in learned]}
    for k, n in sorted({(min(k, top), n) for k, n in STATIC_GRID}):  # none copies more than it
        speeds[_static(k, n, beside)] = [C.Replay(t, k, n, 4).speedup(
            C.copy_all(k), costs[: k + 1], **walk) for t in outs]
    if beside is not None:
        speeds["draft"] = [r.speedup(C.never, costs, **walk) for r in learned]
        speeds["oracle_choices"] = [r.oracle_speedup(costs, beside, alone=False)
                                    for r in learned]
    return speeds


def _static(k: int, n: int, beside) -> str:
    from train.copy_length import BESIDE

    return f"lookup:{k}:{n}" + (f"+{BESIDE}" if beside is not None else "")


def replay_report(policy, speeds: dict[str, dict[str, list[float]]],
                  trained: set[str]) -> list[dict]:
    """Per domain, from its `replay_speeds`: geometric means over AR; the policy's paired
    speedup over the deploy static and the domain's best static; the share of the oracle's
    gain over the deploy static it takes."""
    from mcsd_runtime.metrics import paired_speedup

    deploy = _static(min(DEPLOY[0], policy.max_copy), DEPLOY[1], policy.draft_costs)
    rows = []
    for name, sp in speeds.items():
        gms = {m: _geomean(v) for m, v in sp.items() if m.startswith("lookup:")}
        best = max(gms, key=gms.get)
        ours, oracle = _geomean(sp["learned"]), _geomean(sp["oracle"])
        row = {"domain": name, "trained": name in trained, "prompts": len(sp["learned"]),
               "learned_vs_ar": ours, "best_static": best, "best_static_vs_ar": gms[best],
               "deploy": deploy, "deploy_vs_ar": gms[deploy], "oracle_vs_ar": oracle,
               "oracle_share": _share(ours, gms[deploy], oracle),
               "vs_deploy": paired_speedup(sp["learned"], sp[deploy]),
               "vs_best_static": paired_speedup(sp["learned"], sp[best])}
        if "draft" in sp:
            row["draft_vs_ar"] = _geomean(sp["draft"])
            row["oracle_choices_vs_ar"] = _geomean(sp["oracle_choices"])
            row["oracle_choices_share"] = _share(ours, gms[deploy], row["oracle_choices_vs_ar"])
        rows.append(row)
    return rows


def mix_report(policy, costs: list[float], train: list, speeds: list[dict[str, list[float]]],
               folds: int, seed: int) -> dict:
    """The training mix pooled (geometric means over its outputs, from the training domains'
    `replay_speeds`): the policy, the deploy static and the oracle over AR, the policy's share
    of the oracle's gain, and with `folds` the same for the policy out of fold
    (`copy_length.out_of_fold`; None where a fold holds too few repeats to fit)."""
    from train import copy_length as C

    deploy = _static(min(DEPLOY[0], policy.max_copy), DEPLOY[1], policy.draft_costs)
    pooled = {m: [v for sp in speeds for v in sp[m]] for m in speeds[0]}
    learned, static = _geomean(pooled["learned"]), _geomean(pooled[deploy])
    oracle = _geomean(pooled["oracle"])
    mix = {"outputs": len(train), "learned_vs_ar": learned, "deploy_vs_ar": static,
           "oracle_vs_ar": oracle, "oracle_share": _share(learned, static, oracle),
           "folds": folds, "out_of_fold_vs_ar": None, "out_of_fold_share": None}
    if "oracle_choices" in pooled:
        mix["oracle_choices_vs_ar"] = _geomean(pooled["oracle_choices"])
        mix["oracle_choices_share"] = _share(learned, static, mix["oracle_choices_vs_ar"])
    if folds:
        try:
            speed = C.out_of_fold(train, costs, folds, seed, min_ngram=policy.min_ngram,
                                  max_ngram=policy.max_ngram, draft_costs=policy.draft_costs)
        except MCSDError:
            return mix
        mix["out_of_fold_vs_ar"] = _geomean(speed)
        mix["out_of_fold_share"] = _share(mix["out_of_fold_vs_ar"], static, oracle)
    return mix


def _geomean(values: list[float]) -> float:
    import numpy as np

    return float(np.exp(np.log(values).mean()))


def _share(ours: float, deploy: float, oracle: float) -> float | None:
    """The share of the oracle's gain over the deploy static that `ours` takes."""
    return (ours - deploy) / (oracle - deploy) if oracle > deploy else None


def print_report(report: list[dict], rate: float, mix: dict | None = None) -> None:
    choices = "oracle_choices_vs_ar" in report[0]
    print(f"replayed speed (tuned rate {rate:.1f} tokens/s); learned vs {report[0]['deploy']} "
          f"and vs the domain's best static copy length, 95% CI:")
    wide = max(len(r["best_static"]) for r in report)
    print(f"{'domain':32} {'n':>3} {'vs AR':>6}  {'vs deploy':>21}  "
          f"{'vs best static':>{24 + wide}}  {'oracle':>6} {'share':>6}"
          + (f" {'oracle*':>7} {'share*':>6}" if choices else ""))
    for r in sorted(report, key=lambda r: r["vs_best_static"]["geomean"]):
        d, b = r["vs_deploy"], r["vs_best_static"]
        label = r["domain"] + (" (trained)" if r["trained"] else "")
        line = (f"{label:32} {r['prompts']:>3} {r['learned_vs_ar']:6.3f}  {d['geomean']:6.3f} "
                f"[{d['ci_low']:.3f}, {d['ci_high']:.3f}]  {b['geomean']:6.3f} "
                f"[{b['ci_low']:.3f}, {b['ci_high']:.3f}] {r['best_static']:>{wide}}  "
                f"{r['oracle_vs_ar']:6.3f} {_pct(r['oracle_share']):>6}")
        if choices:
            line += f" {r['oracle_choices_vs_ar']:7.3f} {_pct(r['oracle_choices_share']):>6}"
        print(line)
    print("(vs AR: replayed speed over the target alone; oracle: the hindsight-best choice at "
          "every step, over AR; share: of the oracle's gain over the deploy static, the "
          "policy's" + ("; oracle*, share*: the same for an oracle that, as the policy, copies "
                        "or drafts and never lets the target decode alone)" if choices else ")"))
    if mix:
        line = (f"training mix, {mix['outputs']} outputs pooled: learned {mix['learned_vs_ar']:.3f}"
                f" AR, deploy {mix['deploy_vs_ar']:.3f}, oracle {mix['oracle_vs_ar']:.3f}; "
                f"share {_pct(mix['oracle_share'])}")
        if "oracle_choices_vs_ar" in mix:
            line += (f"; oracle* {mix['oracle_choices_vs_ar']:.3f}, share* "
                     f"{_pct(mix['oracle_choices_share'])}")
        if mix["folds"]:
            line += (f"; out of fold ({mix['folds']} folds) learned "
                     f"{mix['out_of_fold_vs_ar']:.3f}, share {_pct(mix['out_of_fold_share'])}"
                     if mix["out_of_fold_vs_ar"] is not None else
                     "; out of fold: a fold holds too few repeats to fit")
        print(line)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


class TraceCache:
    """The target's outputs by prompt, kept in a JSON file when one is given."""

    def __init__(self, path: Path | None, target: str, max_new_tokens: int,
                 stop_at_eos: bool, temperature: float = 0.0, seed: int = 0,
                 drafted: dict | None = None) -> None:
        self.path = path
        self.key = {"target": target, "max_new_tokens": max_new_tokens,
                    "stop_at_eos": stop_at_eos}
        if temperature > 0:  # greedy outputs need neither
            self.key |= {"temperature": temperature, "seed": seed}
        if drafted is not None:  # outputs drawn through a draft's verification, with hits
            self.key |= {"drafted": drafted}
        self.traces: dict[str, list] = {}
        if path is not None and path.exists():
            try:
                data = json.loads(path.read_text())
            except ValueError as err:
                raise MCSDError(f"--traces {path} is not JSON ({err}); delete it") from None
            if data.get("key") != self.key:
                raise MCSDError(f"--traces {path} holds outputs of {data.get('key')}, not "
                                f"{self.key}: use another file")
            self.traces = data["traces"]

    def get(self, pair, prompts: list, chat: str, name: str) -> list:
        from mcsd_runtime.evaluate.runners import encode_prompt
        from train.copy_length import Trace, drafted_traces, target_traces

        ids = [encode_prompt(pair, p, chat) for p in prompts]
        keys = [hashlib.sha1(json.dumps(i).encode()).hexdigest() for i in ids]
        todo = [i for i, k in zip(ids, keys, strict=True) if k not in self.traces]
        if todo:
            k = self.key
            if "drafted" in k:
                made = drafted_traces(pair, todo, k["max_new_tokens"], k["temperature"],
                                      k["drafted"]["width"], k["drafted"]["verify"], k["seed"],
                                      k["stop_at_eos"], desc=f"outputs with drafted steps: {name}")
            else:
                made = target_traces(pair, todo, k["max_new_tokens"], k.get("temperature", 0.0),
                                     k.get("seed", 0), k["stop_at_eos"],
                                     desc=f"target outputs: {name}")
            for t in made:
                self.traces[hashlib.sha1(json.dumps(t.prompt).encode()).hexdigest()] = [
                    t.tokens, t.conf, *([t.hits] if t.hits is not None else [])]
            self.save()
        return [Trace(i, *self.traces[k]) for i, k in zip(ids, keys, strict=True)]

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps({"key": self.key, "traces": self.traces}))
        tmp.replace(self.path)
