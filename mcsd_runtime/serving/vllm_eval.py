"""`mcsd eval --engine vllm`: methods run through vLLM's offline engine on the toolkit's prompt
sets, with the same paired statistics and reports as `--engine mcsd`.

One engine per method, every engine started before any timing (start-up is paid once per
configuration and left out). At each concurrency C, the prompts go in waves of C requests
submitted together; every method decodes the same waves, wave by wave, in an order that rotates
from wave to wave, after one untimed warm-up wave each. Throughput is a wave's generated tokens
per second of wall time (its prefills included, as a user of the engine sees it). At
concurrency 1 speed is paired per prompt, above it per wave. A concurrency may also vary
within a run: "1+16+4+8" sends waves of 1, 16, 4 and 8 requests in turn, over and over, paired
per wave (a table of K by batch size meets every band in one run). Each method's record
carries vLLM's own per-step drafted and accepted counts
(`per_request_spec_decode_metrics="detailed"`).

Writes, per concurrency, the usual evaluation folder (`c1/`, `c4/`, ...: per_prompt.jsonl,
summary.*, report.md) and across them `concurrency.md` and `concurrency.json`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcsd_runtime import metrics
from mcsd_runtime.evaluate.record import Record
from mcsd_runtime.paths import atomic_write_text
from mcsd_runtime.serving.vllm_engine import (
    EngineConfig,
    decode_wave,
    in_process_default,
    sampling_params,
    start_engine,
    stop_engine,
)
from mcsd_runtime.serving.vllm_methods import VllmMethod

Concurrency = int | str  # requests in flight, or "1+16+4+8": waves of these sizes in turn


def wave_sizes(concurrency: Concurrency) -> tuple[int, ...]:
    """The sizes a run's waves take in turn: (C,) for a count, the cycle for "A+B+..."."""
    return (concurrency,) if isinstance(concurrency, int) else tuple(
        int(x) for x in concurrency.split("+"))


def split_waves(encoded: list, concurrency: Concurrency) -> list[list]:
    """`encoded` cut into consecutive waves whose sizes follow `wave_sizes`."""
    sizes, waves, i = wave_sizes(concurrency), [], 0
    while i < len(encoded):
        n = sizes[len(waves) % len(sizes)]
        waves.append(encoded[i : i + n])
        i += n
    return waves


@dataclass(frozen=True)
class VllmRun:
    """What one `--engine vllm` evaluation decodes, and how."""

    model: str
    methods: tuple[VllmMethod, ...]
    concurrency: tuple[Concurrency, ...] = (1,)
    dtype: str = "bfloat16"
    temperature: float = 0.0
    max_new_tokens: int = 64
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0
    in_process: bool = field(default_factory=in_process_default)
    max_model_len: int | None = None  # None: the model's own


def engine_config(run: VllmRun, method: VllmMethod) -> EngineConfig:
    """The engine of one method: room for the largest wave."""
    return EngineConfig(model=run.model, dtype=run.dtype, speculative=method.speculative,
                        max_num_seqs=max(max(wave_sizes(c)) for c in run.concurrency),
                        seed=run.seed,
                        in_process=run.in_process, max_model_len=run.max_model_len,
                        env=dict(method.env), async_scheduling=method.async_scheduling)


