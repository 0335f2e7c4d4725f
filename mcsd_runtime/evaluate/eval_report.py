"""An evaluation's reports: the tables of the summary rows (every column, and the
short table a first look needs), the notes below them, and the output folder's files
(per-prompt JSONL, summary CSV/JSON/Markdown, plots, report.md), each written whole."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.evaluate.cells import fmt, fmt_ci, fmt_delta, fmt_nll, fmt_times
from mcsd_runtime.evaluate.methods import short_name
from mcsd_runtime.evaluate.plots import plot
from mcsd_runtime.evaluate.record import Record
from mcsd_runtime.evaluate.training_results import stopper_table
from mcsd_runtime.paths import atomic_write_text, short_model_name

OUTPUTS = ("per_prompt.jsonl", "summary.json", "summary.csv", "summary.md", "report.md",
           "speedup.png", "tau.png", "acceptance_by_depth.png")


def markdown_table(rows: list[dict]) -> str:
    """Every column of the summary rows (`stats.summarize`), one line per method."""
    ref = next((r["reference"] for r in rows if r.get("reference")), None)
    head = ("| method | tok/s (median) | tok/s IQR | speedup vs AR | speedup vs hf | "
            f"vs AR, geomean [95% CI] | vs {ref or 'reference'}, geomean [95% CI] | τ | "
            "acceptance | drafted/token | target calls | lossless | AR-equal | hf-equal | "
            "AR agreement | NLL/token | NLL vs AR [95% CI] | target top-1 | repeated 4-grams | "
            "loops |")
    lines = [head, "|" + "---|" * 20]
    for r in rows:
        lines.append(
            f"| {r['method']} | {fmt(r['tokens_per_s_median'])} | "
            f"{fmt(r['tokens_per_s_p25'])}–{fmt(r['tokens_per_s_p75'])} | "
            f"{fmt_times(r['speedup_vs_ar'])} | {fmt_times(r['speedup_vs_hf'])} | "
            f"{fmt_ci(r['geomean_vs_ar'], r['ci_vs_ar'])} | "
            f"{fmt_ci(r['geomean_vs_reference'], r['ci_vs_reference'])} | {fmt(r['tau'])} | "
            f"{fmt(r['acceptance_rate'], pct=True)} | {fmt(r['drafted_per_token'])} | "
            f"{r['target_calls']} | {fmt(r['lossless'])} | {fmt(r['ar_equal_share'], pct=True)} "
            f"| {fmt(r['hf_equal_share'], pct=True)} | {fmt(r['ar_agreement'], pct=True)} | "
            f"{fmt_nll(r.get('target_nll'))} | "
            f"{fmt_delta(r.get('target_nll_vs_ar'), r.get('ci_target_nll_vs_ar'))} | "
            f"{fmt(r.get('target_top1_share'), pct=True)} | "
            f"{fmt(r.get('repeat4_share'), pct=True)} | {fmt(r.get('loop_share'), pct=True)} |")
    return "\n".join(lines)


def short_table(rows: list[dict]) -> str:
    """The few columns a first look needs: tokens/s, speedups over AR and over the reference
    (geometric means of paired per-prompt ratios, 95% CI), τ, output equality with AR and the
    target's NLL per new token."""
    ref = next((r["reference"] for r in rows if r.get("reference")), None)
    head = ["method", "tok/s", "vs AR [95% CI]", f"vs {ref or 'reference'} [95% CI]", "τ",
            "= AR", "NLL/tok"]
    body = [[short_name(r["method"]), f"{r['tokens_per_s_median']:.1f}",
             fmt_ci(r["geomean_vs_ar"], r["ci_vs_ar"]),
             fmt_ci(r["geomean_vs_reference"], r["ci_vs_reference"]), fmt(r["tau"]),
             fmt(r["ar_equal_share"], pct=True), fmt_nll(r.get("target_nll"))] for r in rows]
    return "\n".join("| " + " | ".join(cells) + " |"
                     for cells in [head, ["---"] * len(head), *body])


