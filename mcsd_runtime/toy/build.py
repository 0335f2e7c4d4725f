"""Build, cache, verify and locate the toy target/draft pair.

A pair lives in one folder: `target/` and `draft/` (each a `save_pretrained` model with the
shared tokenizer) and `card.json`. The default folder is `models_dir()/toy-<preset>-<hash12>`
in the user cache (`mcsd_runtime.paths`), where the hash covers the recipe, the seed, the code
version and the stdlib version. A build writes into a temporary sibling folder and renames it at
the end, so an interrupted build never looks complete; the card records a SHA-256 of every file,
so a damaged pair is detected.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from mcsd_runtime.backend.compat import hf_progress_bars_off
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import (
    CACHE_HELP,
    build_folder,
    check_files,
    file_sha256,
    models_dir,
    read_card_file,
)
from mcsd_runtime.progress import working
from mcsd_runtime.toy.corpus import split_texts, stdlib_version
from mcsd_runtime.toy.recipe import (
    QUICK_PRESETS,
    TOY_CODE_VERSION,
    Recipe,
    _cpu_bf16_ok,
    get_recipe,
)
from mcsd_runtime.toy.spec import is_toy_spec, parse_toy_spec

CARD_NAME = "card.json"
CARD_FORMAT = "mcsd-toy-pair"
REMEDY = "choose a writable folder with --out (or set MCSD_CACHE)"  # an unwritable build folder
LATENCY_CONTEXT = 128
LATENCY_MAX_SECONDS = 8.0  # per thread setting; background load can make steps very slow
REPRODUCIBILITY_NOTE = (
    "The weights are a function of the recipe (recipe_hash) and of build_machine: the same "
    "torch, precision, CPU instruction set (cpu_capability) and train_threads rebuild the same "
    "bits for a seed. Across x86 machines they differ, because CPU kernels (oneDNN/MKL, fp32 "
    "and bf16 alike) round differently by instruction set (AVX2, AVX-512, AMX) and vector "
    "width. Measured on the default preset, same recipe hash, two 2-core x86 machines: held-out "
    "NLL 4.253/4.540 vs 4.246/4.564 (target/draft; expect +-0.02 nats), greedy agreement 58.4% "
    "vs 56.1% (expect 56-58%), and tau of mcsd:1,1,1,1 in the demo's evaluation 2.84 vs 2.41 "
    "(expect 2.4-2.8). Compare pairs built on different machines as ranges, not digit by digit."
)


def pair_dir(preset: str = "default", seed: int = 0, precision: str = "auto") -> Path:
    """Where `build_pair(preset, seed=seed)` caches its pair (whether or not it exists);
    `precision` other than "auto" names the pair of that recipe override."""
    recipe = get_recipe(preset, seed, **({} if precision == "auto" else
                                          {"precision": precision}))
    return _default_dir(recipe)


def _default_dir(recipe: Recipe) -> Path:
    """The cache folder of `recipe`'s pair."""
    return models_dir() / f"toy-{recipe.preset}-{recipe.hash12()}"


def where_looked() -> str:
    """Where a missing toy pair was looked for, naming the variables that move it."""
    return f"looked in {models_dir()} ({CACHE_HELP})"


def build_pair(preset: str = "tiny", out: str | Path | None = None, seed: int = 0,
               force: bool = False, progress: bool = True,
               recipe: Recipe | None = None) -> Path:
    """The folder of the toy pair for `preset` and `seed`, building it if needed.

    `out` overrides the cached location; `force` rebuilds even over a valid pair. A folder that
    exists but does not verify raises MCSDError (unless `force`). `recipe` replaces the preset's
    recipe entirely (experiments and tests).
    """
    recipe = (recipe or get_recipe(preset, seed)).resolved()
    dest = Path(out) if out is not None else _default_dir(recipe)
    if dest.exists() and not force and not _empty_dir(dest):
        verify_pair(dest, recipe)
        return dest
    if progress:
        print(f"building the toy pair ({recipe.preset}, seed {recipe.seed}) into {dest}"
              + ("" if out is not None else f" (the cache: {CACHE_HELP})"), flush=True)
    with hf_progress_bars_off():  # transformers' per-shard bars: noise in a build
        card = build_folder(dest, "the toy pair", REMEDY,
                            lambda tmp: _build_into(tmp, recipe, progress))
    if progress:
        print(summary(dest, card), flush=True)
    return dest


