"""Key figures the GPU check's report takes from each stage's output (a missing field gives no
figure, never an error)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from mcsd_runtime.metrics import geomean

GOALS = {  # issue 52's figures: (key in the engine check's `goals`, comparison, bound)
    "ar_vs_hf": (">=", 3.0), "ar_over_bound": ("<=", 2.0), "static1_over_ar": ("<=", 1.3),
    "b8_over_b1": ("<=", 1.3), "gpu_busy": (">=", 0.8), "ar_ms": ("<=", 2.5),
    "decision_ms_per_depth": ("<=", 0.1), "fp32_captured_equals_eager": ("==", True),
    "ragged_over_padded": ("<=", 0.75)}  # issue 57's: B=8, half the rows 1 token, half 5
AR_MS_GOAL_SHAPE = "smollm2"  # the shape whose AR step has a goal of its own (ar_ms)


def read_json(path: Path) -> dict:
    """A JSON object from `path`, {} when missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _round(value, digits: int = 3):
    return round(value, digits) if isinstance(value, int | float) and math.isfinite(value) \
        else value


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None and v != {}}


def breakdown(path: Path) -> dict:
    """ms per step of each method under each graphs setting, the bandwidth bound, AR over the
    bound, the GPU-busy share of an AR step and the forward probe."""
    data = read_json(path)
    steps = {f"{r['method']} {r['graphs']} ({r.get('path') or '?'})":
             ("error" if r.get("error") else r["step_ms"]) for r in data.get("rows", [])}
    bound = data.get("bound", {})
    busy = {g: m.get("ar", {}).get("device_busy") for g, m in data.get("launches", {}).items()}
    probe = {k.removesuffix("_ms"): v for k, v in data.get("forward_probe", {}).items()
             if k.endswith("_ms")}
    return _drop_none({"ms_per_step": steps, "bound_ms": bound.get("target_forward_ms"),
                       "copy_GBps": bound.get("copy_GBps"),
                       "ar_over_bound": bound.get("ar_over_bound"),
                       "ar_gpu_busy": _drop_none(busy), "probe_ms": probe})


def collect(folder: Path, run: Path | None = None) -> dict:
    """Prompts, rows and new tokens collected, tokens/s over the collection's wall time, τ."""
    m = read_json(folder / "manifest.json")
    counts, timings = m.get("counts", {}), m.get("timings", {})
    tokens, wall = counts.get("new_tokens"), timings.get("wall_seconds")
    rate = tokens / wall if tokens and wall else None
    return _drop_none({"prompts": counts.get("prompts_done"), "rows": counts.get("rows"),
                       "new_tokens": tokens, "tokens_per_s": _round(rate, 1),
                       "tau": _round(m.get("summary", {}).get("tau"))})


def profile(path: Path) -> dict:
    """ms of one target and one draft forward over 1 token, the decoder's overheads, and the
    calibration runs' tokens/s."""
    p = read_json(path)
    first = lambda key: p.get(key, [None])[0]  # noqa: E731 - a one-line accessor
    ms = lambda v: _round(v * 1e3) if isinstance(v, int | float) else None  # noqa: E731
    static = p.get("static", {}).get("tokens_per_s", {})
    return _drop_none({"target_ms": ms(first("target_s")), "draft_ms": ms(first("draft_s")),
                       "step_overhead_ms": ms(p.get("step_overhead_s")),
                       "depth_overhead_ms": ms(p.get("depth_overhead_s")),
                       "tokens_per_s": {k: _round(v, 1) for k, v in static.items()}})


def stopper(folder: Path) -> dict:
    """The trained stopper's replayed speed against the best static and AR, its decision's
    latency, and the replay's error against the end-to-end check."""
    m = read_json(folder / "metrics.json")
    head = m.get("headline", {})
    return _drop_none({"best_static": head.get("best_static"),
                       "vs_best_static": _round(head.get("speedup_vs_best_static")),
                       "vs_ar": _round(head.get("learned_vs_ar")),
                       "decision_us": _round(head.get("decision_latency_us"), 1),
                       "replay_error": _round(m.get("replay_check", {}).get(
                           "max_abs_relative_error"))})


def copy_policy(folder: Path) -> dict:
    """The copy-or-draft choice: its replayed speed over AR per domain, its measured speed over
    the deploy static per category of the end-to-end check, and the replay's error there."""
    policy, check = read_json(folder / "copy_length.json"), read_json(folder / "check.json")
    rows = policy.get("report", [])
    replayed = {r.get("domain"): _round(r.get("learned_vs_ar")) for r in rows
                if isinstance(r, dict)}
    measured = {k: _round(v.get("geomean")) for k, v in
                check.get("learned_vs_deploy_measured", {}).items() if isinstance(v, dict)}
    return _drop_none({"replayed_vs_ar": replayed, "measured_vs_deploy": measured,
                       "replay_error": _round(check.get("max_abs_relative_error"))})