def markdown_notes(rows: list[dict], records: list[Record]) -> str:
    """Below the table: where lossless outputs leave `hf`'s (with the target's top-2 logit
    margin there: a near-tie is numerics, a wide margin a bug), and `hf-generate`'s overhead."""
    lines = []
    for r in records:
        d = r.hf_divergence
        if d:
            lines.append(f"- {r.method}, prompt {r.prompt_id}: first differs from hf at new token "
                         f"{d['position']} ({d['token']} vs {d['reference_token']}); target "
                         f"top-2 logit margin there {d['top2_margin']:.3g}")
    for row in rows:
        if row["speedup_vs_twin"] is not None:
            lines.append(f"- {row['method']} runs at {row['speedup_vs_twin']:.3f}x the tokens/s "
                         f"of {row['decoder_twin']} (median paired ratio per prompt)")
    return "\n".join(lines)


def check_writable(out: Path) -> None:
    """Refuse an output folder that cannot be written, before any decoding; folders created
    for the check are removed again, so a run refused later leaves nothing behind."""
    created = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise MCSDError(f"cannot write to {out}: {err.strerror}; pass a writable --out") from None
    finally:
        for folder in created:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()


def write_outputs(records: list[Record], rows: list[dict], out: Path, settings: dict,
                  tokenizer=None, stoppers: list[dict] | None = None) -> list[str]:
    """Per-prompt JSONL (with the decoded text when a tokenizer is given), summary
    CSV/JSON/Markdown, plots and report.md, each written whole. Returns the files it replaced."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    replaced = [name for name in OUTPUTS if (out / name).exists()]

    def record(r: Record) -> dict:
        text = {"text": tokenizer.decode(r.token_ids)} if tokenizer is not None else {}
        return vars(r) | text | {"tokens_per_s": r.tokens_per_s}

    atomic_write_text(out / "per_prompt.jsonl",
                      "".join(json.dumps(record(r)) + "\n" for r in records))
    atomic_write_text(out / "summary.json", json.dumps({"settings": settings, "methods": rows,
                                              "stoppers": stoppers or []}, indent=2))
    atomic_write_text(out / "summary.csv", pd.DataFrame(rows).to_csv(index=False))
    table = markdown_table(rows)
    notes = markdown_notes(rows, records)
    table += f"\n\n{notes}" if notes else ""
    atomic_write_text(out / "summary.md", table + "\n")
    title = (f"{short_model_name(settings['target'])} / {short_model_name(settings['draft'])} · "
             f"{settings['prompts']} x{settings['n_prompts']} · T={settings['temperature']} · "
             f"k={settings['k_config']} · {settings['max_new_tokens']} new tokens")
    files = plot(records, rows, out, title)
    report = [f"# Evaluation: {title}", "", short_table(rows), "", "## Every column", "", table,
              "", LEGEND]
    if stoppers:
        report += ["", "## The trained stoppers, offline (from their metrics.json)", "",
                   stopper_table(stoppers)]
    report += ["", "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]
    report += [f"![{f}]({f})" for f in files]
    atomic_write_text(out / "report.md", "\n".join(report) + "\n")
    return replaced


LEGEND = """Columns: *tok/s* is the median over prompts of new tokens per second (*IQR*: its
25th-75th percentiles). *speedup vs AR* and *speedup vs hf* are medians of the per-prompt
ratios of tokens/s (paired: the same prompt, interleaved); *vs AR, geomean* and *vs REFERENCE,
geomean* are geometric means of the same paired ratios with a 95% bootstrap CI over prompts.
The two statistics differ when the ratios are skewed (a few prompts much faster or slower
than the rest); the reference (best static schedule) is chosen by the geometric mean, which
the short table shows. *τ*: committed tokens per target call. *acceptance*: per drafting step,
accepted / drafted depth, averaged. *drafted/token*: drafted tokens per committed token (–:
unknown, hf-assisted). *target calls*: target forwards over all prompts. *lossless*: the method
keeps the target's output distribution (mcsd-target-init does not). *AR-equal* / *hf-equal*
(greedy): share of prompts whose output equals ar's / hf's token for token; *AR agreement*:
mean share of positions carrying the same token. *NLL/token*: the target's negative
log-likelihood (nats, temperature 1) of the method's outputs given their prompts, per new
token over all of them (one teacher-forced forward per output after the timed runs; lossless
greedy outputs equal AR's, and so does their NLL); *NLL vs AR*: the mean over prompts of the
per-prompt difference from ar's, 95% bootstrap CI (positive: text the target finds less
likely). *target top-1*: share of new tokens that are the target's most likely token after the
text before them (100% for greedy lossless methods; below it, how often a lossy one overrode
the target). *repeated 4-grams*: mean share of an output's 4-grams already seen earlier in it;
*loops*: share of outputs where at least half are (read both against ar's: code repeats
legitimately)."""

