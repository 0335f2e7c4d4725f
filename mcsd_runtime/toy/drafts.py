"""Extra drafts for a built toy target: distilled from it (never retraining it), cached and
located like toy pairs, loaded by name (`toy-draft:NAME`).

A draft lives in one folder, `<cache>/models/toy-draft-<name>-<hash12>`: `draft/` (a
`save_pretrained` model with the target's tokenizer) and `card.json` (recipe, the target it was
distilled from and a SHA-256 of its weights, held-out losses, greedy agreement with the target,
decode latencies and their ratio, a SHA-256 of every file). The hash covers the draft's recipe
and the target's recipe hash; the card's target digest catches a target rebuilt since.
"""

from __future__ import annotations

import datetime as _dt
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from mcsd_runtime.backend.compat import hf_progress_bars_off
from mcsd_runtime.backend.layers import copy_target_layers, target_layer_indices
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import (
    CACHE_HELP,
    build_folder,
    check_files,
    models_dir,
    read_card_file,
)
from mcsd_runtime.progress import working
from mcsd_runtime.toy import build as pair_build
from mcsd_runtime.toy.draft_recipe import DRAFT_PRESETS, DraftRecipe, get_draft_recipe
from mcsd_runtime.toy.recipe import QUICK_PRESETS, get_recipe
from mcsd_runtime.toy.spec import is_toy_spec, parse_draft_spec, parse_toy_spec

__all__ = ["build_draft", "copy_target_layers", "draft_dir", "read_card", "target_layer_indices",
           "verify_draft"]

CARD_NAME = "card.json"
CARD_FORMAT = "mcsd-toy-draft"
TARGET_WEIGHTS = "target/model.safetensors"  # the pair file whose digest names the target


def draft_dir(name: str, target_seed: int = 0) -> Path:
    """Where draft `name` for the toy target of seed `target_seed` is cached (whether or not it
    exists)."""
    recipe = get_draft_recipe(name)
    target = get_recipe(recipe.target_preset, target_seed).resolved()
    return _cached_dir(name, recipe.hash12(target.hash12(), target.precision))


def _cached_dir(name: str, hash12: str) -> Path:
    """`<cache>/models/toy-draft-<name>-<hash12>`."""
    return models_dir() / f"toy-draft-{name}-{hash12}"


def build_draft(name: str, target_seed: int = 0, *, recipe: DraftRecipe | None = None,
                target_root: str | Path | None = None, out: str | Path | None = None,
                force: bool = False, progress: bool = True, target_verified: bool = False
                ) -> Path:
    """The folder of draft `name`, distilled from the toy target first if needed.

    The target is the cached toy pair of the draft's preset and `target_seed` (built first if
    missing), or the pair folder `target_root`. `out` overrides the cached location; `recipe`
    replaces the preset's (experiments, tests); `force` rebuilds a valid draft;
    `target_verified` skips checking a `target_root` the caller has just verified.
    """
    recipe = recipe or get_draft_recipe(name)
    if target_root is None:  # the cached pair, verified (or built) by build_pair
        target_root = pair_build.build_pair(recipe.target_preset, seed=target_seed,
                                            progress=progress)
        target_verified = True
    target_root = Path(target_root)
    target_card = (pair_build.read_card(target_root) if target_verified
                   else pair_build.verify_pair(target_root))
    if target_card["recipe"]["preset"] != recipe.target_preset:
        raise MCSDError(f"draft {recipe.name!r} is distilled from a {recipe.target_preset!r} toy "
                        f"target, but {target_root} holds a {target_card['recipe']['preset']!r} "
                        f"pair")
    recipe = recipe.resolved(target_card["recipe"]["precision"])
    hash12 = recipe.hash12(target_card["recipe_hash"], recipe.precision)
    dest = _cached_dir(recipe.name, hash12) if out is None else Path(out)
    if _holds(dest) and not force:
        verify_draft(dest, target_root, hash12)
        return dest
    if progress:
        print(f"distilling the toy draft {recipe.name!r} from {target_root / 'target'} into "
              f"{dest}" + ("" if out is not None else f" (the cache: {CACHE_HELP})"), flush=True)
    with hf_progress_bars_off():  # transformers' per-shard bars: noise in a build
        card = build_folder(dest, "the toy draft", pair_build.REMEDY, lambda tmp: _build_into(
            tmp, recipe, hash12, target_root, target_card, progress))
    if progress:
        print(draft_summary(dest, card), flush=True)
    return dest