def evaluation(folder: Path) -> dict:
    """Each method's geometric-mean speedup over AR across the categories, and AR's median
    tokens/s; from the records appended as they were decoded (`eval_stage`, marked `partial`)
    when `mcsd eval` was stopped before it wrote its tables."""
    rows = read_json(folder / "domains.json").get("rows", [])
    if not rows:  # a single domain: its own summary
        rows = [{"method": r.get("method"), "vs_ar": r.get("geomean_vs_ar")}
                for r in read_json(folder / "summary.json").get("methods", [])]
    if not rows or _mtime(folder / "records.jsonl") > max(
            _mtime(folder / "domains.json"), _mtime(folder / "summary.json")):
        return partial_evaluation(folder / "records.jsonl", f"{folder.parent}/")
    by: dict[str, list[float]] = {}
    for r in rows:
        if isinstance(r.get("vs_ar"), int | float) and r["vs_ar"] > 0:
            by.setdefault(r["method"], []).append(r["vs_ar"])
    short = lambda m: m.replace(f"{folder.parent}/", "")  # noqa: E731 - labels without the run
    vs_ar = {short(m): _round(geomean(v))
             for m, v in by.items()}
    ar = [r.get("tokens_per_s_median") for s in sorted(folder.glob("*/summary.json"))
          for r in read_json(s).get("methods", []) if r.get("method") == "ar"]
    ar = [x for x in ar if isinstance(x, int | float)]
    return _drop_none({"vs_ar": vs_ar,
                       "ar_tokens_per_s": _round(statistics.median(ar), 1) if ar else None})


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _records(path: Path) -> list[dict]:
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for text in lines:
        try:
            row = json.loads(text)
        except ValueError:
            continue  # a line cut off mid-write
        if isinstance(row, dict) and isinstance(row.get("tokens_per_s"), int | float):
            out.append(row)
    return out


def partial_evaluation(path: Path, prefix: str = "") -> dict:
    """From an evaluation's records so far (one JSON line each): each method's geometric mean
    over the prompts decoded of its tokens/s over AR's on the same prompt, AR's median
    tokens/s, and how many prompts AR finished; {} without any."""
    rows = _records(path)
    key = lambda r: (r.get("batch_id") or r.get("prompt_id"), r.get("sample", 0))  # noqa: E731
    ar = {key(r): r["tokens_per_s"] for r in rows if r.get("method") == "ar"}
    by: dict[str, list[float]] = {}
    for r in rows:
        base = ar.get(key(r))
        if r.get("method") != "ar" and base and r["tokens_per_s"] > 0:
            by.setdefault(str(r["method"]).replace(prefix, ""), []).append(
                r["tokens_per_s"] / base)
    if not rows:
        return {}
    return _drop_none({"vs_ar": {m: _round(geomean(v)) for m, v in by.items()},
                       "ar_tokens_per_s": _round(statistics.median(ar.values()), 1)
                       if ar else None, "prompts_done": len(ar), "records": len(rows),
                       "partial": True})


def preflight(path: Path) -> dict:
    """The device, each package's version, and those that did not import."""
    p = read_json(path)
    versions = {k: v.get("version") for k, v in p.get("packages", {}).items() if "version" in v}
    return _drop_none({"device": p.get("device", {}).get("name"), "versions": versions,
                       "unimportable": p.get("unimportable") or None, "commit": p.get("commit")})


def goals(path: Path) -> dict:
    """Every goal of `GOALS` from an engine check's JSON (value, goal, reached; None where not
    measured yet or the file is not there)."""
    got = read_json(path).get("goals", {})
    return {k: {"value": None, "goal": " ".join(map(str, g)), "reached": None,
                **(got.get(k) if isinstance(got.get(k), dict) else {})}
            for k, g in GOALS.items()}


def engine(path: Path) -> dict:
    """The engine check's goals measured so far, ms per step of each row keyed by method,
    graphs setting and the path that actually ran, and each finished phase's seconds."""
    data = read_json(path)
    steps = {f"{r.get('method')} {r.get('graphs')} ({r.get('path') or '?'})":
             ("error" if r.get("error") else r.get("step_ms")) for r in data.get("rows", [])}
    steps |= {f"ar B={r.get('rows')} {r.get('layout')} {r.get('graphs')} ({r.get('path') or '?'})":
              ("error" if r.get("error") else r.get("step_ms")) for r in data.get("batch", [])}
    reached = {k: v.get("value") for k, v in data.get("goals", {}).items()}
    return _drop_none({"goals": _drop_none(reached), "ms_per_step": steps,
                       "phases_s": data.get("phases") or None, "startup_s": data.get("startup_s"),
                       "complete": "wall_s" in data or None})
