"""End-to-end evaluation behind `mcsd eval` (eval_cli.py): method runners, interleaved runs,
the summary every report number comes from, tables, plots and the report."""

from __future__ import annotations

import json
import statistics
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from mcsd_runtime import metrics
from mcsd_runtime.decoder import ARDecoder, DecodeConfig, GenerationResult, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.learned import check_pair
from mcsd_runtime.pair import Pair
from mcsd_runtime.stoppers import BUILTIN, make_stopper
from mcsd_runtime.tree import parse_k_config


def split_methods(spec: str) -> list[str]:
    """`ar,mcsd:4,2,2,1,heuristic` -> `["ar", "mcsd:4,2,2,1", "heuristic"]`."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part.isdigit() and out and out[-1].startswith(("mcsd:", "mcsd-target-init:")):
            out[-1] += f",{part}"
        else:
            out.append(part)
    if not out:
        raise MCSDError("no methods given: e.g. --methods ar,mcsd:4,2,2,1,heuristic")
    return out


@dataclass
class Record:
    method: str
    prompt_id: str
    token_ids: list[int]
    new_tokens: int
    wall_time: float
    target_calls: int
    draft_calls: int
    drafted_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None
    lossless: bool
    steps: list[tuple[int, int]]  # (drafted depth, accepted) per step

    @property
    def tokens_per_s(self) -> float:
        return metrics.throughput(self.new_tokens, self.wall_time)


class HFAssisted:
    """transformers' assisted generation on the same pair, counted with forward hooks."""

    lossless = True

    def __init__(self, pair: Pair, config: DecodeConfig) -> None:
        self.pair, self.config = pair, config
        self.calls = {"target": 0, "draft": 0}
        for name, model in (("target", pair.target), ("draft", pair.draft)):
            model.register_forward_pre_hook(lambda *_, n=name: self._count(n))
        self.active = False

    def _count(self, name: str) -> None:
        if self.active:
            self.calls[name] += 1

    @torch.inference_mode()
    def generate(self, ids: list[int]) -> Record:
        cfg = self.config
        torch.manual_seed(cfg.seed)
        kwargs = {"do_sample": cfg.temperature > 0, "max_new_tokens": cfg.max_new_tokens}
        if cfg.temperature > 0:
            kwargs |= {"temperature": cfg.temperature, "top_k": 0, "top_p": 1.0}
        self.calls = {"target": 0, "draft": 0}
        self.active = True
        t0 = time.perf_counter()
        x = torch.tensor([ids], device=self.pair.device)
        out = self.pair.target.generate(x, attention_mask=torch.ones_like(x),
                                        assistant_model=self.pair.draft,
                                        pad_token_id=(self.pair.eos_token_ids or [0])[0],
                                        **kwargs)
        wall = time.perf_counter() - t0
        self.active = False
        new = out[0, len(ids):].tolist()
        eos = set(self.pair.eos_token_ids)
        for i, t in enumerate(new):
            if t in eos:
                new = new[: i + 1]
                break
        return Record("hf-assisted", "", new, len(new), wall, self.calls["target"],
                      self.calls["draft"], 0, 0, None, True, [])


def _from_result(result: GenerationResult, roots: int) -> Record:
    """`roots` = 1 when the tree's first layer came from the target (not drafted)."""
    s = result.stats
    return Record("", "", result.token_ids, s.new_tokens, s.wall_time, s.target_calls,
                  s.draft_calls, s.drafted_tokens, s.accepted_tokens,
                  s.acceptance_rate if s.drafting_steps else None, result.lossless,
                  [(max(st.drafted - roots, 0), st.accepted) for st in result.steps])


class _Runner:
    def __init__(self, decoder: MCSDDecoder) -> None:
        self.decoder = decoder
        self.roots = 1 if decoder.config.init == "target" else 0

    def generate(self, ids: list[int]) -> Record:
        return _from_result(self.decoder.generate(ids), self.roots)


def check_method(name: str) -> None:
    """Refuse an unknown method name before anything is loaded."""
    kind = name.partition(":")[0]
    if name in ("ar", "hf-assisted") or kind in ("mcsd", "mcsd-target-init", "stopper"):
        return
    if kind in BUILTIN or Path(name).is_dir():
        return
    raise MCSDError(
        f"unknown method {name!r}: use ar, mcsd[:K], mcsd-target-init[:K], hf-assisted, a stopper "
        f"spec ({', '.join(BUILTIN)}) or stopper:PATH")


