"""The GPU check's first call: the engine's measurements at one shape, with no download.

`python -m mcsd_runtime.gpu_check.engine_check --shape llama2-7b --device cuda --out F.json`
builds a random-weight pair of the shape on the device (`step_breakdown.shaped_pair`) and
measures, in this order (`lease.PHASES`), each written into `F.json` as soon as it is measured
(so a stage stopped at its allowance keeps every row before it), the seconds of each phase in
`phases`:

1. `bound`: the bandwidth bound of one target forward;
2. `captured`: `rows` AR and `static:1` on the tree (`4,2,2,1`) with `graphs on`, each row saying
   which path ran (`path`: captured, fixed or eager) and where its step's time goes (target and
   draft forward per call, the decoder's host work per step); `batch`: an AR decode step at B=1,
   then at B=8 padded, and ragged where `DecodeConfig` has a `batch_layout` field (one row is
   one layout: B=1 is measured once); `launches`: kernel launches, syncs and the GPU-busy share
   of a captured AR step;
3. with `--exact` (the SmolLM2 shape in the check): `exact`, the same pair in fp32, captured
   against eager, tokens and logits compared; `replay`, a replayed graph's outputs unchanged by
   the next replay of the same graph; `uploads`, host-to-device uploads that do not wait;
4. `decisions`: a learned stopper's (a random MLP on the feature schema) cost per decision,
   that is per drafted depth, inside the decoder on this pair;
5. `ragged_forward`: the target's forward at B=8 with half the rows carrying 1 token and half
   5, ragged against padded (`benchmarks.ragged_bench.compare_layouts`, eager);
6. everything eager: the target's own `generate()` as `hf` (`--repeats` runs: a goal's
   reference), AR and `static:1` (`--eager-repeats` runs of `--eager-tokens`), the eager
   launches, and the eager batch rows `--eager-batch` names (none in the GPU check: issue 52
   measured them, and they do not fit the stage's allowance);
7. `probe`: the eager forward probe (`step_breakdown.forward_probe`).

`goals` is rewritten with every write: each of issue 52's and 57's figures (`GOALS`), its value
so far (None until measured: the GPU-busy share is None on a CPU), the goal, and whether it is
reached. A failure inside one measurement becomes that entry's `error`; the next one runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mcsd_runtime.benchmarks import step_breakdown as sb
from mcsd_runtime.gpu_check.figures import AR_MS_GOAL_SHAPE, GOALS

FORMAT = "mcsd-engine-check"
BATCH = 8  # rows of the batched step, against 1
RAGGED_COUNTS = [1] * (BATCH // 2) + [5] * (BATCH - BATCH // 2)


class Doc:
    """The JSON document, rewritten (atomically) after every change."""

    def __init__(self, path: Path | None, head: dict) -> None:
        self.path, self.data = path, {**head, "rows": [], "batch": []}
        self.write()

    def put(self, key: str, value) -> None:
        self.data[key] = value
        self.write()

    def append(self, key: str, row: dict) -> None:
        self.data.setdefault(key, []).append(row)
        self.write()

    def write(self) -> None:
        self.data["goals"] = goals(self.data)
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.path)


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:500]


def guarded(fn: Callable[[], dict]) -> dict:
    """fn(), or {"error": ...} when it raises (a capture or memory failure is a result)."""
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - every measurement is recorded, never fatal
        return {"error": _error(err)}


def _row(pair, method: str, graphs: str, k_config, ids, tokens: int, repeats: int) -> dict:
    got = guarded(lambda: dataclasses.asdict(
        sb.breakdown(pair, method, k_config, ids, tokens, graphs, repeats)))
    return {"method": method, "graphs": graphs, **got}


def layouts() -> list[str]:
    """The batch layouts this decoder has: padded always, ragged once `DecodeConfig` has a
    `batch_layout` field."""
    from mcsd_runtime.decode.records import DecodeConfig

    names = {f.name for f in dataclasses.fields(DecodeConfig)}
    return ["padded", "ragged"] if "batch_layout" in names else ["padded"]


def batch_step(pair, rows: int, graphs: str, layout: str, ids: list[list[int]], tokens: int,
               repeats: int) -> dict:
    """ms per AR decode step of `rows` prompts decoded together (`generate_batch`), the
    prefills excluded: the median of `repeats` runs after a warm-up."""
    from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig

    extra = {"batch_layout": layout} if "ragged" in layouts() else {}
    dec = ARDecoder(pair, DecodeConfig(k_config=(), max_new_tokens=tokens, graphs=graphs,
                                       **extra))
    prompts = (ids * rows)[:rows]
    clock = sb.Clock(pair.device)
    dec.generate_batch(prompts, batch_size=rows)
    per_step, path = [], None
    for _ in range(max(repeats, 1)):
        _, out = clock.time(lambda: dec.generate_batch(prompts, batch_size=rows))
        steps = max(max(r.stats.target_calls for r in out.results) - 1, 1)
        per_step.append(out.stats.decode_time / steps * 1e3)
        path = out.results[0].stats.forwards
    ms = sorted(per_step)[(len(per_step) - 1) // 2]
    return {"step_ms": round(ms, 3), "step_ms_runs": [round(x, 3) for x in per_step],
            "path": path}


def ragged_forward(pair, context: int, repeats: int) -> dict:
    """The target's forward over `RAGGED_COUNTS` new tokens after `context` cached ones a row,
    ragged against padded, alternated (at least 5 rounds)."""
    from mcsd_runtime.benchmarks.ragged_bench import compare_layouts

    return compare_layouts(pair.target, RAGGED_COUNTS, context, max(repeats, 5))


def mlp_artifact(folder: Path, k_config: tuple[int, ...] | None = None, seed: int = 0) -> Path:
    """A learned stopper's artifact: a random MLP on the feature schema (its decisions cost
    what a trained one's cost; what they decide does not matter here)."""
    from safetensors.torch import save_file

    from mcsd_runtime.decisions.artifact import ArtifactSpec
    from mcsd_runtime.decisions.features import FEATURE_NAMES, SCHEMA_VERSION
    from mcsd_runtime.decisions.learned import DecisionMLP

    torch.manual_seed(seed)
    net = DecisionMLP(len(FEATURE_NAMES), (64, 64))
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(net.config()))
    ArtifactSpec(kind="mlp", schema_version=SCHEMA_VERSION, feature_names=FEATURE_NAMES,
                 aggregation="max", threshold=0.5, k_config=k_config).write(folder)
    return folder


