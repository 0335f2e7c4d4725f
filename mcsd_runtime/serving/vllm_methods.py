"""The methods `mcsd eval --engine vllm` runs, each as vLLM's `speculative_config`:

  ar                  vLLM without speculation
  ngram:K[:MIN:MAX]   vLLM's prompt lookup, K tokens from a match of MIN..MAX tokens (vLLM's
                      defaults without them: 5..5)
  table:PATH          K by batch size from a schedule (`mcsd train --decision schedule`), on the
                      drafter it was trained for (its meta.method: ngram), through vLLM's
                      num_speculative_tokens_per_batch_size
  proposer:PATH       the toolkit's proposer class inside vLLM
                      (`mcsd_runtime.serving.vllm_proposer`): prompt lookup under the learned
                      copy length at PATH (`mcsd train --decision copy`)

Every method is lossless in vLLM: it verifies chains by rejection sampling (greedy: the target's
argmax), so outputs differ from `ar`'s only where floating point does (fp32 greedy: never).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mcsd_runtime.errors import MCSDError

KINDS = ("ar", "ngram", "table", "proposer")
PROPOSER_CLASS = "mcsd_runtime.serving.vllm_proposer.LearnedLookupProposer"
PROPOSER_ENV = "MCSD_VLLM_PROPOSER"  # the copy-length folder the proposer class reads
PROPOSER_MAX_K = 8  # the longest draft a proposer step may hand vLLM
NGRAM_SIZES = ("prompt_lookup_min", "prompt_lookup_max")
TABLE_MAX_BATCH = 1024  # where a schedule's open last band ends in vLLM's table


@dataclass(frozen=True)
class VllmMethod:
    """A method's label, vLLM speculative config (None: plain) and the environment its engine
    starts with."""

    label: str
    speculative: dict | None
    env: tuple[tuple[str, str], ...] = ()


def _ints(method: str, parts: list[str]) -> list[int]:
    try:
        values = [int(x) for x in parts]
    except ValueError:
        raise MCSDError(f"method {method!r}: give whole numbers, e.g. ngram:4 or "
                        f"ngram:4:2:5") from None
    if any(v < 1 for v in values):
        raise MCSDError(f"method {method!r}: every number must be at least 1")
    return values


def _ngram(method: str, arg: str) -> dict:
    parts = arg.split(":") if arg else []
    if len(parts) not in (1, 3):
        raise MCSDError(f"method {method!r}: use ngram:K or ngram:K:MIN:MAX (e.g. ngram:4 or "
                        f"ngram:4:2:5)")
    values = _ints(method, parts)
    spec = {"method": "ngram", "num_speculative_tokens": values[0]}
    if len(values) == 3:
        lo, hi = values[1:]
        if lo > hi:
            raise MCSDError(f"method {method!r}: MIN {lo} is above MAX {hi}")
        spec |= {"prompt_lookup_min": lo, "prompt_lookup_max": hi}
    return spec


def _table(method: str, arg: str) -> dict:
    """vLLM's config for a schedule: its drafter (meta.method, with the n-gram sizes it was
    trained with where it records them) and its K by batch size."""
    from mcsd_runtime.serving.export import export_schedule
    from mcsd_runtime.serving.schedule import Schedule

    if not arg:
        raise MCSDError(f"method {method!r}: name the folder or schedule.json `mcsd train "
                        f"--decision schedule` wrote, e.g. table:runs/schedule")
    schedule = Schedule.load(Path(arg))
    drafter = schedule.meta.get("method", "ngram")
    if drafter != "ngram":
        raise MCSDError(f"method {method!r}: the schedule was trained for {drafter!r}; "
                        f"--engine vllm runs schedules over its ngram drafter")
    base = {"method": "ngram"} | {k: int(schedule.meta[k]) for k in NGRAM_SIZES
                                  if schedule.meta.get(k) is not None}
    return base | export_schedule(schedule, "vllm", max_batch_size=TABLE_MAX_BATCH).config


def _proposer(method: str, arg: str) -> tuple[dict, tuple[tuple[str, str], ...]]:
    from mcsd_runtime.decisions.copy_length import read_spec

    if not arg:
        raise MCSDError(f"method {method!r}: name the folder `mcsd train --decision copy` "
                        f"wrote, e.g. proposer:runs/copy")
    folder = Path(arg).resolve()
    spec = read_spec(folder)  # a clear error for a folder that is not a copy length
    k = min(len(spec["costs"]) - 1, PROPOSER_MAX_K)
    config = {"method": "custom_class", "model": PROPOSER_CLASS,
              "num_speculative_tokens": max(k, 1)}
    return config, ((PROPOSER_ENV, str(folder)),)


def parse_method(method: str) -> VllmMethod:
    """A `--methods` entry as a `VllmMethod`; MCSDError for a method vLLM cannot run here."""
    kind, _, arg = method.strip().partition(":")
    if kind == "ar" and not arg:
        return VllmMethod("ar", None)
    if kind == "ngram":
        return VllmMethod(method, _ngram(method, arg))
    if kind == "table":
        return VllmMethod(method, _table(method, arg))
    if kind == "proposer":
        config, env = _proposer(method, arg)
        return VllmMethod(method, config, env)
    raise MCSDError(f"method {method!r} does not run with --engine vllm: use ar, ngram:K, "
                    f"ngram:K:MIN:MAX, table:PATH or proposer:PATH (`mcsd eval --help`)")


def parse_methods(text: str) -> list[VllmMethod]:
    """`--methods` for vLLM: comma-separated, each named once, `ar` among them (every speed is
    paired with it)."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise MCSDError("--methods: name at least one method, e.g. ar,ngram:4")
    if len(set(names)) != len(names):
        raise MCSDError(f"--methods {text!r} names a method twice")
    if "ar" not in names:
        raise MCSDError("--engine vllm pairs every method's speed with vLLM's plain decoding: "
                        "add ar to --methods")
    return [parse_method(m) for m in names]
