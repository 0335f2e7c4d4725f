"""`mcsd train --decision schedule`: the draft length K to use at each batch size of a serving
engine, chosen by replaying acceptance traces at the engine's measured step costs, through the
stages every decision runs (`train.decision`).

- **prepare**: the steps of every --runs folder (engine traces, or dense collections of a
  chain: `train.schedule.acceptance`), split by prompt into validation and held-out test prompts
  (seeded, within each category), and the engine profile (`mcsd_runtime.serving.engine_profile`)
  that prices them;
- **fit**: each K's expected accepted tokens, E[min(L, k)], per split, pooled and per category
  (the model and which steps tell about which K: `train.schedule.acceptance`);
- **choose**: the bands start at the profile's measured concurrencies (or --batch-size), each
  covering up to the next, the first from 1 and the last open-ended. A request-step at K=k
  commits 1 + E[min(L, k)] tokens, so at concurrency c the engine's replayed throughput is
  c * (1 + E[min(L, k)]) / step_seconds(c, E[min(D, k)]) tokens/s, a step priced by the tokens
  its requests draft at K=k (D: what a step drafted; none where the n-gram matcher found no
  match, fewer than k where its match ran short), between the profile's measured K; each band
  takes the K of the highest throughput at its start on validation prompts (the smaller K of
  equals), pooled and for each category with enough prompts. The report, on held-out test
  prompts, sets each band's K beside the best single K (one K for every band, the highest
  geometric mean over the bands on the same validation prompts), a K=0 band (the speculative
  engine drafting nothing) and, where the profile measured it, the engine without speculation
  (`plain`: c / its step time, one token a request a step). A note names every band whose
  replayed speed falls below plain's: a table cannot turn the speculative path off;
- **write**: `report.json`, `report.md`, and last `schedule.json` (the bands and the report:
  `mcsd_runtime.serving.schedule`), into a staging folder that replaces --out once complete
  (`run_schedule`; no `decision.json`: the schedule is an engine's table, not a decision our
  decoder loads, and `schedule.json` marks the folder complete).

Export it for an engine with `mcsd export FOLDER --engine vllm|trtllm|sglang --out FILE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from mcsd_runtime import metrics
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import atomic_write_text, build_folder
from mcsd_runtime.serving.engine_profile import EngineProfile
from mcsd_runtime.serving.schedule import Band, Schedule, json_text
from replay.result import ABSENT, Column, Comparison, Report
from train.decision import refuse_existing
from train.schedule.acceptance import (
    SPLITS,
    Estimate,
    expected_accepted,
    read_source,
    split_steps,
)
from train.schedule.config import ScheduleConfig

POOLED = "all"  # the report's name of the pooled group
SPEEDS = ("schedule", "single K", "K=0")  # the report's columns; "plain" where profiled


@dataclass
class Data:
    """The steps (with their split), the profile pricing them, where they came from."""

    steps: pd.DataFrame
    profile: EngineProfile
    sources: list[dict]
    categories: list[str]  # those with bands of their own
    notes: list[str] = field(default_factory=list)


@dataclass
class Fitted:
    """E[min(L, k)] by (group, split) and k; `ks`: the Ks tried (0 first)."""

    ks: tuple[int, ...]
    estimates: dict[tuple[str, str], dict[int, Estimate]]


@dataclass
class Chosen:
    schedule: Schedule
    report: dict[str, Any]
    markdown: str


class ScheduleTrainer:
    """`train.decision.Trainer` of the K-by-batch-size schedule (module docstring),
    `Trainer[Data, Fitted, Chosen, None]`."""

    decision = "schedule"

    def __init__(self, config: ScheduleConfig, log=print) -> None:
        self.out, self.config, self.log = config.out, config, log

    def decode(self) -> str:
        return f"mcsd export {self.out} --engine vllm --out k_by_batch.json"

    def prepare(self) -> Data:
        profile = EngineProfile.load(self.config.cost_profile)
        if 0 not in profile.ks:
            raise MCSDError(f"{self.config.cost_profile} has no K=0 (no speculation) points: the "
                            f"schedule weighs every K against none; measure K=0 with `mcsd "
                            f"profile --engine {profile.engine}`")
        frames, sources = [], []
        for run in self.config.runs:
            steps, source = read_source(Path(run))
            frames.append(steps)
            sources.append(source | {"steps": len(steps)})
        _check_method(sources, profile)
        steps, categories = split_steps(pd.concat(frames, ignore_index=True),
                                        self.config.test_frac, self.config.seed)
        if steps.empty:
            raise MCSDError("the --runs folders hold no drafting steps")
        return Data(steps, profile, sources, categories)

    def fit(self, data: Data, folder: Path) -> Fitted:
        """E[min(L, k)] for every K tried (module docstring of `train.schedule.acceptance`)."""
        ks = _ks_tried(data, self.config.max_k)
        estimates = {}
        for group in (POOLED, *data.categories):
            steps = data.steps if group == POOLED else data.steps[data.steps.category == group]
            for split in SPLITS:
                part = steps[steps.split == split]
                estimates[(group, split)] = {k: expected_accepted(part, k) for k in ks}
        return Fitted(ks, estimates)

    def choose(self, data: Data, fitted: Fitted) -> Chosen:
        """Each band's K per group and the report (printed)."""
        starts = _band_starts(self.config.batch_sizes or data.profile.concurrencies, data)
        groups, bands = {}, {}
        for group in (POOLED, *data.categories):
            comparisons, single = _choose_group(group, starts, fitted, data.profile)
            records, table = REPORT.write(comparisons)
            groups[group] = {"single_k": single, "bands": records}
            bands[group] = tuple(Band(lo, hi, c.facts["k"]) for (lo, hi, _), c
                                 in zip(starts, comparisons, strict=True))
            self.log(f"{group}: K by batch size (tokens/s replayed on held-out test prompts; "
                     f"single K={single})\n{table}")
            data.notes += _below_plain(group, comparisons)
        report = self._report(data, fitted, starts, groups)
        for note in data.notes:
            self.log(f"note: {note}")
        meta = self._meta(data) | {"runs": [s["path"] for s in data.sources],
                                   "created": datetime.now(UTC).isoformat(timespec="seconds")}
        schedule = Schedule(bands[POOLED], {g: bands[g] for g in data.categories}, meta, report)
        return Chosen(schedule, report, report_markdown(report))

    def write(self, data: Data, fitted: Fitted, chosen: Chosen, folder: Path) -> None:
        atomic_write_text(folder / "report.json", json_text(chosen.report))
        atomic_write_text(folder / "report.md", chosen.markdown)
        chosen.schedule.write(folder)  # last

    def check(self, data: Data, chosen: Chosen, written: None) -> dict | None:
        return None

    def _meta(self, data: Data) -> dict[str, Any]:
        """What the schedule was trained for: the engine, model and method of its profile."""
        p = data.profile
        return {"engine": p.engine, "engine_version": p.engine_version, "model": p.model,
                "dtype": p.dtype, "method": p.method,
                "cost_profile": str(self.config.cost_profile)} | _ngram_sizes(data.sources)

    def _report(self, data: Data, fitted: Fitted, starts, groups: dict) -> dict[str, Any]:
        prompts = data.steps.groupby("split")["prompt"].nunique()
        return {"engine": self._meta(data),
                "batch_sizes": [c for _, _, c in starts],
                "prompts": {s: int(prompts.get(s, 0)) for s in SPLITS},
                "sources": data.sources, "categories": data.categories, "groups": groups,
                "acceptance": {g: {s: {str(k): {"mean_accepted": _finite(e.accepted),
                                                "steps": e.steps}
                                       for k, e in fitted.estimates[(g, s)].items()}
                                   for s in SPLITS}
                               for g in (POOLED, *data.categories)},
                "notes": data.notes}