def decisions(pair, k_config, tokens: int, seed: int = 0) -> dict:
    """µs per decision (one per drafted depth) of a learned MLP stopper and of `static` inside
    the decoder on `pair`."""
    from mcsd_runtime.benchmarks.decision_cost import decision_cost

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        spec = f"stopper:{mlp_artifact(Path(tmp) / 'mlp', tuple(k_config), seed)}"
        for name, stopper in (("mlp", spec), ("static", "static")):
            out[name] = guarded(lambda stopper=stopper: decision_cost(
                stopper, pair.vocab_size, k_config, prompts=2, max_new_tokens=tokens,
                seed=seed, pair=pair))
    return out


def _ms(rows: list[dict], method: str, graphs: str) -> float | None:
    hit = [r for r in rows if r.get("method") == method and r.get("graphs") == graphs
           and isinstance(r.get("step_ms"), int | float)]
    return hit[0]["step_ms"] if hit else None


def _reached(value, goal: tuple[str, float]) -> bool | None:
    if value is None:
        return None
    op, bound = goal
    return {">=": value >= bound, "<=": value <= bound, "==": value == bound}[op]


def goals(doc: dict) -> dict:
    """Every one of issue 52's and 57's figures (`GOALS`, in its order): its value so far
    (captured where both ran; None until measured), the goal, and whether it is reached (None:
    not measured yet, or not a goal at this shape)."""
    rows, batch = doc.get("rows", []), doc.get("batch", [])
    ar, hf = _ms(rows, "ar", "on"), _ms(rows, "hf", "off")
    s1 = _ms(rows, "static:1", "on")
    bound = doc.get("bound", {}).get("target_forward_ms")
    b = {(r.get("rows"), r.get("layout")): r.get("step_ms") for r in batch
         if r.get("graphs") == "on" and isinstance(r.get("step_ms"), int | float)}
    layout = "ragged" if (BATCH, "ragged") in b else "padded"
    one = b.get((1, layout)) or b.get((1, "padded"))  # one row is one layout
    busy = doc.get("launches", {}).get("on", {}).get("ar", {}).get("device_busy")
    mlp = doc.get("decisions", {}).get("mlp", {}).get("median_us")
    exact = doc.get("exact", {}).get("tokens")
    values = {
        "ar_vs_hf": round(hf / ar, 3) if ar and hf else None,
        "ar_over_bound": round(ar / bound, 3) if ar and bound else None,
        "static1_over_ar": round(s1 / ar, 3) if ar and s1 else None,
        "b8_over_b1": round(b[(BATCH, layout)] / one, 3) if b.get((BATCH, layout)) and one
        else None,
        "gpu_busy": busy,
        "ar_ms": ar,
        "decision_ms_per_depth": round(mlp / 1e3, 4) if mlp is not None else None,
        "fp32_captured_equals_eager": all(v.get("equal") for v in exact.values())
        if isinstance(exact, dict) and exact and all(isinstance(v, dict) for v in exact.values())
        else None,
        "ragged_over_padded": doc.get("ragged_forward", {}).get("ratio")}
    out = {}
    for key, value in values.items():
        applies = key != "ar_ms" or doc.get("shape") == AR_MS_GOAL_SHAPE
        out[key] = {"value": value, "goal": " ".join(map(str, GOALS[key])),
                    "reached": _reached(value, GOALS[key]) if applies else None}
        if not applies:
            out[key]["note"] = f"a goal at the {AR_MS_GOAL_SHAPE} shape only"
    return out


