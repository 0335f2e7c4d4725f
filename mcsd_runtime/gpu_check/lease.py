"""The GPU check's clock: what each phase of an engine stage costs on an H200, the stage allowances
that follow, and the lease they fit (tests/test_gpu_check_lease.py checks every sum here).

A lease is 15 minutes of device time. Two calls fit it: the machine's start (2 minutes), call 1
(the engine at both shapes), a gap of at most 30 s while the machine stays warm, then call 2 (the
real pair's pipeline), with at least a minute to spare for the transfers. Each call's deadline
is its stages' allowances, `join` and the report (`CALL_RESERVE_S`) and room left over
(`CALL_ROOM_S`): no call's allowances sum to its whole limit.

An engine stage's allowance is `MARGIN` (1.5) times `engine_estimate`, rounded up to 5 s, plus, for
the first stage of call 1, `COLD_START_S` for imports and CUDA's start on a fresh machine (no
one has timed that yet; call 2's preflight takes the same role there). The estimate prices each
phase of `engine_check.measure` from the H200 figures of docs/results-gpu.md and issue 52
(`SHAPES`): eager steps as measured; captured steps at their goals (none measured yet: if they
run slower, what a stage loses is its eager tail, which runs last). `recovery_deadline` sizes
call 2 when the machine went cold between the calls. Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEASE_S = 900  # device time of one lease
MACHINE_START_S = 120  # a fresh machine's start, charged to the lease
CALL_GAP_S = 30  # between the calls: the machine stays warm this long after call 1
SPARE_S = 60  # the least the two calls must leave of the lease (transfers, pasting)
MARGIN = 1.5  # allowance over the H200 estimate
COLD_START_S = 20  # the first stage of call 1: cold imports and CUDA's start
CALL_RESERVE_S = {1: 15, 2: 25}  # `join` before the stages (call 2 installs wheels), the report
CALL_ROOM_S = 10  # of each call's deadline, beyond its allowances and reserve
TIMEOUT_SLACK_S = 20  # the device call's timeout_s beyond its deadline
RECOVERY_JOIN_S = 60  # timeout_s of the join-only call that carries call 1's part again
RECOVERY_SPARE_S = 30  # the recovery's transfers
MIN_RECOVERY_S = 200  # call 2 shorter than this distils no draft: no figure of the real pair
PHASES = ("bound", "captured", "exact", "decisions", "ragged", "eager", "probe")


@dataclass(frozen=True)
class ShapeCost:
    """An engine shape on an H200: ms a step eager (measured) and captured (the goal)."""

    startup_s: float  # imports, CUDA's start, the random-weight pair built on the device
    capture_s: float  # per decoder: its shapes' warm-up and capture
    ar: float  # eager AR step through the decoder
    static1: float  # eager static:1 step
    hf: float  # the target's own generate(), a token
    b8: float  # eager AR step at B=8
    forward: float  # one eager target forward over one new token
    ar_captured: float  # the goal: smollm2 <= 2.5 ms, 7B within 2x the bandwidth bound

    @property
    def static1_captured(self) -> float:
        return 1.3 * self.ar_captured  # the goal: static:1 <= 1.3x AR

    @property
    def b8_captured(self) -> float:
        return 1.3 * self.ar_captured  # the goal: B=8 <= 1.3x B=1


# docs/results-gpu.md (SmolLM2's shape, H200) and issue 52 (Llama-2-7B's with llama-68m): AR
# 22.4 and 25 ms, static:1 29.3 and 34, the 7B's generate() 25.7 ms a token, B=8 92 ms at 7B
# (a fixed ~60 ms over B=1, assumed at SmolLM2 too), a target forward 16.6 and 21.7 ms; the 7B's
# bound 3.1 ms (13.5 GB at 4.3 TB/s), so its captured goal is 6.3 ms.
SHAPES = {
    "smollm2": ShapeCost(startup_s=10, capture_s=1.0, ar=22.4, static1=29.3, hf=22.4, b8=82,
                         forward=16.6, ar_captured=2.5),
    "llama2-7b": ShapeCost(startup_s=15, capture_s=1.5, ar=25.0, static1=34.0, hf=25.7, b8=92,
                           forward=21.7, ar_captured=6.3),
}


@dataclass(frozen=True)
class EngineRun:
    """What one engine stage runs (`engine_check.Settings`' counts)."""

    tokens: int = 64
    repeats: int = 3
    batch_repeats: int = 2
    eager_repeats: int = 1
    eager_tokens: int = 32
    eager_batch: tuple[int, ...] = ()  # rows of each eager batch row
    layouts: int = 2  # padded and ragged: B=8 captured in each
    exact: bool = False
    exact_tokens: int = 32


def _decodes(n: int, tokens: int, ms: float) -> float:
    return n * tokens * ms / 1e3


def engine_estimate(c: ShapeCost, r: EngineRun) -> dict[str, float]:
    """Seconds of each phase of `engine_check.measure` (PHASES, `startup` first)."""
    def row(ms: float, tokens: int, repeats: int, capture: float = c.capture_s) -> float:
        return 2 * (_decodes(1 + repeats, tokens, ms) + capture)  # plain, then synced

    captured = (row(c.ar_captured, r.tokens, r.repeats)
                + row(c.static1_captured, r.tokens, r.repeats)
                + _decodes(1 + r.batch_repeats, r.tokens, c.ar_captured) + c.capture_s
                + r.layouts * (_decodes(1 + r.batch_repeats, r.tokens, c.b8_captured)
                               + c.capture_s)
                + 1.5 * _decodes(2, r.tokens, c.ar_captured) + c.capture_s)  # profiled
    exact = 0.0
    if r.exact:  # the fp32 pair's build, AR and static:1 captured and eager over 2 prompts,
        exact = 2.0 + 2.5 + sum(  # then one forward's logits, a replay and the uploads
            c.capture_s + _decodes(2, r.exact_tokens, cap) + _decodes(2, r.exact_tokens, eager)
            for cap, eager in ((c.ar_captured, c.ar), (c.static1_captured, c.static1)))
    eager = (_decodes(1 + r.repeats, r.tokens, c.hf)
             + row(c.ar, r.eager_tokens, r.eager_repeats, 0.0)
             + row(c.static1, r.eager_tokens, r.eager_repeats, 0.0)
             + 1.5 * _decodes(2, r.eager_tokens, c.ar)
             + sum(_decodes(1 + r.batch_repeats, r.tokens, c.ar if rows == 1 else c.b8)
                   for rows in r.eager_batch))
    return {"startup": c.startup_s, "bound": 1.0, "captured": captured, "exact": exact,
            # an MLP stopper and `static`, a warm-up and 2 prompts each, up to 4 depths a step
            "decisions": 2 * (_decodes(3, r.tokens, 2 * c.static1_captured) + c.capture_s),
            "ragged": 1.0 + 12 * c.b8 / 1e3, "eager": eager, "probe": 0.5 + 25 * c.forward / 1e3}


def ceil5(seconds: float) -> int:
    return int(5 * math.ceil(seconds / 5 - 1e-9))


def engine_allowance(c: ShapeCost, r: EngineRun, first: bool = False) -> int:
    """`MARGIN` x the estimate, up to 5 s; `COLD_START_S` more for call 1's first stage."""
    return ceil5(MARGIN * sum(engine_estimate(c, r).values())) + (COLD_START_S if first else 0)


def call_deadline(allowances: list[float], call: int) -> int:
    """A call's deadline: its stages' allowances, its reserve and `CALL_ROOM_S`."""
    return int(math.ceil(sum(allowances))) + CALL_RESERVE_S[call] + CALL_ROOM_S


def lease_left(deadlines: dict[int, float]) -> float:
    """Seconds of the lease the calls leave: the start, each call's deadline, the gap."""
    return LEASE_S - MACHINE_START_S - sum(deadlines.values()) - CALL_GAP_S * (len(deadlines) - 1)


def recovery_deadline(left: float, full: float) -> int | None:
    """Call 2's deadline when the machine went cold and `left` seconds of device time remain:
    a fresh start, the join-only call, the gap, the transfers and the timeout's slack come first;
    at most `full` (call 2's own); None when less than `MIN_RECOVERY_S` would be left."""
    room = (left - MACHINE_START_S - RECOVERY_JOIN_S - CALL_GAP_S - RECOVERY_SPARE_S
            - TIMEOUT_SLACK_S)
    return int(min(room, full)) if room >= MIN_RECOVERY_S else None
