"""Evaluation across domains: the same methods on several prompt sets, one interleaved run per
domain, judged on every domain against what a user would otherwise deploy.

Each method is compared, by the geometric mean of paired per-prompt speedups with a 95%
bootstrap CI, with

- `ar`: the target alone;
- `deploy`: the static schedule a user would deploy, chosen before seeing the domain (a learned
  stopper's `metrics.json` records the best static depth on its training collection's
  validation prompts as `deploy_static`);
- `best static`: the domain's hindsight best static schedule among those run;
- `heuristic`: the tuned +2/-1 schedule (HF's), which adapts to the run.

The worst domain of each method is reported beside the table: a stopper that wins on average
and loses on one kind of traffic loses where that traffic is served.
"""

from __future__ import annotations

import json
from pathlib import Path

from mcsd_runtime.evaluate import quality
from mcsd_runtime.evaluate.cells import fmt_delta, fmt_nll
from mcsd_runtime.evaluate.record import Record
from mcsd_runtime.evaluate.stats import best_static, group_by_method, paired_geomean
from mcsd_runtime.metrics import tau

BASELINES = ("ar", "deploy", "best_static", "heuristic")
HEADERS = {"ar": "vs AR", "deploy": "vs deploy", "best_static": "vs best static",
           "heuristic": "vs heuristic"}


def read_records(run: Path) -> list[Record]:
    """The per-prompt records of a finished `mcsd eval` folder (its per_prompt.jsonl)."""
    from dataclasses import fields

    from mcsd_runtime.errors import MCSDError

    path = Path(run) / "per_prompt.jsonl"
    names = {f.name for f in fields(Record)}
    try:
        lines = path.read_text().splitlines()
        return [Record(**{k: v for k, v in json.loads(line).items() if k in names})
                for line in lines if line.strip()]
    except (OSError, ValueError, TypeError) as err:
        raise MCSDError(f"cannot read eval records from {path}: {err}; point --runs at "
                        f"folders written by mcsd eval") from None


def run_settings(run: Path) -> dict:
    """The settings a finished `mcsd eval` folder recorded (its summary.json), or {}."""
    try:
        return json.loads((Path(run) / "summary.json").read_text()).get("settings", {})
    except (OSError, ValueError):
        return {}


def deploy_static_of(stopper_path: str | Path) -> str | None:
    """The `deploy_static` a trained stopper's metrics.json records (None if it has none)."""
    path = Path(stopper_path) / "metrics.json"
    try:
        return json.loads(path.read_text()).get("deploy_static")
    except (OSError, ValueError):
        return None


def domain_rows(by_domain: dict[str, list[Record]], deploy: str | None,
                heuristic: str | None, greedy: bool = True) -> list[dict]:
    """One row per (domain, method): paired speedups against each of BASELINES, τ, drafted
    tokens per committed token, for greedy runs whether every output equals `ar`'s, and the
    quality columns of `mcsd_runtime.evaluate.quality.summary`."""
    rows = []
    for domain, records in by_domain.items():
        by_method = group_by_method(records)
        refs = {"ar": "ar", "deploy": deploy, "best_static": best_static(records),
                "heuristic": heuristic}
        for method, recs in by_method.items():
            row: dict = {"domain": domain, "method": method, "prompts": len(recs),
                         "best_static": refs["best_static"]}
            for key, ref in refs.items():
                g = paired_geomean(recs, by_method[ref]) if ref in by_method else {}
                row[f"vs_{key}"] = g.get("geomean")
                row[f"ci_vs_{key}"] = [g.get("ci_low"), g.get("ci_high")]
            tokens = sum(r.new_tokens for r in recs)
            calls = sum(r.target_calls for r in recs)
            drafted = [r.drafted_tokens for r in recs]
            ar = {r.prompt_id: r.token_ids for r in by_method.get("ar", [])} if greedy else {}
            row |= {"tau": tau(tokens, calls) if calls else None,
                    "drafted_per_token": (sum(drafted) / tokens
                                          if tokens and None not in drafted else None),
                    "ar_equal": (all(ar.get(r.prompt_id) == r.token_ids for r in recs)
                                 if ar else None)}
            row |= quality.summary(recs, by_method.get("ar"))
            rows.append(row)
    return rows