def toy_pair_dirs(preset: str = "default", seed: int = 0) -> tuple[Path, Path]:
    """(target dir, draft dir) of the toy pair, built if needed (quietly when cached)."""
    root = build_pair(preset, seed=seed)
    return root / "target", root / "draft"


def resolve_toy(spec: str, build: bool = False) -> tuple[str, str] | None:
    """`toy`, `toy:default`, `toy:tiny` (optionally `toy:<preset>:<seed>`) -> (target dir,
    draft dir) as strings; None for any other string (a real model name). A pair not built yet
    is built if `build` (said on stderr) or if its preset builds in seconds (`QUICK_PRESETS`);
    otherwise MCSDError says how to build it."""
    if not is_toy_spec(spec):
        return None
    preset, seed = parse_toy_spec(spec)
    if preset not in QUICK_PRESETS and not _holds(pair_dir(preset, seed)):
        how = f"mcsd toy build --recipe {preset}" + (f" --seed {seed}" if seed else "")
        if not build:
            raise MCSDError(f"the toy pair {spec} is not built yet ({where_looked()}): build it "
                            f"with `{how}` (it trains for minutes), or pass build=True")
        print(f"note: building the toy pair {spec} on first use (it trains for minutes; "
              f"`{how}` builds it ahead)", file=sys.stderr)
    target, draft = toy_pair_dirs(preset, seed)
    return str(target), str(draft)


def read_card(root: str | Path) -> dict:
    """The pair's card (MCSDError if missing or unreadable)."""
    return read_card_file(root, CARD_NAME, CARD_FORMAT, "toy-pair", _broken)


def verify_pair(root: str | Path, recipe: Recipe | None = None) -> dict:
    """Check a pair folder: card readable, of `recipe` if given, every listed file present with
    its recorded SHA-256, and both configs and the tokenizer loadable. Returns the card."""
    root = Path(root)
    if not root.is_dir():
        raise MCSDError(_broken(root, "it is not a folder"))
    card = read_card(root)
    if recipe is not None and card.get("recipe_hash") != recipe.hash12():
        raise MCSDError(
            f"{root} holds a toy pair of another recipe (hash {card.get('recipe_hash')}, wanted "
            f"{recipe.hash12()}); pass --force to rebuild it there or choose another --out"
        )
    check_files(root, card, _broken)
    from transformers import AutoConfig, AutoTokenizer

    for sub in ("target", "draft"):
        try:
            AutoConfig.from_pretrained(root / sub)
        except Exception as err:  # noqa: BLE001 - any load failure means a broken pair
            raise MCSDError(_broken(root, f"{sub}/ does not load ({err})")) from None
    try:
        AutoTokenizer.from_pretrained(root / "target")
    except Exception as err:  # noqa: BLE001
        raise MCSDError(_broken(root, f"the tokenizer does not load ({err})")) from None
    return card


def summary(root: Path, card: dict) -> str:
    """A few lines describing a built pair."""
    t, d = card["target"], card["draft"]
    return "\n".join([
        f"toy pair ({card['recipe']['preset']}, seed {card['recipe']['seed']}): {root}",
        f"  held-out NLL/token  target {t['heldout_nll']:.3f}  draft {d['heldout_nll']:.3f}",
        f"  greedy agreement    {card['agreement']:.1%}",
        f"  decode step latency target {t['latency_ms']:.2f} ms  draft {d['latency_ms']:.2f} ms"
        f"  (ratio {card['latency_ratio']:.1f}x; {card['latency_threads']} threads)",
        f"                      target {t['latency_ms_1thread']:.2f} ms  "
        f"draft {d['latency_ms_1thread']:.2f} ms  (ratio {card['latency_ratio_1thread']:.1f}x; "
        "1 thread)",
        f"  build time          {card['build_seconds']:.0f} s",
        *([_machine_line(card["build_machine"])] if "build_machine" in card else []),
    ])