def run_schedule(trainer: ScheduleTrainer, force: bool = False) -> int:
    """The stages into a staging folder that then replaces `trainer.out` (as `train.decision.
    train`, without `decision.json`: `schedule.json` is written last and marks it complete)."""
    out = trainer.out
    refuse_existing(out, force)

    def stages(folder: Path) -> None:
        data = trainer.prepare()
        fitted = trainer.fit(data, folder)
        trainer.write(data, fitted, trainer.choose(data, fitted), folder)

    build_folder(out, "the schedule", "pass another --out", stages)
    trainer.log(f"-> {out} (export with `{trainer.decode()}`)")
    return 0


def _check_method(sources: list[dict], profile: EngineProfile) -> None:
    """MCSDError when traces name another engine or drafting method than the profile's."""
    def norm(m: str) -> str:
        return {"draft_model": "draft"}.get(m.lower(), m.lower())

    engines = sorted({e for s in sources for e in s["engines"] if norm(e) != norm(profile.engine)})
    other = sorted({m for s in sources for m in s["methods"] if norm(m) != norm(profile.method)})
    if engines or other:
        what = (f"come from {', '.join(engines)}, but the profile measured {profile.engine}"
                if engines else f"were drafted by {', '.join(other)}, but the profile measured "
                f"{profile.method}")
        raise MCSDError(f"the traces {what}: price traces with a profile of their own engine "
                        f"and method (`mcsd profile --engine ENGINE`)")