@dataclasses.dataclass
class Settings:
    shape: str
    device: str = "auto"
    k_config: str = "4,2,2,1"
    prompt_tokens: int = 256
    tokens: int = 64
    repeats: int = 3
    batch_repeats: int = 2
    eager_repeats: int = 1  # runs of the eager AR and static:1 rows (no goal reads them)
    eager_tokens: int = 32  # new tokens of those rows and of the eager launches
    eager_batch: str = ""  # eager batch rows, ROWS:LAYOUT,... (e.g. 1:padded,8:ragged)
    draft_layers: int = 4
    copy_mib: int = 1024
    exact: bool = False
    exact_tokens: int = 32
    seed: int = 0


def batch_rows(text: str) -> list[tuple[int, str]]:
    """`ROWS:LAYOUT,...` as (rows, layout) pairs; ValueError when malformed."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        rows, sep, layout = item.partition(":")
        if not sep or not rows.isdigit() or int(rows) < 1 or layout not in ("padded", "ragged"):
            raise ValueError(f"--eager-batch takes ROWS:LAYOUT items (layout padded or "
                             f"ragged), got {item!r}")
        out.append((int(rows), layout))
    return out


def _prompts(pair, s: Settings, count: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(s.seed)
    return [torch.randint(0, pair.vocab_size, (s.prompt_tokens,), generator=gen).tolist()
            for _ in range(count)]


def _batch(doc: Doc, pair, rows: int, graphs: str, layout: str, ids, s: Settings) -> None:
    got = guarded(lambda: batch_step(pair, rows, graphs, layout, ids, s.tokens, s.batch_repeats))
    doc.append("batch", {"method": "ar", "rows": rows, "graphs": graphs, "layout": layout, **got})


def _launches(doc: Doc, pair, graphs: str, k_config, prompt: list[int], tokens: int) -> None:
    launches = doc.data.setdefault("launches", {})
    launches[graphs] = {"ar": guarded(lambda: sb.launch_counts(pair, "ar", k_config, prompt,
                                                               tokens, graphs)), "tokens": tokens}
    doc.write()


def _captured_phase(doc: Doc, pair, s: Settings, ids, k_config) -> None:
    """AR and `static:1` captured, the AR step at B=1 and at B=8 in each layout, the launches
    and the GPU-busy share of a captured AR step."""
    for method in ("ar", "static:1"):
        doc.append("rows", _row(pair, method, "on", k_config, ids[:1], s.tokens, s.repeats))
    for rows, layout in [(1, "padded"), *((BATCH, layout) for layout in layouts())]:
        _batch(doc, pair, rows, "on", layout, ids, s)
    _launches(doc, pair, "on", k_config, ids[0], s.tokens)


def _eager_phase(doc: Doc, pair, s: Settings, ids, k_config) -> None:
    """The target's own `generate()` (`hf`, the reference of a goal) first, then AR and
    `static:1` eager, the eager launches and the eager batch rows `s.eager_batch` names."""
    doc.append("rows", {"method": "hf", "graphs": "off", "tokens": s.tokens,
                        **guarded(lambda: dataclasses.asdict(
                            sb.hf_row(pair, ids[:1], s.tokens, s.repeats)))})
    for method in ("ar", "static:1"):
        doc.append("rows", {"tokens": s.eager_tokens, **_row(
            pair, method, "off", k_config, ids[:1], s.eager_tokens, s.eager_repeats)})
    _launches(doc, pair, "off", k_config, ids[0], s.eager_tokens)
    for rows, layout in batch_rows(s.eager_batch):
        if layout in layouts():
            _batch(doc, pair, rows, "off", layout, ids, s)


def _exact_phase(doc: Doc, s: Settings, device: str, k_config) -> None:
    from mcsd_runtime.gpu_check import probes

    pair = sb.shaped_pair(s.shape, s.draft_layers, device, torch.float32, s.seed)
    ids = [p[:64] for p in _prompts(pair, s, 2)]
    exact = {"dtype": "float32", "prompt_tokens": 64, "tokens_compared": s.exact_tokens}
    exact["tokens"] = guarded(lambda: probes.exact_tokens(pair, k_config, ids, s.exact_tokens))
    doc.put("exact", exact)
    exact["logits"] = guarded(lambda: probes.exact_logits(pair.target, 64))
    doc.put("exact", exact)
    doc.put("replay", guarded(lambda: probes.replay_keeps_outputs(pair.target)))
    doc.put("uploads", guarded(lambda: probes.uploads(pair.device)))


def process_age_s() -> float | None:
    """Seconds since this process started (from /proc; None where there is none)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        return None