def build_method(name: str, pair: Pair, base: DecodeConfig):
    """A runner with `.generate(ids) -> Record` for one method name."""
    check_method(name)
    kind, _, arg = name.partition(":")
    if name == "ar":
        return _Runner(ARDecoder(pair, base))
    if kind in ("mcsd", "mcsd-target-init"):
        k = parse_k_config(arg) if arg else base.k_config
        init = "target" if kind == "mcsd-target-init" else "draft"
        return _Runner(MCSDDecoder(pair, _replace(base, k_config=k, init=init), "static"))
    if name == "hf-assisted":
        return HFAssisted(pair, base)
    stopper = make_stopper(name)
    check_pair(stopper, pair)
    return _Runner(MCSDDecoder(pair, _replace(base, init="draft"), stopper))


def _replace(config: DecodeConfig, **kw) -> DecodeConfig:
    from dataclasses import asdict

    return DecodeConfig(**(asdict(config) | kw))


def encode_prompt(pair: Pair, text: str, chat: bool) -> list[int]:
    tok = pair.tokenizer
    if tok is None:
        raise MCSDError("this pair has no tokenizer; pass a pair loaded from model folders")
    if chat and getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                      add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    return tok(text)["input_ids"]


def agreement(a: list[int], b: list[int]) -> float:
    """Share of positions (over the longer output) where two outputs carry the same token."""
    n = max(len(a), len(b))
    return sum(x == y for x, y in zip(a, b, strict=False)) / n if n else 1.0


def run_eval(pair: Pair, prompts, methods: list[str], base: DecodeConfig, chat: bool = False,
             progress: bool = True) -> list[Record]:
    """Run every method on every prompt, interleaved, after one warm-up generation each."""
    from tqdm import tqdm

    if not prompts:
        raise MCSDError("the prompt set is empty: pass a set or file with at least one prompt")
    runners = {m: build_method(m, pair, base) for m in methods}
    encoded = [(p.id, encode_prompt(pair, p.text, chat)) for p in prompts]
    for runner in runners.values():  # warm-up
        runner.generate(encoded[0][1])
    records: list[Record] = []
    names = list(runners)
    bar = tqdm(encoded, desc="eval", unit="prompt", disable=not progress)
    for i, (pid, ids) in enumerate(bar):
        for name in names[i % len(names):] + names[: i % len(names)]:
            rec = runners[name].generate(ids)
            rec.method, rec.prompt_id = name, pid
            records.append(rec)
        bar.set_postfix_str(f"{sum(r.new_tokens for r in records)} tokens")
    return records


def _quantile(xs: list[float], q: float) -> float:
    return float(torch.tensor(xs, dtype=torch.float64).quantile(q)) if xs else float("nan")


def summarize(records: list[Record], greedy: bool) -> list[dict]:
    """One row per method: the report's numbers, all derived from the per-prompt records."""
    by_method: dict[str, list[Record]] = {}
    for r in records:
        by_method.setdefault(r.method, []).append(r)
    ar = {r.prompt_id: r for r in by_method.get("ar", [])}
    rows = []
    for method, recs in by_method.items():
        tps = [r.tokens_per_s for r in recs]
        tokens = sum(r.new_tokens for r in recs)
        calls = sum(r.target_calls for r in recs)
        rates = [r.acceptance_rate for r in recs if r.acceptance_rate is not None]
        row = {
            "method": method,
            "prompts": len(recs),
            "tokens_per_s_median": statistics.median(tps),
            "tokens_per_s_p25": _quantile(tps, 0.25),
            "tokens_per_s_p75": _quantile(tps, 0.75),
            "speedup_vs_ar": None,
            "tau": metrics.tau(tokens, calls) if calls else None,
            "acceptance_rate": statistics.mean(rates) if rates else None,
            "drafted_per_token": sum(r.drafted_tokens for r in recs) / tokens if tokens else None,
            "target_calls": calls,
            "new_tokens": tokens,
            "lossless": all(r.lossless for r in recs),
            "ar_equal_share": None,
            "ar_agreement": None,
        }
        if ar:
            pairs = [(r, ar[r.prompt_id]) for r in recs if r.prompt_id in ar]
            row["speedup_vs_ar"] = statistics.median(
                r.tokens_per_s / a.tokens_per_s for r, a in pairs)
            if greedy:
                same = sum(r.token_ids == a.token_ids for r, a in pairs)
                row["ar_equal_share"] = same / len(pairs)
                row["ar_agreement"] = statistics.mean(agreement(r.token_ids, a.token_ids)
                                                      for r, a in pairs)
        rows.append(row)
    return rows