def _ks_tried(data: Data, max_k: int | None) -> tuple[int, ...]:
    """The Ks the profile measured, up to `max_k` and to the largest the traces drafted to."""
    deepest = int(data.steps["cap"].max())
    top = deepest if max_k is None else min(max_k, deepest)
    if max_k is not None and max_k > deepest:
        data.notes.append(f"K above {deepest} not tried: no step was allowed to draft more")
    ks = tuple(k for k in data.profile.ks if k <= top)
    if len(ks) < 2:
        raise MCSDError(f"the profile measured K={', '.join(map(str, data.profile.ks))} and the "
                        f"traces drafted up to {deepest} tokens (--max-k {max_k}): nothing to "
                        f"weigh against K=0; measure K=1..{top} with `mcsd profile --engine "
                        f"{data.profile.engine}`")
    return ks


def _band_starts(sizes, data: Data) -> list[tuple[int, int | None, int]]:
    """(lo, hi, c) of each band: batch sizes `sizes[i]`.. up to the next one's start, the
    first from 1, the last open; `c` the concurrency it is priced at (its first size)."""
    sizes = sorted(set(sizes))
    out = [(1 if i == 0 else c, sizes[i + 1] - 1 if i + 1 < len(sizes) else None, c)
           for i, c in enumerate(sizes)]
    top = max(data.profile.concurrencies)
    if sizes[0] > 1:
        data.notes.append(f"batch sizes 1-{sizes[0] - 1} take the K chosen at {sizes[0]}")
    if sizes[-1] > top:
        data.notes.append(f"batch sizes above {top} are priced at the profile's step times "
                          f"at {top} (the largest concurrency measured)")
    return out


def _choose_group(group: str, starts, fitted: Fitted, profile: EngineProfile
                  ) -> tuple[list[Comparison], int]:
    """Each band's Comparison (facts: its K, the single K) and the best single K, `group`'s
    K chosen on validation prompts and replayed on test prompts (module docstring)."""
    val, test = fitted.estimates[(group, "val")], fitted.estimates[(group, "test")]
    ks = [k for k in fitted.ks if val[k].steps > 0]

    def speed(est: dict[int, Estimate], c: int, k: int) -> float:
        e = est[k]
        if not e.steps:
            return math.nan
        return c * (1 + e.accepted) / profile.step_seconds_drafting(c, e.drafted)

    def best(c: int) -> int:  # on validation prompts, at concurrency c
        return max(ks, key=lambda k: (speed(val, c, k), -k))

    single = max(ks, key=lambda k: (metrics.geomean([speed(val, c, k) for *_, c in starts]), -k))
    out = []
    for lo, hi, c in starts:
        k = best(c)
        speeds = dict(zip(SPEEDS, (speed(test, c, k), speed(test, c, single), speed(test, c, 0)),
                          strict=True))
        plain = profile.plain_step_seconds(c)
        if plain is not None:
            speeds["plain"] = c / plain
        out.append(Comparison(Band(lo, hi, k).label, speeds, "K=0",
                              learned="schedule",
                              facts={"k": k, "single_k": single, "concurrency": c,
                                     "test_steps": test[k].steps,
                                     "val_tokens_per_s": speed(val, c, k)}))
    return out, single


def _below_plain(group: str, comparisons: list[Comparison]) -> list[str]:
    """A note for each band of `group` replayed below the engine without speculation."""
    return [f"{group}, batch sizes {c.group}: K={c.facts['k']} replays at "
            f"{c.ratio(over='plain'):.3f}x the engine without speculation (its K=0 band at "
            f"{c.ratio('K=0', over='plain'):.3f}x): a table cannot turn the speculative path "
            f"off; at these batch sizes, serving without speculation is faster"
            for c in comparisons if (c.ratio(over="plain") or math.inf) < 1]


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


def _plain(c: Comparison, value: Any) -> Any:
    """`value`, or ABSENT where the profile has no plain engine's step times."""
    return value if "plain" in c.speeds else ABSENT


def _tps(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.1f}"


