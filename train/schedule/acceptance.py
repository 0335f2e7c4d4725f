"""What a K-by-batch-size schedule is chosen from: each drafting step's drafted and accepted
tokens, read from engine traces or dense collections, split by prompt, and the expected accepted
tokens at each K.

**The model.** A step verifies a chain: the target accepts a prefix of the drafted tokens, and
whether it accepts position i depends only on the positions before it (greedy and speculative
sampling alike). So a step that drafted D tokens and accepted L of them would have accepted
min(L, k) had it drafted k <= D; a request-step at K=k commits 1 + E[min(L, k)] tokens (its
accepted ones and the target's own).

**Which steps tell about k.** A step that drafted at least k tokens does. One that drafted fewer
(`drafted` < k) does only when its draft was short by itself, not cut by the K in force when it
was recorded (its `cap`): an n-gram match that ran out after 2 tokens drafts 2 at any K >= 2,
accepting L. Dense collections of our decoder always draft to their depth (cap = drafted, so a
step tells about k <= drafted only); an engine trace's cap is its `num_spec_tokens`. Each K's
estimate uses only the steps that tell about it, and says how many (`Estimate.steps`); no K above
the largest cap is tried.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mcsd_runtime.errors import MCSDError

STEP_COLUMNS = ("prompt", "category", "drafted", "accepted", "cap")  # one row per step
TRACE_NEEDED = ("prompt_id", "drafted", "accepted")  # of collect.traces.load_traces' columns
MIN_CATEGORY_PROMPTS = 4  # a category with fewer prompts takes the pooled bands
SPLITS = ("val", "test")  # choose on validation prompts, report on held-out test prompts


@dataclass(frozen=True)
class Estimate:
    """E[min(L, k)] over the `steps` steps that tell about k (NaN where none do), and the
    tokens those steps would draft at K=k, E[min(D, k)]: a drafter drafts fewer than K where its
    match runs short, and nothing where it finds none (most steps of an n-gram drafter), so a
    step costs what it verifies, not K a request."""

    accepted: float
    steps: int
    drafted: float = 0.0


def read_source(run: Path) -> tuple[pd.DataFrame, dict]:
    """The steps (`STEP_COLUMNS`) of one --runs folder, and what it was: an engine trace folder
    (manifest.json `"kind": "engine-trace"`) or a dense collection of a chain."""
    manifest = _manifest(run)
    if manifest.get("kind") == "engine-trace":
        try:
            from collect.traces import load_traces
        except ImportError as err:
            raise MCSDError(f"{run} holds engine traces, but this install cannot read them "
                            f"({err}): install a release with collect.traces") from None
        traces = load_traces(run)
        named = {c: sorted({str(v) for v in traces.get(c, pd.Series()).dropna()})
                 for c in ("method", "engine")}
        return trace_steps(traces, str(run)), {"path": str(run), "kind": "engine-trace",
                                               "methods": named["method"],
                                               "engines": named["engine"],
                                               "speculative": _speculative(manifest)}
    if manifest.get("format") == "mcsd-collect-run":
        return collection_steps(run, manifest), {"path": str(run), "kind": "collection",
                                                 "methods": [], "engines": []}
    raise MCSDError(f"{run} is neither an engine trace folder (manifest.json with \"kind\": "
                    f"\"engine-trace\") nor a collection of `mcsd collect --dense --k-config "
                    f"1,1,1,1,1,1`: pass one of those to --runs")


def _speculative(manifest: dict) -> dict | None:
    """The speculative config a live trace ran (`mcsd collect --engine vllm` records it), else
    None (an imported log does not say)."""
    source = manifest.get("source")
    found = source.get("speculative") if isinstance(source, dict) else None
    return found if isinstance(found, dict) else None


def _manifest(run: Path) -> dict:
    path = run / "manifest.json"
    if not path.is_file():
        raise MCSDError(f"{run} has no manifest.json: pass engine trace folders or collections "
                        f"of `mcsd collect` to --runs")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise MCSDError(f"cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise MCSDError(f"{path} is not a JSON object: collect or trace the run again")
    return data


def trace_steps(traces: pd.DataFrame, source: str = "the traces") -> pd.DataFrame:
    """Steps of engine traces (`collect.traces.load_traces`' columns: prompt_id, prompt_hash,
    category, drafted, accepted, num_spec_tokens, request_id, run_id, ...), a prompt named by
    its hash where the trace has one; MCSDError for missing columns or impossible counts."""
    missing = [c for c in TRACE_NEEDED if c not in traces.columns]
    if missing:
        raise MCSDError(f"{source} lacks columns {missing}: trace the runs again with this "
                        f"release")
    prompt = traces["prompt_id"].astype("string")
    if "prompt_hash" in traces.columns:  # the prompt itself, alike across runs and prompt ids
        prompt = ("#" + traces["prompt_hash"].astype("string")).fillna(prompt)
    if prompt.isna().any():  # a request without a prompt id is its own prompt
        blank = pd.Series("", index=traces.index)
        fallback = (traces.get("run_id", blank).astype(str) + "/"
                    + traces.get("request_id", blank + traces.index.astype(str)).astype(str))
        prompt = prompt.fillna(fallback)
    drafted = pd.to_numeric(traces["drafted"], errors="coerce")
    accepted = pd.to_numeric(traces["accepted"], errors="coerce")
    bad = drafted.isna() | accepted.isna() | (accepted < 0) | (accepted > drafted)
    if bad.any():
        raise MCSDError(f"{source}: {int(bad.sum())} step(s) accept fewer than 0 or more than "
                        f"they drafted (or lack the counts): trace the runs again")
    cap = pd.to_numeric(traces.get("num_spec_tokens", drafted), errors="coerce")
    category = traces.get("category", pd.Series(None, index=traces.index, dtype="object"))
    return _steps(prompt.astype(str), category, drafted, accepted, cap.fillna(drafted))


def collection_steps(run: Path, manifest: dict) -> pd.DataFrame:
    """Steps of a collection of our decoder over a chain tree (every node row of a step carries
    the step's accepted length and drafted depth); MCSDError for another tree."""
    from collect import load_rows
    from replay.runs import collected_k_config

    k_config = collected_k_config([manifest])
    if k_config is None or any(k != 1 for k in k_config):
        raise MCSDError(f"{run} was collected with --k-config {k_config}: a schedule replays "
                        f"chains, as engines draft them; collect with --dense --k-config "
                        f"1,1,1,1,1,1")
    hashed = int(manifest.get("row_schema_version", 1)) >= 2
    cols = ["run_id", "prompt_id", "step", "accepted_length", "drafted_depth",
            *(["prompt_hash"] if hashed else [])]
    rows = load_rows(run, columns=cols)
    if rows.empty:
        raise MCSDError(f"collection run {run} has no rows")
    first = rows.groupby(["run_id", "prompt_id", "step"], sort=False).first().reset_index()
    prompt = (first["prompt_hash"].astype(str) if hashed
              else first["run_id"].astype(str) + "/" + first["prompt_id"].astype(str))
    drafted = first["drafted_depth"].astype("int64")
    return _steps(prompt, pd.Series(None, index=first.index, dtype="object"), drafted,
                  first["accepted_length"].astype("int64"), drafted)


def _steps(prompt, category, drafted, accepted, cap) -> pd.DataFrame:
    category = category.astype("object").where(category.notna() & (category.astype(str) != ""),
                                               None)
    return pd.DataFrame({"prompt": prompt.to_numpy(), "category": category.to_numpy(),
                         "drafted": drafted.astype("int64").to_numpy(),
                         "accepted": accepted.astype("int64").to_numpy(),
                         "cap": cap.astype("int64").to_numpy()})


def split_steps(steps: pd.DataFrame, test_frac: float, seed: int
                ) -> tuple[pd.DataFrame, list[str]]:
    """`steps` with a `split` column (val or test, by prompt: no prompt in both, seeded, drawn
    within each category so each has held-out prompts) and each step's category its prompt's;
    and the categories with enough prompts (`MIN_CATEGORY_PROMPTS`) for bands of their own."""
    of_prompt = steps.groupby("prompt", sort=True)["category"].first()
    rng = np.random.default_rng(seed)
    test, own = set(), []
    strata = sorted(of_prompt.groupby(of_prompt.fillna(""), sort=True).groups.items())
    for name, members in strata:
        ids = sorted(members)
        if len(ids) < 2:  # a lone prompt chooses K; it cannot also be held out
            continue
        rng.shuffle(ids)
        test |= set(ids[:min(len(ids) - 1, max(1, round(test_frac * len(ids))))])
        if name and len(ids) >= MIN_CATEGORY_PROMPTS:
            own.append(str(name))
    if not test:
        raise MCSDError(f"the traces hold {len(of_prompt)} prompt(s): a schedule needs at least "
                        f"2, some to choose K on and some held out to report on")
    out = steps.assign(category=steps["prompt"].map(of_prompt).to_numpy())
    return out.assign(split=np.where(out["prompt"].isin(test), "test", "val")), own


def expected_accepted(steps: pd.DataFrame, k: int) -> Estimate:
    """E[min(L, k)] over the steps that tell about k (module docstring)."""
    if k == 0:
        return Estimate(0.0, len(steps))
    usable = (steps["drafted"] >= k) | (steps["drafted"] < steps["cap"])
    n = int(usable.sum())
    if not n:
        return Estimate(math.nan, 0, math.nan)
    rows = steps.loc[usable]
    return Estimate(float(np.minimum(rows["accepted"], k).mean()), n,
                    float(np.minimum(rows["drafted"], k).mean()))