def resolve_draft(draft_spec: str, target_spec: str, build: bool = False) -> tuple[str, str]:
    """(target dir, draft dir) for `--target TARGET_SPEC --draft toy-draft:NAME`. The target
    must be the toy pair the draft is made for. A draft (or its target) not built yet is built
    if `build` (said on stderr) or if its target's preset builds in seconds (`QUICK_PRESETS`);
    otherwise MCSDError says how to build it."""
    name = parse_draft_spec(draft_spec)
    recipe = get_draft_recipe(name)
    wanted = "toy" if recipe.target_preset == "default" else f"toy:{recipe.target_preset}"
    if not is_toy_spec(target_spec):
        raise MCSDError(f"draft {draft_spec!r} is distilled from the embedded toy target: pass "
                        f"--target {wanted} (or leave --target out), not {target_spec!r}")
    preset, seed = parse_toy_spec(target_spec)
    if preset != recipe.target_preset:
        raise MCSDError(f"draft {draft_spec!r} is distilled from the {recipe.target_preset!r} toy "
                        f"target: pass --target {wanted}, not {target_spec!r}")
    if preset not in QUICK_PRESETS and not (_holds(pair_build.pair_dir(preset, seed))
                                            and _holds(draft_dir(name, seed))):
        how = f"mcsd toy draft {name}" + (f" --seed {seed}" if seed else "")
        if not build:
            raise MCSDError(f"the toy draft {draft_spec} (or its target {target_spec}) is not "
                            f"built yet: build it with `{how}` (it trains for minutes, the "
                            f"target first if missing), or pass build=True")
        print(f"note: building the toy draft {draft_spec} on first use (it trains for minutes; "
              f"`{how}` builds it ahead)", file=sys.stderr)
    target_root = pair_build.build_pair(preset, seed=seed)  # verified once, here
    root = build_draft(name, seed, target_root=target_root, target_verified=True)
    return str(target_root / "target"), str(root / "draft")


def read_card(root: str | Path) -> dict:
    """A built draft's card (MCSDError if missing or not a draft card)."""
    return read_card_file(root, CARD_NAME, CARD_FORMAT, "toy-draft", _broken)


def verify_draft(root: str | Path, target_root: str | Path | None = None,
                 recipe_hash: str | None = None) -> dict:
    """Check a draft folder: its card (of `recipe_hash` if given), every listed file with its
    SHA-256, a loadable config, and, given `target_root`, that it was distilled from that
    target's weights. Returns the card."""
    root = Path(root)
    card = read_card(root)
    if recipe_hash is not None and card.get("recipe_hash") != recipe_hash:
        raise MCSDError(f"{root} holds a toy draft of another recipe (hash "
                        f"{card.get('recipe_hash')}, wanted {recipe_hash}); pass --force to "
                        f"rebuild it there or choose another --out")
    check_files(root, card, _broken)
    if target_root is not None:
        digest = pair_build.read_card(target_root).get("files", {}).get(TARGET_WEIGHTS)
        if card.get("target", {}).get("weights_sha256") != digest:
            raise MCSDError(f"the toy draft at {root} was distilled from another build of the "
                            f"target than {Path(target_root) / 'target'}; rebuild it with "
                            f"`mcsd toy draft {card['recipe']['name']} --force`")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(root / "draft")
    except Exception as err:  # noqa: BLE001 - any load failure means a broken draft
        raise MCSDError(_broken(root, f"draft/ does not load ({err})")) from None
    return card