def _head(s: Settings, pair, device, dtype, build_s: float) -> dict:
    import platform

    import transformers

    return {"format": FORMAT, "version": 1, "shape": s.shape, "device": str(device),
            "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__,
                         "cuda": torch.version.cuda},
            "dtype": str(dtype).removeprefix("torch."), "target": pair.target_name,
            "draft": pair.draft_name, "timer": sb.Clock(device).name,
            "settings": dataclasses.asdict(s), "layouts": layouts(), "build_s": build_s,
            "startup_s": process_age_s(), "phases": {}}


def measure(s: Settings, out: Path | None, progress=print) -> dict:
    """Every measurement of the module docstring, in its order (`lease.PHASES`), into `out`
    as it goes, each phase's seconds in `phases`."""
    from mcsd_runtime.backend.device import pick_device
    from mcsd_runtime.gpu_check.lease import PHASES
    from mcsd_runtime.models.pair import pick_dtype
    from mcsd_runtime.tree import parse_k_config

    batch_rows(s.eager_batch)  # a malformed list fails before the pair is built
    device = pick_device(s.device)
    dtype = pick_dtype("auto", device)
    k_config = parse_k_config(s.k_config)
    t0 = time.perf_counter()
    pair = sb.shaped_pair(s.shape, s.draft_layers, str(device), dtype, s.seed)
    doc = Doc(out, _head(s, pair, device, dtype, round(time.perf_counter() - t0, 2)))
    ids = _prompts(pair, s, BATCH)
    steps = {
        "bound": lambda: doc.put("bound", guarded(lambda: sb.bandwidth_bound(pair, s.copy_mib))),
        "captured": lambda: _captured_phase(doc, pair, s, ids, k_config),
        "exact": lambda: _exact_phase(doc, s, str(device), k_config),
        "decisions": lambda: doc.put("decisions", decisions(pair, k_config, s.tokens, s.seed)),
        "ragged": lambda: doc.put("ragged_forward", guarded(lambda: ragged_forward(
            pair, s.prompt_tokens, s.batch_repeats))),
        "eager": lambda: _eager_phase(doc, pair, s, ids, k_config),
        "probe": lambda: doc.put("probe", guarded(
            lambda: sb.forward_probe(pair, s.prompt_tokens, seed=s.seed)))}
    for name in PHASES:
        if name == "exact" and not s.exact:
            continue
        t1 = time.perf_counter()
        steps[name]()
        doc.data["phases"][name] = round(time.perf_counter() - t1, 2)
        doc.write()
        reached = {k: v["value"] for k, v in doc.data["goals"].items()}
        progress(f"{name} done at {time.perf_counter() - t0:.1f} s; goals so far: "
                 f"{json.dumps(reached)}")
    doc.put("wall_s", round(time.perf_counter() - t0, 1))
    return doc.data


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mcsd_runtime.gpu_check.engine_check",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(sb.SHAPES), required=True)
    p.add_argument("--out", type=Path, default=None, help="JSON file, rewritten as it goes")
    p.add_argument("--exact", action="store_true", help="also the fp32 and GPU-only checks")
    for f in dataclasses.fields(Settings):
        if f.name not in ("shape", "exact"):
            flag = "--" + f.name.replace("_", "-")
            p.add_argument(flag, type=type(f.default), default=f.default,
                           help="default %(default)s")
    return p


def main(argv: list[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    out = args.pop("out")
    from mcsd_runtime.errors import MCSDError

    try:
        measure(Settings(**args), out)
    except (MCSDError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