def _machine_line(m: dict) -> str:
    cpu = f"{m.get('cpu_capability')}" + (f" ({m['cpu_model']})" if m.get("cpu_model") else "")
    threads = m.get("train_threads")
    return (f"  built with          {m.get('precision')}, torch {m.get('torch')}, {cpu}, "
            f"{threads} training thread{'s' if threads != 1 else ''}")


# --- building -----------------------------------------------------------------------------


def _measure(target, draft, windows: torch.Tensor, context: torch.Tensor,
             progress: bool) -> tuple[dict, tuple[float, float], tuple[float, float]]:
    """The pair's held-out metrics on `windows`, and its forwards' latencies (ms) after
    `context`, on one thread and on the threads set."""
    from mcsd_runtime.toy.training import heldout_metrics, torch_threads

    with working(f"measuring the pair: held-out loss on {len(windows)} windows, latency",
                 file=sys.stdout, disable=not progress):
        with torch_threads(1):
            metrics = heldout_metrics(target, draft, windows)
            one_thread = decode_latency_ms(target, draft, context)
        return metrics, one_thread, decode_latency_ms(target, draft, context)


def _build_into(folder: Path, recipe: Recipe, progress: bool) -> dict:
    """Train the pair of `recipe` into `folder`, measure it as saved and write its card;
    returns the card."""
    from transformers import AutoModelForCausalLM

    from mcsd_runtime.toy.training import TRAIN_THREADS, eval_windows, train_pair

    start = time.perf_counter()
    texts, tokenizer, stream, heldout = _tokenize(recipe, progress)
    target, draft, seconds = train_pair(recipe, tokenizer, stream, progress)
    for sub, model in (("target", target), ("draft", draft)):
        model.save_pretrained(folder / sub)
        tokenizer.save_pretrained(folder / sub)
    del target, draft
    # Everything below uses the saved folders, loaded the way users load them.
    target = AutoModelForCausalLM.from_pretrained(folder / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(folder / "draft", dtype=torch.float32).eval()
    windows = eval_windows(heldout, recipe.seq_len, recipe.eval_windows, tokenizer.bos_token_id)
    metrics, one_thread, threads = _measure(target, draft, windows, heldout[:LATENCY_CONTEXT],
                                            progress)
    card = {
        "format": CARD_FORMAT,
        "recipe": recipe.to_dict(),
        "recipe_hash": recipe.hash12(),
        "code_version": TOY_CODE_VERSION,
        "stdlib": stdlib_version(),
        "versions": _versions(),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "build_machine": build_machine(recipe.precision, TRAIN_THREADS),
        "reproducibility_note": REPRODUCIBILITY_NOTE,
        "corpus": {"train_tokens": int(stream.numel()), "heldout_tokens": int(heldout.numel()),
                   "train_chars": sum(map(len, texts))},
        "train_seconds": {k: round(v, 1) for k, v in seconds.items()},
        "build_seconds": round(time.perf_counter() - start, 1),
        **_pair_fields(target, draft, metrics, one_thread, threads),
    }
    return write_card(folder, card, CARD_NAME)


def _tokenize(recipe: Recipe, progress: bool) -> tuple[list[str], Any, torch.Tensor,
                                                       torch.Tensor]:
    """The stdlib training texts of `recipe`, the tokenizer trained on them, and the token
    streams of the training and held-out splits."""
    from mcsd_runtime.toy.tokenizer import train_tokenizer
    from mcsd_runtime.toy.training import token_stream

    texts = split_texts("train")
    if recipe.max_train_chars:
        texts = _limit_chars(texts, recipe.max_train_chars)
    with working(f"training the tokenizer ({recipe.vocab_size} tokens) on "
                 f"{sum(map(len, texts)) / 1e6:.1f} M characters of stdlib code",
                 file=sys.stdout, disable=not progress):
        tokenizer = train_tokenizer(texts, recipe.vocab_size)
        stream = token_stream(texts, tokenizer)
        heldout = token_stream(split_texts("eval"), tokenizer)
    return texts, tokenizer, stream, heldout


def _versions() -> dict[str, str]:
    """The versions of torch, transformers and lightning that built a pair."""
    import lightning
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "lightning": lightning.__version__}