def worst_domains(rows: list[dict]) -> list[dict]:
    """Per method, its worst domain against each baseline (lowest geometric mean)."""
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        entry: dict = {"method": method}
        for key in BASELINES[1:]:
            scored = [r for r in mine if r[f"vs_{key}"] is not None]
            worst = min(scored, key=lambda r, k=key: r[f"vs_{k}"]) if scored else None
            entry[key] = ({"domain": worst["domain"], "geomean": worst[f"vs_{key}"],
                           "ci": worst[f"ci_vs_{key}"]} if worst else None)
        out.append(entry)
    return out


def _cell(geomean: float | None, ci: list | None = None) -> str:
    if geomean is None:
        return "–"
    if not ci or ci[0] is None:
        return f"{geomean:.3f}x"
    return f"{geomean:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}]"


DEPLOY_CHOSEN = "chosen on the training collection's validation prompts"
DEPLOY_GIVEN = "given by --deploy"


def markdown(rows: list[dict], worst: list[dict], deploy: str | None,
             heuristic: str | None, deploy_origin: str = DEPLOY_CHOSEN) -> str:
    """The per-domain table and the worst-domain table, with what each column compares
    (`deploy_origin`: where the deploy static came from)."""
    lines = [f"Baselines: deploy = `{deploy or 'none'}` ({deploy_origin}), best static = "
             f"each domain's hindsight best static schedule, heuristic = "
             f"`{heuristic or 'none'}`. Geometric means of paired per-prompt speedups, 95% "
             f"bootstrap CIs. NLL/token: the target's NLL of the outputs per new "
             f"token; NLL vs AR: mean per-prompt difference from ar's, 95% bootstrap CI; "
             f"repeated 4-grams: mean share of an output's 4-grams seen earlier in it.", "",
             "| domain | method | " + " | ".join(HEADERS.values()) +
             " | best static | τ | drafted/token | equal to AR | NLL/token | NLL vs AR | "
             "repeated 4-grams |",
             "|---" * (len(HEADERS) + 9) + "|"]
    for r in rows:
        cells = [_cell(r[f"vs_{k}"], r[f"ci_vs_{k}"]) for k in BASELINES]
        eq = "–" if r["ar_equal"] is None else ("yes" if r["ar_equal"] else "no")
        dpt = "–" if r["drafted_per_token"] is None else f"{r['drafted_per_token']:.2f}"
        t = "–" if r["tau"] is None else f"{r['tau']:.2f}"
        rep4 = r.get("repeat4_share")
        lines.append(f"| {r['domain']} | {r['method']} | " + " | ".join(cells) +
                     f" | {r['best_static'] or '–'} | {t} | {dpt} | {eq} | "
                     f"{fmt_nll(r.get('target_nll'))} | "
                     f"{fmt_delta(r.get('target_nll_vs_ar'), r.get('ci_target_nll_vs_ar'))} | "
                     f"{'–' if rep4 is None else f'{rep4:.1%}'} |")
    lines += ["", "Worst domain per method:", "",
              "| method | " + " | ".join(HEADERS[k] for k in BASELINES[1:]) + " |",
              "|---" * len(BASELINES) + "|"]
    for w in worst:
        cells = ["–" if w[k] is None else f"{_cell(w[k]['geomean'], w[k]['ci'])} ({w[k]['domain']})"
                 for k in BASELINES[1:]]
        lines.append(f"| {w['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write(rows: list[dict], worst: list[dict], out: Path, settings: dict) -> str:
    """domains.json and domains.md in `out`; returns the Markdown."""
    origin = DEPLOY_GIVEN if settings.get("deploy_given") else DEPLOY_CHOSEN
    text = markdown(rows, worst, settings.get("deploy"), settings.get("heuristic"), origin)
    out.mkdir(parents=True, exist_ok=True)
    (out / "domains.json").write_text(json.dumps({"settings": settings, "rows": rows,
                                                  "worst": worst}, indent=1) + "\n")
    (out / "domains.md").write_text(f"# Evaluation across domains\n\n{text}")
    return text