def start_engines(run: VllmRun, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every method's engine, started one after the other (label -> LLM)."""
    engines = {}
    try:
        for m in run.methods:
            engines[m.label], seconds = start_engine(engine_config(run, m))
            log(f"started {m.label} in {seconds:.1f} s")
    except BaseException:
        stop_engines(engines)
        raise
    return engines


def stop_engines(engines: dict[str, Any]) -> None:
    for llm in engines.values():
        stop_engine(llm)


def wave_records(label: str, wave: list[tuple[str, list[int]]], outputs: list, wall: float,
                 unit: str | None) -> list[Record]:
    """Records of one method's wave: per prompt, its speed the wave's (`unit`: the wave's id,
    None at concurrency 1)."""
    tokens = sum(len(c.token_ids) for c in outputs)
    out = []
    for (pid, _), c in zip(wave, outputs, strict=True):
        drafted, accepted = sum(c.drafted), sum(c.accepted)
        steps = list(zip(c.drafted, c.accepted, strict=True))
        out.append(Record(
            label, pid, c.token_ids, len(c.token_ids), wall, c.steps + 1, 0, drafted, accepted,
            accepted / drafted if drafted else None, True, steps, batch_id=unit,
            batch_tokens_per_s=None if unit is None else metrics.throughput(tokens, wall)))
    return out


def run_waves(engines: dict[str, Any], encoded: list[tuple[str, list[int]]],
              concurrency: Concurrency, params: Any, progress: bool = True) -> list[Record]:
    """Every engine on every wave of `concurrency` prompts, interleaved (see the module doc)."""
    from mcsd_runtime.progress import progress as progress_bar

    waves = split_waves(encoded, concurrency)
    names = list(engines)
    for name in names:  # warm-up
        decode_wave(engines[name], [ids for _, ids in waves[0]], params)
    records: list[Record] = []
    with progress_bar(total=len(encoded), unit="prompt", disable=not progress,
                      desc=f"vllm (concurrency {concurrency})") as bar:
        for i, wave in enumerate(waves):
            for name in names[i % len(names):] + names[: i % len(names)]:
                outputs, wall = decode_wave(engines[name], [ids for _, ids in wave], params)
                unit = f"wave{i:04d}" if concurrency != 1 else None
                records += wave_records(name, wave, outputs, wall, unit)
            bar.update(len(wave))
    return records


@contextlib.contextmanager
def running(run: VllmRun, log: Callable[[str], None] = print) -> Iterator[
        tuple[dict[str, Any], Any]]:
    """Every method's engine started (stopped on leaving), with the run's sampling
    parameters: (label -> LLM, SamplingParams)."""
    params = sampling_params(run.temperature, run.max_new_tokens, run.ignore_eos, run.seed,
                             list(run.stop_token_ids))
    engines = start_engines(run, log)
    try:
        yield engines, params
    finally:
        stop_engines(engines)


def evaluate(run: VllmRun, encoded: list[tuple[str, list[int]]],
             log: Callable[[str], None] = print, progress: bool = True
             ) -> dict[Concurrency, list[Record]]:
    """Every method at every concurrency of `run` (concurrency -> records)."""
    with running(run, log) as (engines, params):
        return {c: run_waves(engines, encoded, c, params, progress) for c in run.concurrency}


def concurrency_rows(by_c: dict[Concurrency, list[Record]], greedy: bool) -> list[dict]:
    """One row per (concurrency, method): throughput, the paired speedup over `ar` (95% CI),
    mean accepted drafts per verify step, the acceptance rate and, greedy, equality with ar."""
    from mcsd_runtime.evaluate.batch_report import throughput
    from mcsd_runtime.evaluate.stats import group_by_method, paired_geomean

    rows = []
    for c, records in sorted(by_c.items(), key=lambda item: (isinstance(item[0], str),
                                                             str(item[0]).zfill(6))):
        by_method = group_by_method(records)
        ar = by_method["ar"]
        outputs = {r.prompt_id: r.token_ids for r in ar}
        for m, recs in by_method.items():
            steps = [s for r in recs for s in r.steps]
            drafted = sum(d for d, _ in steps)
            vs = paired_geomean(recs, ar) if m != "ar" else {}
            rows.append({
                "concurrency": c, "method": m, "tokens_per_s": throughput(recs),
                "vs_ar": vs.get("geomean"), "vs_ar_ci": [vs.get("ci_low"), vs.get("ci_high")],
                "accepted_per_step": (sum(a for _, a in steps) / len(steps)) if steps else None,
                "acceptance_rate": sum(a for _, a in steps) / drafted if drafted else None,
                "equal_to_ar": (sum(r.token_ids == outputs.get(r.prompt_id) for r in recs)
                                / len(recs)) if greedy else None})
    return rows


def _fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def concurrency_table(rows: list[dict]) -> str:
    """The rows as Markdown."""
    lines = ["| concurrency | method | tok/s | vs vLLM ar, geomean [95% CI] | accepted/step | "
             "acceptance | = ar |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = r["vs_ar_ci"]
        vs = "1" if r["method"] == "ar" else (
            f"{_fmt(r['vs_ar'], '.3f')}x [{_fmt(lo, '.3f')}, {_fmt(hi, '.3f')}]")
        lines.append(f"| {r['concurrency']} | {r['method']} | {r['tokens_per_s']:.1f} | {vs} | "
                     f"{_fmt(r['accepted_per_step'], '.2f')} | "
                     f"{_fmt(r['acceptance_rate'], '.2f')} | "
                     f"{_fmt(r['equal_to_ar'], '.0%')} |")
    return "\n".join(lines)


def write_concurrency(rows: list[dict], out: Path, settings: dict) -> str:
    """concurrency.json and concurrency.md in `out`; returns the table."""
    out.mkdir(parents=True, exist_ok=True)
    table = concurrency_table(rows)
    atomic_write_text(out / "concurrency.json",
                      json.dumps({"settings": settings, "rows": rows}, indent=2))
    atomic_write_text(out / "concurrency.md", "# vLLM: methods by concurrency\n\n" + table
                      + "\n\n" + ", ".join(f"{k}={v}" for k, v in settings.items()) + "\n")
    return table