def _pair_fields(target: torch.nn.Module, draft: torch.nn.Module, metrics: dict,
                 one_thread: tuple[float, float], threads: tuple[float, float]) -> dict:
    """The card's measurements of a pair: held-out metrics, and the (target, draft) latencies
    in ms on one thread and on the threads set, with their ratios."""
    (t1_ms, d1_ms), (t_ms, d_ms) = one_thread, threads
    return {
        "heldout_eval_tokens": metrics["tokens"],
        "target": {"params": _params(target), "heldout_nll": round(metrics["target_nll"], 4),
                   "latency_ms": round(t_ms, 3), "latency_ms_1thread": round(t1_ms, 3)},
        "draft": {"params": _params(draft), "heldout_nll": round(metrics["draft_nll"], 4),
                  "latency_ms": round(d_ms, 3), "latency_ms_1thread": round(d1_ms, 3)},
        "agreement": round(metrics["agreement"], 4),
        "latency_ratio": round(t_ms / d_ms, 2),
        "latency_ratio_1thread": round(t1_ms / d1_ms, 2),
        "latency_threads": torch.get_num_threads(),
        "latency_note": (f"median ms of a one-token forward with a KV cache of {LATENCY_CONTEXT} "
                         f"tokens, fp32, on the build machine, with the default "
                         f"{torch.get_num_threads()} torch threads (latency_ms) and with one "
                         "thread (latency_ms_1thread; robust when other processes share the "
                         "CPU)"),
    }


def write_card(folder: Path, card: dict, name: str) -> dict:
    """`card` with a SHA-256 of every file in `folder` (its last field, `files`), written to
    `folder/name` as indented JSON; returns it."""
    card["files"] = {p.relative_to(folder).as_posix(): file_sha256(p)
                     for p in sorted(folder.rglob("*")) if p.is_file()}
    (folder / name).write_text(json.dumps(card, indent=2) + "\n")
    return card


def build_machine(precision: str, train_threads: int) -> dict:
    """The facts about this machine and torch that, with the recipe, determine a build's bits."""
    env = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                      "DNNL_MAX_CPU_ISA") if k in os.environ}
    return {
        "precision": precision,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_bf16": _cpu_bf16_ok(),
        "cpu_model": cpu_model(),
        "arch": platform.machine(),
        "train_threads": train_threads,
        "isa_env": env,
    }


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


@torch.inference_mode()
def decode_latency_ms(target: torch.nn.Module, draft: torch.nn.Module, context: torch.Tensor,
                      reps: int = 200, max_seconds: float | None = None) -> tuple[float, float]:
    """Median ms of one decode step (one new token, KV cache of len(context)) for each model,
    measured in alternating blocks of 20 so that background load affects both alike; stops
    early after `max_seconds`."""
    from transformers import DynamicCache

    from mcsd_runtime.backend.compat import cache_kwargs

    times: list[list[float]] = [[], []]
    models = (target, draft)
    caches = [DynamicCache() for _ in models]
    for m, cache in zip(models, caches, strict=True):
        m(input_ids=context[None], **cache_kwargs(m, cache), use_cache=True)
    token = context[-1:][None]
    budget = LATENCY_MAX_SECONDS if max_seconds is None else max_seconds
    deadline = time.perf_counter() + budget
    block = 0
    while len(times[1]) < reps and (block < 3 or time.perf_counter() < deadline):
        for k, model in enumerate(models):
            for _ in range(20):
                t0 = time.perf_counter()
                model(input_ids=token, **cache_kwargs(model, caches[k]), use_cache=True)
                elapsed = time.perf_counter() - t0
                caches[k].crop(-1)
                if block >= 1:  # the first block warms up
                    times[k].append(elapsed)
        block += 1
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def _holds(path: Path) -> bool:
    """Whether `path` is a folder with something in it."""
    return path.is_dir() and any(path.iterdir())


def _empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _limit_chars(texts: list[str], limit: int) -> list[str]:
    """The first texts (in path order) up to about `limit` characters in all."""
    out, total = [], 0
    for text in texts:
        if total >= limit:
            break
        out.append(text)
        total += len(text)
    return out


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _broken(root: str | Path, what: str) -> str:
    return (f"the toy pair at {root} is incomplete or damaged: {what}. Rebuild it with "
            f"`mcsd toy build --force` (same preset/--out) or delete the folder")
