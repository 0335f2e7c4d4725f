"""An engine profile as the step-cost table DSpark's verification planners read (`mcsd export
PROFILE --engine sglang|trtllm`).

Both planners choose how many drafted tokens a step verifies by expected output tokens per
second, pricing a step by one curve: its cost against the tokens the target scores in it (one a
request plus the drafted tokens it verifies, the bonus token included). An engine profile
(`mcsd profile --engine vllm`: step seconds at concurrency c with every request drafting K)
gives that curve at M = c * (K + 1) tokens; where several cells share M (c=4, K=1 and c=8, K=0)
the curve takes their median, and `CostCurve.spread` says how far a cell lies from it: a
1-D curve cannot tell a wide batch from a deep one, so a large spread means the engine's costs
do not fit the planner's model.

- **SGLang** (`python/sglang/srt/speculative/dspark_components/dspark_sps.py` `SpsCostTable`,
  read by `--speculative-dspark-sps-table-path`): `{"sample_batch_tokens": [M, ...],
  "sample_steps_per_sec": [1 / seconds, ...], "max_batch_tokens": largest M}`, probes strictly
  increasing; a lookup takes the largest probe <= M (a floor). A table of one probe is its
  "uninitialized" marker (verify everything), so at least two are required.
- **TensorRT-LLM** (`tensorrt_llm/_torch/speculative/dspark_planner.py` `SpsCostTable`, the
  legacy curve `load_runtime_sps_cost_table` reads from `confidence_sps_table_path`):
  `{"token_counts": [M, ...], "step_time_ms": [ms, ...], "fixed_overhead_ms": 0.0,
  "minimum_predicted_gain": 0.01}`, linear between breakpoints, clamped outside. Our step times
  are whole steps, so the fixed overhead they must not leave out is inside `step_time_ms`.
  Their schema-v2 exact tables need a fingerprint of the live engine and are not written.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.serving.engine_profile import EngineProfile
from mcsd_runtime.serving.export import Exported

COST_ENGINES = ("sglang", "trtllm")
MIN_GAIN = 0.01  # TensorRT-LLM's runtime default margin over verifying everything


@dataclass(frozen=True)
class CostCurve:
    """Step seconds against tokens scored a step (module docstring); `spread` is the largest
    relative distance of a measured cell from the curve at its token count."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    spread: float
    source: str

    def falls(self) -> list[tuple[int, int]]:
        """Neighbouring token counts where the measured step time falls by more than 5%."""
        n = len(self.tokens)
        return [(self.tokens[i], self.tokens[i + 1]) for i in range(n - 1)
                if self.seconds[i + 1] < 0.95 * self.seconds[i]]


def cost_curve(profile: EngineProfile) -> CostCurve:
    """The profile's cells on one axis, tokens scored a step (module docstring)."""
    cells: dict[int, list[float]] = defaultdict(list)
    for p in profile.points:
        cells[p.concurrency * (p.k + 1)].append(p.step_seconds)
    if len(cells) < 2:
        raise MCSDError("the engine profile measures one step size only: a cost table needs at "
                        "least two (measure more with `mcsd profile --engine vllm --batch-size "
                        "1,4,8,16 --draft-lengths 0,1,2,4`)")
    tokens = tuple(sorted(cells))
    seconds = tuple(statistics.median(cells[m]) for m in tokens)
    spread = max(abs(s / mid - 1) for m, mid in zip(tokens, seconds, strict=True) for s in cells[m])
    return CostCurve(tokens, seconds, spread, f"{profile.engine} {profile.engine_version} "
                                              f"{profile.method}, {profile.model}")


def export_cost_table(profile: EngineProfile, engine: str) -> Exported:
    """The profile as `engine`'s DSpark step-cost table, with notes for stderr."""
    if engine not in COST_ENGINES:
        raise MCSDError(f"{engine} reads no step-cost table: an engine profile exports to "
                        f"{' or '.join(COST_ENGINES)} (DSpark's verification planner); a K "
                        f"schedule comes from `mcsd train --decision schedule`")
    curve = cost_curve(profile)
    notes = [f"measured in {curve.source}: a planner is priced right only by its own engine's "
             f"steps, so profile the engine you serve with"]
    if curve.spread > 0.15:
        notes.append(f"cells with the same tokens a step differ by up to {curve.spread:.0%}: "
                     f"this engine's step cost depends on more than the tokens it scores, "
                     f"which a one-axis table cannot say")
    for m0, m1 in curve.falls():
        notes.append(f"the measured step time falls from {m0} to {m1} tokens (noise?); "
                     f"measure again on a quiet machine")
    if engine == "sglang":
        config = {"sample_batch_tokens": list(curve.tokens),
                  "sample_steps_per_sec": [1.0 / s for s in curve.seconds],
                  "max_batch_tokens": curve.tokens[-1]}
        notes.append(f"serve with --speculative-dspark-sps-table-path FILE; SGLang refuses "
                     f"steps above {curve.tokens[-1]} tokens: profile larger concurrencies or K "
                     f"to cover your engine's largest step")
    else:
        config = {"token_counts": list(curve.tokens),
                  "step_time_ms": [1000.0 * s for s in curve.seconds],
                  "fixed_overhead_ms": 0.0, "minimum_predicted_gain": MIN_GAIN}
        notes.append(f"pass as confidence_sps_table_path; step times above {curve.tokens[-1]} "
                     f"tokens are held at the last value")
    return Exported(engine, config, tuple(notes))