def draft_summary(root: Path, card: dict) -> str:
    """A few lines describing a built draft."""
    d, t = card["draft"], card["target"]
    shape = card["recipe"]["shape"]
    layers = f"{shape['layers']} layer" + ("s" if shape["layers"] > 1 else "")
    return "\n".join([
        f"toy draft {card['recipe']['name']} ({layers}, d={shape['hidden']}, "
        f"{d['params'] / 1e6:.2f} M params, from {card['recipe']['init']}): {root}",
        f"  distilled from      {t['folder']} (its {t['layers']}-layer target)",
        f"  held-out NLL/token  target {t['heldout_nll']:.3f}  draft {d['heldout_nll']:.3f}",
        f"  greedy agreement    {card['agreement']:.1%}",
        f"  decode step, 1 thread  target {t['latency_ms_1thread']:.2f} ms  draft "
        f"{d['latency_ms_1thread']:.2f} ms  (ratio {card['latency_ratio_1thread']:.1f}x)",
        f"  build time          {card['build_seconds']:.0f} s",
    ])


def list_drafts(target_seed: int = 0) -> list[tuple[str, DraftRecipe, Path | None]]:
    """Every draft preset with its folder when built (None otherwise)."""
    out = []
    for name, recipe in DRAFT_PRESETS.items():
        folder = draft_dir(name, target_seed)
        out.append((name, recipe, folder if _holds(folder) else None))
    return out


# --- building -----------------------------------------------------------------------------


def _build_into(folder: Path, recipe: DraftRecipe, hash12: str, target_root: Path,
                target_card: dict, progress: bool) -> dict:
    """Distil the draft of `recipe` from the toy target in `target_root` into `folder`,
    measure it as saved and write its card; returns the card."""
    from transformers import AutoModelForCausalLM

    from mcsd_runtime.toy.training import TRAIN_THREADS, torch_threads

    start = time.perf_counter()
    pair_recipe = target_card["recipe"]
    tokenizer, target, stream = _load_target(target_root, pair_recipe)
    with torch_threads(TRAIN_THREADS):
        draft, seconds = _distil(recipe, target, tokenizer, stream, progress)
    draft.save_pretrained(folder / "draft")
    tokenizer.save_pretrained(folder / "draft")
    del draft
    draft = AutoModelForCausalLM.from_pretrained(folder / "draft", dtype=torch.float32).eval()
    metrics, (t_ms, d_ms) = _measure(target, draft, tokenizer, pair_recipe, progress)
    card = {
        "format": CARD_FORMAT,
        "recipe": recipe.to_dict(),
        "recipe_hash": hash12,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "build_machine": pair_build.build_machine(recipe.precision, TRAIN_THREADS),
        "reproducibility_note": pair_build.REPRODUCIBILITY_NOTE,
        "train_seconds": round(seconds, 1),
        "build_seconds": round(time.perf_counter() - start, 1),
        "heldout_eval_tokens": metrics["tokens"],
        "target": {"folder": target_root.name, "recipe_hash": target_card["recipe_hash"],
                   "weights_sha256": target_card["files"].get(TARGET_WEIGHTS),
                   "layers": target.config.num_hidden_layers,
                   "params": pair_build._params(target),
                   "heldout_nll": round(metrics["target_nll"], 4),
                   "latency_ms_1thread": round(t_ms, 3)},
        "draft": {"params": pair_build._params(draft),
                  "heldout_nll": round(metrics["draft_nll"], 4),
                  "latency_ms_1thread": round(d_ms, 3)},
        "agreement": round(metrics["agreement"], 4),
        "latency_ratio_1thread": round(t_ms / d_ms, 2),
        "latency_note": (f"median ms of a one-token forward with a KV cache of "
                         f"{pair_build.LATENCY_CONTEXT} tokens, fp32, one thread, target and "
                         f"draft alternating, on the build machine"),
    }
    return pair_build.write_card(folder, card, CARD_NAME)


