"""Replay against a finished `mcsd eval`, prompt by prompt: does the cost model rank methods as
the decoder does?

`mcsd replay --runs DIR... --eval EVAL... --cost-profile cost.json`
replays every method of the evaluation (AR, static depths, built-in and trained stoppers) on
dense collections of the same prompts (`mcsd collect --dense` on the sets and seeds the
evaluation drew) and compares, per prompt, each method's speed relative to a base method
(`--base`, default `static:1`) as replayed and as measured: the ratio measured / replayed, pooled
over prompts, categories and every evaluation folder given (several runs of the same command
average the timing noise out), as a geometric mean with a 95% bootstrap interval
(`metrics.paired_speedup`), the per-prompt spread
and the geometric mean per category. 1.00 is a replay that ranks the method against the base as
the decoder did. Measured speeds leave the prefill out where the records carry it (evaluations
from this version on); older records include it, which pulls AR's ratio toward the base's.

Two things separate a prompt's measured ratio from its replayed one besides the cost model:
the machine's timing noise, and (in bf16) outputs that differ between methods, so each decodes
another continuation; the collection replays one continuation for all methods.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.metrics import paired_speedup

UNREPLAYED = ("hf", "hf-assisted", "hf-static")


def eval_records(folder: Path) -> dict[str, dict[str, dict[str, float]]]:
    """category -> prompt id -> method -> decode-phase tokens/s, from one `mcsd eval` folder
    (its category subfolders, or the folder itself)."""
    from mcsd_runtime.evaluate.domain_report import read_records

    parts = sorted(p.parent for p in folder.glob("*/per_prompt.jsonl"))
    if (folder / "per_prompt.jsonl").is_file():
        parts = [folder]
    if not parts:
        raise MCSDError(f"{folder} holds no per_prompt.jsonl: pass folders written by mcsd eval")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for part in parts:
        for r in read_records(part):
            if r.sample or r.batch_id:
                raise MCSDError(f"{part}: compare single greedy decodes at batch size 1 (this "
                                f"evaluation has samples or batches)")
            seconds = r.wall_time - (r.prefill_time or 0.0)
            out.setdefault(part.name, {}).setdefault(r.prompt_id, {})[r.method] = (
                r.new_tokens / seconds)
    return out


def replay_method(spec: str):
    """The stopper replay runs for an eval method name, with its charged decision seconds."""
    from replay import NeverDraft

    if spec == "ar":
        return NeverDraft(), 0.0
    if spec.startswith("stopper:"):
        from mcsd_runtime.decisions.learned import load_stopper

        folder = Path(spec.partition(":")[2])
        metrics = folder / "metrics.json"
        us = (json.loads(metrics.read_text()).get("headline", {}).get("replay_decision_us")
              if metrics.is_file() else None)
        return load_stopper(folder), (us or 0.0) * 1e-6
    if spec.startswith(("mcsd", "hf")):
        raise MCSDError(f"{spec}: replay covers ar, static depths and stoppers of the collected "
                        f"tree, not other trees or generate()")
    return spec, 0.0


def eval_trees(folder: Path) -> set[str]:
    """The k-configs an evaluation decoded with (its summary.json files' settings)."""
    paths = [folder / "summary.json", *sorted(folder.glob("*/summary.json"))]
    return {json.loads(p.read_text()).get("settings", {}).get("k_config") for p in paths
            if p.is_file()} - {None}


def replayed(collections: list[str], profile, methods: list[str], trees: set[str]
             ) -> dict[str, dict[str, float]]:
    """prompt id -> method -> replayed tokens/s on the dense collections (which must have
    been collected on the evaluations' tree, `trees`)."""
    import replay as R
    from mcsd_runtime.tree import k_text
    from replay.runs import collected_k_config, load_runs, output_lengths

    df, manifests = load_runs(collections)
    k_config = collected_k_config(manifests)
    for tree in trees:
        if k_config is not None and tree != k_text(k_config):
            raise MCSDError(f"the evaluation decoded k-config {tree} but the collections hold "
                            f"{k_text(k_config)} trees: collect with --k-config {tree}")
    lengths = output_lengths(manifests)
    runners = {m: replay_method(m) for m in methods}
    out: dict[str, dict[str, float]] = {}
    for pid, part in df.groupby("prompt_id"):
        data = R.ReplayData(part.reset_index(drop=True), k_config, mode="auto",
                            new_tokens={k: v for k, v in lengths.items()
                                        if k.endswith("/" + str(pid))})
        out[str(pid)] = {m: R.replay(data, s, profile, name=m, decision_s=d).throughput
                         for m, (s, d) in runners.items()}
    return out


def compare(measured: list[dict], replay: dict[str, dict[str, float]], base: str
            ) -> dict[str, dict]:
    """Per method: measured/replayed ratio to `base`, pooled (geometric mean, 95% interval,
    per-prompt sd of the log) and per category."""
    ratios: dict[str, list[tuple[str, float, float]]] = {}
    for run in measured:
        for cat, prompts in run.items():
            for pid, speeds in prompts.items():
                if pid not in replay or base not in speeds:
                    continue
                for m, v in speeds.items():
                    if m == base or m not in replay[pid]:
                        continue
                    measured_ratio = v / speeds[base]
                    replayed_ratio = replay[pid][m] / replay[pid][base]
                    ratios.setdefault(m, []).append((cat, measured_ratio, replayed_ratio))
    if not ratios:
        raise MCSDError(f"no prompt of the evaluations is in the collections with {base!r} "
                        f"measured: collect the evaluation's own prompt sets, seed and limit")
    out = {}
    for m, rows in ratios.items():
        pooled = paired_speedup([e for _, e, _ in rows], [r for _, _, r in rows])
        logs = np.log([e / r for _, e, r in rows])
        cats = dict.fromkeys(c for c, _, _ in rows)
        out[m] = {"n": pooled["n"], "ratio": pooled["geomean"],
                  "ci": [pooled["ci_low"], pooled["ci_high"]],
                  "sd": float(logs.std(ddof=1)) if len(logs) > 1 else float("nan"),
                  "by_category": {c: paired_speedup([e for cc, e, _ in rows if cc == c],
                                                    [r for cc, _, r in rows if cc == c])["geomean"]
                                  for c in cats}}
    return out


def table(result: dict[str, dict], base: str) -> str:
    cats = list(dict.fromkeys(c for v in result.values() for c in v["by_category"]))
    lines = [f"measured / replayed speed relative to {base} (1.00: replay ranks it as measured)",
             f"| method | prompts | ratio [95% CI] | per-prompt sd | {' | '.join(cats)} |",
             "|---|---|---|---|" + "---|" * len(cats)]
    for m, v in result.items():
        per = " | ".join(f"{v['by_category'][c]:.3f}" if c in v["by_category"] else "-"
                         for c in cats)
        lines.append(f"| {m} | {v['n']} | {v['ratio']:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]"
                     f" | {v['sd']:.3f} | {per} |")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    """`mcsd replay`."""
    from mcsd_runtime.cli.args import add_cost_profile_arg, add_out_arg, add_runs_arg

    p = sub.add_parser("replay", help="replay a finished `mcsd eval`'s methods on dense "
                                      "collections and compare with what it measured",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_runs_arg(p, "dense collection folders of the evaluation's prompts (mcsd collect "
                    "--dense, same sets, --limit and --seed as the evaluation); required")
    p.add_argument("--eval", nargs="+", required=True, dest="evals",
                   help="mcsd eval output folders (several runs pool their timing noise)")
    add_cost_profile_arg(p, "the cost profile replay charges", required=True)
    p.add_argument("--base", default="static:1", help="method every ratio is taken against")
    add_out_arg(p, "also write the result as JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """`mcsd replay`: its options checked, then `vs_eval`, printed (and written to --out)."""
    from mcsd_runtime.pricing.profile import CostProfile

    if not args.runs:
        raise MCSDError("--runs DIR... is required: the dense collections to replay")
    for path in [*args.runs, *args.evals]:
        if not Path(path).is_dir():
            raise MCSDError(f"no folder at {path}")
    result = vs_eval([Path(r) for r in args.runs], [Path(e) for e in args.evals],
                     CostProfile.load(args.cost_profile), args.base)
    print(table(result, args.base))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def vs_eval(collections: list[Path], evals: list[Path], profile, base: str = "static:1"
            ) -> dict[str, dict]:
    """Every replayable method of the evaluation folders `evals` replayed on the dense
    `collections` with the cost `profile`, against what the evaluations measured: per method,
    `compare`'s ratios to `base` (MCSDError if `base` is not among the methods)."""
    measured = [eval_records(e) for e in evals]
    methods = sorted({m for run in measured for ps in run.values() for s in ps.values()
                      for m in s})
    # transformers' own generate() (hf, hf-assisted, hf-static) and mcsd* replay nothing
    methods = [m for m in methods if m.split(":")[0] not in UNREPLAYED
               and not m.startswith("mcsd")]
    if base not in methods:
        raise MCSDError(f"--base {base} is not a method of the evaluations "
                        f"({', '.join(methods)})")
    trees = set().union(*(eval_trees(e) for e in evals))
    return compare(measured, replayed([str(c) for c in collections], profile, methods, trees),
                   base)