def _fmt(v, pct: bool = False) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.1%}" if pct else f"{v:.2f}"
    return str(v)


def markdown_table(rows: list[dict]) -> str:
    head = ("| method | tok/s (median) | tok/s IQR | speedup vs AR | τ | acceptance | "
            "drafted/token | target calls | lossless | AR-equal | AR agreement |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['method']} | {_fmt(r['tokens_per_s_median'])} | "
            f"{_fmt(r['tokens_per_s_p25'])}–{_fmt(r['tokens_per_s_p75'])} | "
            f"{_fmt(r['speedup_vs_ar'])}{'x' if r['speedup_vs_ar'] else ''} | {_fmt(r['tau'])} | "
            f"{_fmt(r['acceptance_rate'], pct=True)} | {_fmt(r['drafted_per_token'])} | "
            f"{r['target_calls']} | {_fmt(r['lossless'])} | {_fmt(r['ar_equal_share'], pct=True)} "
            f"| {_fmt(r['ar_agreement'], pct=True)} |")
    return "\n".join(lines)


def short_name(method: str) -> str:
    """`stopper:/long/path/lightgbm` -> `stopper:lightgbm`, for plot labels."""
    kind, _, arg = method.partition(":")
    return f"stopper:{Path(arg).name}" if kind == "stopper" else method


def plot(records: list[Record], rows: list[dict], out: Path, title: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    title = textwrap.fill(title, 90)

    def save(fig, ax, name: str) -> None:
        ax.set_title(title, fontsize=8)
        ax.tick_params(labelsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        files.append(name)
        plt.close(fig)

    named = [r for r in rows if r["speedup_vs_ar"] is not None]
    fig, ax = plt.subplots(figsize=(7, 1.5 + 0.3 * len(named)))
    ax.barh([short_name(r["method"]) for r in named], [r["speedup_vs_ar"] for r in named],
            color="tab:blue")
    ax.axvline(1.0, color="gray", lw=1)
    ax.invert_yaxis()
    ax.set_xlabel("speedup vs AR (median over prompts)")
    save(fig, ax, "speedup.png")

    methods = [r["method"] for r in rows if r["method"] not in ("ar", "hf-assisted")]
    fig, ax = plt.subplots(figsize=(7, 1.5 + 0.3 * len(methods)))
    data = [[metrics.tau(r.new_tokens, r.target_calls) for r in records if r.method == m]
            for m in methods]
    if methods:
        ax.boxplot(data, tick_labels=[short_name(m) for m in methods], vert=False)
        ax.invert_yaxis()
    ax.set_xlabel("τ per prompt (tokens / target call)")
    save(fig, ax, "tau.png")

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for m in methods:
        steps = [s for r in records if r.method == m for s in r.steps]
        depth = max((d for d, _ in steps), default=0)
        xs, ys = [], []
        for d in range(1, depth + 1):
            reached = [a for s, a in steps if s >= d and a >= d - 1]
            if reached:
                xs.append(d)
                ys.append(sum(a >= d for a in reached) / len(reached))
        ax.plot(xs, ys, marker="o", label=short_name(m))
    ax.set_xlabel("depth d")
    ax.set_ylabel("P(depth d accepted | d-1 accepted)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    save(fig, ax, "acceptance_by_depth.png")
    return files


def check_writable(out: Path) -> None:
    """Refuse an output folder that cannot be written, before any decoding."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise MCSDError(f"cannot write to {out}: {err.strerror}; pass a writable --out") from None


def write_outputs(records: list[Record], rows: list[dict], out: Path, settings: dict) -> None:
    """Per-prompt JSONL, summary CSV/JSON/Markdown, plots and report.md, each written whole."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    _atomic(out / "per_prompt.jsonl", "".join(
        json.dumps({k: v for k, v in vars(r).items()} | {"tokens_per_s": r.tokens_per_s}) + "\n"
        for r in records))
    _atomic(out / "summary.json", json.dumps({"settings": settings, "methods": rows}, indent=2))
    _atomic(out / "summary.csv", pd.DataFrame(rows).to_csv(index=False))
    table = markdown_table(rows)
    _atomic(out / "summary.md", table + "\n")
    title = (f"{settings['target']} / {settings['draft']} · {settings['prompts']} "
             f"x{settings['n_prompts']} · T={settings['temperature']} · "
             f"k={settings['k_config']}")
    files = plot(records, rows, out, title)
    report = [f"# Evaluation: {title}", "", table, "",
              "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]
    report += [f"![{f}]({f})" for f in files]
    _atomic(out / "report.md", "\n".join(report) + "\n")


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