REPORT = Report(
    (Column("band", lambda c: c.group),
     Column("k", lambda c: c.facts["k"], "K", str),
     Column("concurrency", lambda c: c.facts["concurrency"], "at c", str),
     Column("tokens_per_s", lambda c: _finite(c.speed()), "tokens/s", _tps),
     Column("single_k", lambda c: c.facts["single_k"], "single K", str),
     Column("single_k_tokens_per_s", lambda c: _finite(c.speed("single K")),
            "single tokens/s", _tps),
     Column("no_spec_tokens_per_s", lambda c: _finite(c.speed("K=0")), "K=0 tokens/s", _tps),
     Column("vs_single_k", lambda c: _finite(c.ratio(over="single K")), "vs single"),
     Column("vs_no_spec", lambda c: _finite(c.ratio()), "vs K=0"),
     Column("plain_tokens_per_s", lambda c: _plain(c, _finite(c.speed("plain")))),
     Column("vs_plain", lambda c: _plain(c, _finite(c.ratio(over="plain"))), "vs plain"),
     Column("test_steps", lambda c: c.facts["test_steps"], "test steps", str),
     Column("val_tokens_per_s", lambda c: _finite(c.facts["val_tokens_per_s"]))),
    label=Column("band", lambda c: c.group, "batch sizes"))


def report_markdown(report: dict[str, Any]) -> str:
    """`report.md`: the settings, each group's bands against the single K, K=0 and (where
    profiled) the engine without speculation, and each K's expected accepted tokens."""
    eng = report["engine"]
    lines = [f"# K by batch size: {eng['engine']} {eng['engine_version']}, {eng['model']} "
             f"({eng['dtype']}), {eng['method']}", "",
             f"Chosen on {report['prompts']['val']} validation prompts, replayed on "
             f"{report['prompts']['test']} held-out test prompts at the step times of "
             f"`{eng['cost_profile']}`: tokens/s = c * (1 + E[min(L, K)]) / "
             f"step_seconds(c, E[min(D, K)]) (D: the tokens a step drafted).",
             ""]
    for group, g in report["groups"].items():
        plain = any("vs_plain" in r for r in g["bands"])
        lines += [f"## {group}", "", "| batch sizes | K | tokens/s | single K "
                  f"(K={g['single_k']}) | K=0 |" + (" plain |" if plain else "")
                  + " vs single K | vs K=0 |" + (" vs plain |" if plain else "")
                  + " test steps |", "|---|---|---|---|---|---|---|---|"
                  + ("---|---|" if plain else "")]
        for r in g["bands"]:
            lines.append(f"| {r['band']} | {r['k']} | "
                         f"{_tps(_nan(r.get('tokens_per_s')))} | "
                         f"{_tps(_nan(r.get('single_k_tokens_per_s')))} | "
                         f"{_tps(_nan(r.get('no_spec_tokens_per_s')))} | "
                         + (f"{_tps(_nan(r.get('plain_tokens_per_s')))} | " if plain else "")
                         + f"{_ratio(r.get('vs_single_k'))} | {_ratio(r.get('vs_no_spec'))} | "
                         + (f"{_ratio(r.get('vs_plain'))} | " if plain else "")
                         + f"{r['test_steps']} |")
        lines += ["", _acceptance_table(report["acceptance"][group]), ""]
    lines += [f"- {note}" for note in report["notes"]]
    return "\n".join(lines).rstrip() + "\n"


def _acceptance_table(acc: dict) -> str:
    rows = ["| K | E[min(L,K)] val | steps | E[min(L,K)] test | steps |", "|---|---|---|---|---|"]
    for k in acc["val"]:
        v, t = acc["val"][k], acc["test"][k]
        rows.append(f"| {k} | {_ratio(v['mean_accepted'])} | {v['steps']} | "
                    f"{_ratio(t['mean_accepted'])} | {t['steps']} |")
    return "\n".join(rows)


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


NGRAM_SIZES = ("prompt_lookup_min", "prompt_lookup_max")


def _ngram_sizes(sources: list[dict]) -> dict[str, int]:
    """The n-gram sizes every trace ran with, where all say and agree (so that a table serves
    the matcher its acceptance was measured under); else none."""
    sizes: set[tuple[Any, ...]] = {tuple((s.get("speculative") or {}).get(k) for k in NGRAM_SIZES)
                                   for s in sources}
    if len(sizes) != 1:
        return {}
    (found,) = sizes
    return dict(zip(NGRAM_SIZES, found, strict=True)) if None not in found else {}
