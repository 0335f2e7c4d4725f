"""The methods `mcsd eval --engine vllm` runs, each as vLLM's `speculative_config`:

  ar                  vLLM without speculation
  ar:sync             vLLM without speculation and without async scheduling, which vLLM turns
                      off for every proposer on the host (a proposer class, the CPU n-gram):
                      what that alone costs, apart from drafting and verifying
  ngram:K[:MIN:MAX]   vLLM's prompt lookup, K tokens from a match of MIN..MAX tokens (vLLM's
                      defaults without them: 5..5)
  table:PATH          K by batch size from a schedule (`mcsd train --decision schedule`), on the
                      drafter it was trained for (its meta.method: ngram), through vLLM's
                      num_speculative_tokens_per_batch_size
  proposer:PARTS      the toolkit's proposer class inside vLLM
                      (`mcsd_runtime.serving.vllm_proposer`): COPY (prompt lookup under the
                      learned copy length of `mcsd train --decision copy`), STOPPER (the pair's
                      draft under a stopper) or COPY+STOPPER, each optionally followed by
                      +table:PATH (a schedule capping each step's drafts by the live batch
                      size, off where its K is 0)
  draft:K             vLLM's draft-model speculation, K tokens a step from the target pair's
                      default draft (its distilled draft exported with a full-vocabulary head,
                      `mcsd_runtime.serving.draft_export`); the draft is resolved, built and
                      exported only when a `draft:` method is asked for. On a CPU, vLLM's
                      attention runs drafts with heads of 32, 64, 80, ... only (not the tiny
                      toy pair's 16): another draft is refused here (`check_cpu_draft`)

Every method is lossless in vLLM: it verifies chains by rejection sampling (greedy: the target's
argmax), so outputs differ from `ar`'s only where floating point does (fp32 greedy: never).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mcsd_runtime.errors import MCSDError

KINDS = ("ar", "ngram", "table", "proposer", "draft")
METHODS_HELP = "ar, ar:sync, ngram:K, ngram:K:MIN:MAX, table:PATH, proposer:PATH or draft:K"
DraftSource = str | Path | Callable[[], str | Path] | None  # a draft folder, or what finds it
PROPOSER_CLASS = "mcsd_runtime.serving.vllm_proposer.MCSDProposer"
PROPOSER_CHAIN = 4  # the chain a built-in stopper drafts in the proposer class, at most
PROPOSER_MAX_K = 8  # the longest draft a proposer step may hand vLLM
NGRAM_SIZES = ("prompt_lookup_min", "prompt_lookup_max")
TABLE_MAX_BATCH = 1024  # where a schedule's open last band ends in vLLM's table


@dataclass(frozen=True)
class VllmMethod:
    """A method's label, vLLM speculative config (None: plain), the environment its engine
    starts with and its async scheduling (None: vLLM's choice)."""

    label: str
    speculative: dict | None
    env: tuple[tuple[str, str], ...] = ()
    async_scheduling: bool | None = None  # None: vLLM's choice


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


def _proposer(method: str, arg: str, draft: DraftSource = None
              ) -> tuple[dict, tuple[tuple[str, str], ...]]:
    """vLLM's config for the toolkit's proposer class: `proposer:PARTS`, PARTS a copy-length
    folder, a stopper spec drafting with the pair's draft, or both joined by '+' (the copy
    first); the `ProposerSpec` it runs goes in the environment."""
    from mcsd_runtime.serving.vllm_proposer import PROPOSER_ENV, ProposerSpec

    parts = arg.split("+") if arg else []
    schedule = None
    if len(parts) > 1 and parts[-1].startswith("table:"):
        from mcsd_runtime.serving.schedule import Schedule

        schedule = parts.pop()[len("table:"):]
        Schedule.load(Path(schedule))  # a clear error for a wrong folder, before any engine
        schedule = str(Path(schedule).resolve())
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise MCSDError(f"method {method!r}: use proposer:COPY, proposer:STOPPER or "
                        f"proposer:COPY+STOPPER (COPY: a folder of `mcsd train --decision copy`; "
                        f"STOPPER: a stopper spec, e.g. stopper:runs/stop or static:3), "
                        f"optionally +table:SCHEDULE last")
    copy, stopper = (parts[0], None) if _is_copy(parts[0]) else (None, parts[0])
    if len(parts) == 2:
        if copy is None or _is_copy(parts[1]):
            raise MCSDError(f"method {method!r}: name the copy length first and a stopper "
                            f"after '+', e.g. proposer:runs/copy+stopper:runs/stop")
        stopper = parts[1]
    ks, depth = [], None
    if copy is not None:
        from mcsd_runtime.decisions.copy_length import read_spec

        ks.append(len(read_spec(Path(copy))["costs"]) - 1)  # a clear error for a wrong folder
        copy = str(Path(copy).resolve())
    if stopper is not None:
        depth, stopper = _chain_depth(method, stopper)
        ks.append(depth)
        folder = draft() if callable(draft) else draft
        if folder is None:
            raise MCSDError(f"method {method!r} drafts with the pair's draft: `mcsd eval "
                            f"--engine vllm` finds it; in Python pass draft=FOLDER")
        draft = str(folder)
    spec = ProposerSpec(copy, stopper, draft if stopper else None, depth, schedule)
    config = {"method": "custom_class", "model": PROPOSER_CLASS,
              "num_speculative_tokens": max(min(max(ks), PROPOSER_MAX_K), 1)}
    return config, ((PROPOSER_ENV, spec.to_env()),)


def _is_copy(part: str) -> bool:
    from mcsd_runtime.decisions.copy_length import SPEC_FILE

    return (Path(part) / SPEC_FILE).is_file()


def _chain_depth(method: str, text: str) -> tuple[int, str]:
    """(the chain's depth, the spec with its folder made absolute) of a stopper spec: a trained
    stopper's own chain (vLLM verifies chains), PROPOSER_CHAIN for a built-in."""
    from mcsd_runtime.decisions.artifact import ArtifactSpec
    from mcsd_runtime.decisions.builtin import parse_stopper_spec

    spec = parse_stopper_spec(text)  # a clear error for an unknown stopper
    if spec.folder is None:
        return PROPOSER_CHAIN, text
    try:
        k_config = ArtifactSpec.read(spec.folder).k_config
    except MCSDError:
        if text.startswith("stopper:"):
            raise
        raise MCSDError(f"method {method!r}: {spec.folder} is not a learned copy length (no "
                        f"copy_length.json) nor a trained stopper (no stopper.json): train one "
                        f"with `mcsd train --decision copy` or `mcsd train --decision stop`"
                        ) from None
    if k_config is None or any(k != 1 for k in k_config):
        raise MCSDError(f"method {method!r}: the stopper at {spec.folder} was trained on "
                        f"{'an unrecorded tree' if k_config is None else 'a tree'}, and vLLM "
                        f"verifies chains: train one on a collection made with --k-config 1,1,1,1")
    return len(k_config), f"stopper:{Path(spec.folder).resolve()}"

def _draft_k(method: str, arg: str) -> int:
    """K of `draft:K`: a whole number, at least 1."""
    try:
        k = int(arg)
    except ValueError:
        raise MCSDError(f"method {method!r}: use draft:K, K the tokens the draft proposes a "
                        f"step, e.g. draft:4") from None
    if k < 1:
        raise MCSDError(f"method {method!r}: K must be at least 1 (ar is vLLM without a "
                        f"draft)")
    return k


def _draft(method: str, arg: str, draft: DraftSource) -> dict:
    """vLLM's draft-model config: K tokens a step from the folder `draft` names."""
    k = _draft_k(method, arg)
    folder = draft() if callable(draft) else draft
    if folder is None:
        raise MCSDError(f"method {method!r} needs the draft vLLM loads: `mcsd eval --engine "
                        f"vllm` exports the target pair's own; in Python pass "
                        f"parse_method(method, draft=FOLDER)")
    check_cpu_draft(method, Path(folder))
    return {"method": "draft_model", "model": str(folder), "num_speculative_tokens": k}


def check_cpu_draft(method: str, folder: Path) -> None:
    """MCSDError for a draft whose attention head size vLLM's CPU attention does not run: vLLM
    checks only the target's, so such a draft starts, then fails at its first step. Nothing to
    check without vLLM or off the CPU."""
    import json

    try:
        from vllm.platforms import current_platform
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:
        return
    if not current_platform.is_cpu():
        return
    try:
        c = json.loads((folder / "config.json").read_text())
        head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # vLLM names what it cannot read when it loads the draft
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise MCSDError(f"method {method!r}: the draft at {folder} has attention heads of size "
                        f"{head}, which vLLM's CPU attention does not run (it runs "
                        f"{', '.join(map(str, sizes))}); draft:K on a CPU needs a target "
                        f"whose draft has such heads (smollm2's: 64), or run on a GPU")


def parse_method(method: str, draft: DraftSource = None) -> VllmMethod:
    """A `--methods` entry as a `VllmMethod`; MCSDError for a method vLLM cannot run here.
    `draft`: the folder vLLM loads for `draft:K` (or a callable giving it, called only then)."""
    kind, _, arg = method.strip().partition(":")
    if kind == "ar" and not arg:
        return VllmMethod("ar", None)
    if kind == "ar" and arg == "sync":
        return VllmMethod(method, None, async_scheduling=False)
    if kind == "ngram":
        return VllmMethod(method, _ngram(method, arg))
    if kind == "table":
        return VllmMethod(method, _table(method, arg))
    if kind == "proposer":
        config, env = _proposer(method, arg, draft)
        return VllmMethod(method, config, env)
    if kind == "draft":
        return VllmMethod(method, _draft(method, arg, draft))
    raise MCSDError(f"method {method!r} does not run with --engine vllm: use {METHODS_HELP} "
                    f"(`mcsd eval --help`)")


def parse_methods(text: str, draft: DraftSource = None) -> list[VllmMethod]:
    """`--methods` for vLLM: comma-separated, each named once, `ar` among them (every speed is
    paired with it). `draft` as in `parse_method`, resolved once, after every `draft:K` has been
    checked, and only if a method drafts with it (`draft:K`, a proposer with a stopper)."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise MCSDError("--methods: name at least one method, e.g. ar,ngram:4")
    if len(set(names)) != len(names):
        raise MCSDError(f"--methods {text!r} names a method twice")
    if "ar" not in names:
        raise MCSDError("--engine vllm pairs every method's speed with vLLM's plain decoding: "
                        "add ar to --methods")
    drafted = [m for m in names if m.partition(":")[0] == "draft"]
    for m in drafted:
        _draft_k(m, m.partition(":")[2])
    found: list = []

    def once() -> str | Path | None:  # the draft, resolved at most once, where a method needs it
        if not found:
            found.append(draft() if callable(draft) else draft)
        return found[0]

    parsed = {m: parse_method(m, once) for m in names if m not in drafted}
    parsed |= {m: parse_method(m, once) for m in drafted}
    return [parsed[m] for m in names]
