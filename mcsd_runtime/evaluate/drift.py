"""How far greedy decoding in a low precision drifts from float32 AR, for AR and for MCSD alike.

In bfloat16 a tree forward and a one-token forward round differently, so greedy MCSD can part
from greedy AR of the same bf16 target at a near-tie, and bf16 AR itself parts from fp32 AR.
The fair question is whether MCSD drifts further from the float32 reference than AR does in
the same precision. `measure_drift` decodes every prompt four ways (AR and MCSD, float32 and
the low precision), `summarize` reports per category: the share of outputs equal to fp32 AR,
the first differing position, and fp32 target's top-2 logit margin there (a near-tie is
rounding; a wide margin would be a bug).
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from mcsd_runtime.decode.decoder import ARDecoder, MCSDDecoder
from mcsd_runtime.decode.records import DecodeConfig
from mcsd_runtime.evaluate.divergence import first_difference, top2_margin
from mcsd_runtime.models.pair import Pair
from mcsd_runtime.progress import Progress
from mcsd_runtime.progress import progress as progress_bar

RUNS = ("ar_ref", "mcsd_ref", "ar_low", "mcsd_low")
COMPARED = ("mcsd_ref", "ar_low", "mcsd_low")  # each against ar_ref


@dataclass
class DriftRow:
    """One prompt's four greedy outputs and where each parts from float32 AR."""

    prompt_id: str
    category: str
    outputs: dict[str, list[int]]
    first_diff: dict[str, int | None]  # position where the run leaves ar_ref, None if equal
    margin: dict[str, float | None]  # the reference target's top-2 logit margin there

    def to_dict(self) -> dict:
        return asdict(self)


def _decode(pair: Pair, prompts: Sequence[list[int]], config: DecodeConfig,
            stopper: str, bar: Progress) -> tuple[list[list[int]], list[list[int]]]:
    ar = ARDecoder(pair, config)
    mcsd = MCSDDecoder(pair, config, stopper=stopper)
    outs: tuple[list[list[int]], list[list[int]]] = ([], [])
    for name, decoder, out in (("ar", ar, outs[0]), ("mcsd", mcsd, outs[1])):
        bar.set_postfix_str(f"{name} in {str(pair.dtype).removeprefix('torch.')}")
        for p in prompts:
            out.append(decoder.generate(p).token_ids)
            bar.update()
    return outs


def _in_precision(pair: Pair, dtype: torch.dtype) -> Pair:
    """`pair` itself in `dtype`, else a copy of it (casting in place and back would leave the
    reference weights rounded to the lower precision)."""
    if pair.dtype == dtype:
        return pair
    return Pair(copy.deepcopy(pair.target).to(dtype), copy.deepcopy(pair.draft).to(dtype),
                pair.tokenizer, pair.target_name, pair.draft_name, dict(pair.fingerprint))


def measure_drift(pair: Pair, prompts: Sequence[tuple[str, str, list[int]]],
                  config: DecodeConfig, low: torch.dtype = torch.bfloat16,
                  stopper: str = "static", reference: torch.dtype = torch.float32,
                  progress: bool = False) -> list[DriftRow]:
    """Decode each `(prompt_id, category, ids)` greedily with AR and MCSD in the `reference`
    precision (float32) and in `low` (a copy of the models); margins are the reference target's.
    `progress` shows the decodes (4 per prompt) as they go (`mcsd_runtime.progress`)."""
    if config.temperature:
        raise ValueError("drift is measured on greedy decoding (temperature 0)")
    ids = [p[2] for p in prompts]
    outs: dict[str, list[list[int]]] = {}
    pair = _in_precision(pair, reference)
    with progress_bar(total=4 * len(ids), desc="drift", unit="decode",
                      disable=not progress) as bar:
        for name, dtype in (("ref", reference), ("low", low)):
            outs[f"ar_{name}"], outs[f"mcsd_{name}"] = _decode(_in_precision(pair, dtype), ids,
                                                               config, stopper, bar)
    rows = []
    for i, (pid, category, prompt) in enumerate(prompts):
        out = {run: outs[run][i] for run in RUNS}
        first = {run: first_difference(out[run], out["ar_ref"]) for run in COMPARED}
        margin = {run: (None if first[run] is None else
                        top2_margin(pair.target, prompt + out["ar_ref"][:first[run]]))
                  for run in COMPARED}
        rows.append(DriftRow(pid, category, out, first, margin))
    return rows


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(rows: Sequence[DriftRow]) -> dict[str, dict]:
    """Per category (and `all`): for each compared run, the share of outputs equal to reference AR,
    the median first differing position and the median fp32 top-2 margin there among those that
    differ; and the share of low-precision MCSD outputs equal to low-precision AR."""
    groups: dict[str, list[DriftRow]] = {}
    for r in rows:
        groups.setdefault(r.category, []).append(r)
    groups["all"] = list(rows)
    out = {}
    for category, rs in groups.items():
        entry: dict = {"prompts": len(rs)}
        for run in COMPARED:
            differ = [r for r in rs if r.first_diff[run] is not None]
            entry[run] = {
                "equal_share": 1 - len(differ) / len(rs),
                "first_diff_median": _median([r.first_diff[run] for r in differ]),
                "margin_median": _median([r.margin[run] for r in differ]),
            }
        entry["mcsd_low_equals_ar_low"] = sum(
            r.outputs["mcsd_low"] == r.outputs["ar_low"] for r in rs) / len(rs)
        out[category] = entry
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def drift_table(summary: dict[str, dict], low: str = "bf16", ref: str = "fp32") -> str:
    """The summary as a Markdown table, one line per category, `all` last."""
    head = (f"| category | prompts | {ref} MCSD = {ref} AR | {low} AR = {ref} AR | "
            f"{low} MCSD = {ref} AR | {low} MCSD = {low} AR | first diff (AR / MCSD) | "
            f"{ref} top-2 margin there (AR / MCSD) |")
    lines = [head, "|" + "---|" * 8]
    order = sorted(k for k in summary if k != "all") + ["all"]
    for cat in order:
        s = summary[cat]
        a, m = s["ar_low"], s["mcsd_low"]
        lines.append(
            f"| {cat} | {s['prompts']} | {s['mcsd_ref']['equal_share']:.0%} | "
            f"{a['equal_share']:.0%} | {m['equal_share']:.0%} | "
            f"{s['mcsd_low_equals_ar_low']:.0%} | "
            f"{_fmt(a['first_diff_median'], '.0f')} / {_fmt(m['first_diff_median'], '.0f')} | "
            f"{_fmt(a['margin_median'], '.3f')} / {_fmt(m['margin_median'], '.3f')} |")
    return "\n".join(lines)