def _load_target(target_root: Path, pair_recipe: dict) -> tuple[Any, torch.nn.Module,
                                                                  torch.Tensor]:
    """The toy pair's tokenizer and target (fp32, eval mode) from `target_root`, and the token
    stream of the training split its recipe `pair_recipe` trained on."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcsd_runtime.toy.corpus import split_texts
    from mcsd_runtime.toy.training import token_stream

    tokenizer = AutoTokenizer.from_pretrained(target_root / "target")
    target = AutoModelForCausalLM.from_pretrained(target_root / "target",
                                                  dtype=torch.float32).eval()
    texts = split_texts("train")
    if pair_recipe["max_train_chars"]:
        texts = pair_build._limit_chars(texts, pair_recipe["max_train_chars"])
    return tokenizer, target, token_stream(texts, tokenizer)


def _measure(target: torch.nn.Module, draft: torch.nn.Module, tokenizer, pair_recipe: dict,
             progress: bool) -> tuple[dict, tuple[float, float]]:
    """The draft's held-out metrics beside the target on the pair's evaluation windows, and
    the one-thread latencies (ms) of a target and a draft forward."""
    from mcsd_runtime.toy.corpus import split_texts
    from mcsd_runtime.toy.training import eval_windows, heldout_metrics, token_stream, torch_threads

    heldout = token_stream(split_texts("eval"), tokenizer)
    windows = eval_windows(heldout, pair_recipe["seq_len"], pair_recipe["eval_windows"],
                           tokenizer.bos_token_id)
    context = heldout[:pair_build.LATENCY_CONTEXT]
    with torch_threads(1), working(f"measuring the draft: held-out loss on {len(windows)} "
                                   f"windows, latency", file=sys.stdout, disable=not progress):
        metrics = heldout_metrics(target, draft, windows)
        return metrics, pair_build.decode_latency_ms(target, draft, context)


def _distil(recipe: DraftRecipe, target, tokenizer, stream: torch.Tensor,
            progress: bool) -> tuple[torch.nn.Module, float]:
    """The draft of `recipe`, initialised and distilled from the frozen `target` on `stream`;
    returns it (eval mode) and the training seconds."""
    import lightning.pytorch as pl

    from mcsd_runtime.toy.training import (
        JointModule,
        WindowDataset,
        _fit,
        _quiet_lightning,
        make_model,
    )

    _quiet_lightning()
    # the frozen target is in eval mode on purpose (no dropout, nothing trains)
    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")
    pl.seed_everything(recipe.seed, workers=True, verbose=False)
    draft = make_model(recipe.shape, len(tokenizer), tokenizer,
                       target.config.max_position_embeddings)
    if recipe.init == "target-layers":
        copy_target_layers(target, draft)
    data = WindowDataset(stream, recipe.seq_len, recipe.steps * recipe.batch_size,
                         tokenizer.bos_token_id, recipe.seed + 2)
    module = JointModule(target, draft, steps=recipe.steps, target_lr=0.0, draft_lr=recipe.lr,
                         ce_weight=recipe.ce_weight, warmup_frac=recipe.warmup_frac,
                         train_target=False)
    if progress:
        print(f"distilling draft {recipe.name}: {recipe.steps} steps", flush=True)
    seconds = _fit(module, data, recipe.batch_size, recipe.steps, recipe.precision, progress,
                   f"distilling draft {recipe.name}")
    return draft.eval(), seconds


def _holds(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _broken(root: str | Path, what: str) -> str:
    return (f"the toy draft at {root} is incomplete or damaged: {what}. Rebuild it with "
            f"`mcsd toy draft NAME --force` or delete the folder")
