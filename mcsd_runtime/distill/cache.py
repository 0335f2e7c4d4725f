"""Building, caching and finding distilled drafts.

A draft lives in one folder, by default `<cache>/models/distill-<shape>-<recipe>-<hash12>`
(the shape names the target's architecture, layers and width, e.g. `llama-30x576`; the hash
covers the recipe, the target's fingerprint (config, tokenizer, weights) and the code
version, so two copies of one target share a draft): `draft/` (a
`save_pretrained` model with the target's tokenizer and, with a reduced head,
`draft_vocab.safetensors`) and `card.json` (recipe, target fingerprint, held-out agreement on
the target's own chat answers and on text, one-token latencies and their ratio, timings, the
machine, a SHA-256 of every file). A build writes a temporary sibling and renames it at the
end. The generated data are cached apart (`<cache>/distill-data/<shape>-<hash12>`, keyed by
the data fields of the recipe only), so drafts of several recipes share one generation.
"""

from __future__ import annotations

import datetime as _dt
import re
import sys
import time
from pathlib import Path

import torch

from mcsd_runtime.backend.compat import hf_progress_bars_off
from mcsd_runtime.distill.recipe import DistillRecipe, get_recipe
from mcsd_runtime.distill.target import fingerprint, load_target, resolve_target
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import (
    CACHE_HELP,
    build_folder,
    cache_root,
    check_files,
    models_dir,
    read_card_file,
)

CARD_NAME = "card.json"
CARD_FORMAT = "mcsd-distilled-draft"
REMEDY = "choose a writable folder with --out (or set MCSD_CACHE)"  # an unwritable build folder
LATENCY_CONTEXT = 128  # tokens of KV cache behind the one-token forwards of the card


def _tag(folder: Path) -> str:
    """A short name of the target's shape (`llama-30x576`), from its config: a folder's name
    would split the cache between two copies of one target."""
    from transformers import AutoConfig

    from mcsd_runtime.distill.target import _gguf_kwargs

    c = AutoConfig.from_pretrained(folder, **_gguf_kwargs(folder))
    name = f"{c.model_type}-{c.num_hidden_layers}x{c.hidden_size}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).lower()


def data_dir(folder: Path, recipe: DistillRecipe, fp: dict) -> Path:
    """Where the generated data of `recipe` for the target at `folder` are cached."""
    return cache_root() / "distill-data" / f"{_tag(folder)}-{recipe.data_hash12(fp)}"


def draft_dir(folder: Path, recipe: DistillRecipe, fp: dict) -> Path:
    """Where the draft of `recipe` for the target at `folder` is cached."""
    return models_dir() / f"distill-{_tag(folder)}-{recipe.name}-{recipe.hash12(fp)}"


def default_draft_dir(target: str | Path, build: bool = False, progress: bool = True,
                      recipe: str = "default") -> Path:
    """The cached draft folder (the one holding `config.json`) for `target` under the preset
    `recipe`. One that is missing is built only if `build` (a distillation takes tens of minutes
    on a CPU; said on stderr first); MCSDError naming the command otherwise."""
    folder = resolve_target(target, build=build)
    resolved = get_recipe(recipe).resolved()
    root = draft_dir(folder, resolved, fingerprint(folder))
    if not _holds(root):
        how = f"mcsd draft distill --target {target} --recipe {recipe}"
        if not build:
            raise MCSDError(f"no distilled draft ({recipe} recipe) for {target} yet (looked in "
                            f"{root}); build it with `{how}` (`mcsd draft distill --help` says "
                            f"how long each recipe takes), or pass build=True")
        print(f"note: distilling the draft ({recipe} recipe) for {target} on first use (tens of "
              f"minutes on a CPU; `{how}` builds it ahead)", file=sys.stderr)
        root = build_draft(folder, resolved, progress=progress)
    else:
        verify_draft(root, resolved.hash12(fingerprint(folder)))
    return root / "draft"


def build_draft(target: str | Path, recipe: DistillRecipe | str = "default",
                out: str | Path | None = None, force: bool = False, progress: bool = True,
                data: str | Path | None = None, threads: int | None = None,
                device: str | torch.device = "cpu") -> Path:
    """The folder of the draft of `recipe` distilled from `target`, built if missing (or if
    `force`). `out` replaces the cached location, `data` the data cache folder; `threads`
    sets torch's threads for the build (default: as set), and on the CPU as many processes
    of one thread each generate the data. On another `device` (cuda, mps) the target
    generates the data there in this process and the draft trains there; the recipe, and so
    the draft's hash, is the same wherever it is built (the card records the device)."""
    from mcsd_runtime.backend.device import pick_device

    recipe = (get_recipe(recipe) if isinstance(recipe, str) else recipe).resolved()
    device = pick_device(device)
    folder = resolve_target(target, build=True)  # a build: the toy target too, if missing
    fp = fingerprint(folder)
    hash12 = recipe.hash12(fp)
    dest = draft_dir(folder, recipe, fp) if out is None else Path(out)
    if _holds(dest) and not force:
        verify_draft(dest, hash12)
        if progress:
            print(f"distilled draft already built: {dest}", flush=True)
        return dest
    data_folder = Path(data) if data is not None else data_dir(folder, recipe, fp)
    if progress:
        print(f"distilling a draft ({recipe.name} recipe) from {folder} into {dest}"
              + ("" if out is not None else f" (the cache: {CACHE_HELP})")
              + f"; data in {data_folder}"
              + ("" if device.type == "cpu" else f"; on {device}"), flush=True)
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with hf_progress_bars_off():  # transformers' per-shard bars: noise in a build
            card = build_folder(dest, "the distilled draft", REMEDY, lambda tmp: _build_into(
                tmp, recipe, hash12, folder, fp, data_folder, progress, device))
    finally:
        torch.set_num_threads(before)
    if progress:
        print(summary(dest, card), flush=True)
    return dest


def read_card(root: str | Path) -> dict:
    """A distilled draft's card (MCSDError if missing or not such a card)."""

    return read_card_file(root, CARD_NAME, CARD_FORMAT, "distilled-draft", _broken)


def verify_draft(root: str | Path, recipe_hash: str | None = None) -> dict:
    """Check a draft folder: its card (of `recipe_hash` if given) and every listed file with
    its SHA-256. Returns the card."""

    root = Path(root)
    card = read_card(root)
    if recipe_hash is not None and card.get("recipe_hash") != recipe_hash:
        raise MCSDError(f"{root} holds a distilled draft of another recipe or target (hash "
                        f"{card.get('recipe_hash')}, wanted {recipe_hash}); pass --force to "
                        f"rebuild it there or choose another --out")
    check_files(root, card, _broken)
    return card


def summary(root: Path, card: dict) -> str:
    """A few lines describing a built draft."""
    r, d, t, m = card["recipe"], card["draft"], card["target"], card["metrics"]

    def pct(x):
        return "n/a" if x is None else f"{x:.1%}"

    chat, text = m["heldout_chat"], m["heldout_text"]
    vocab = (f"reduced head of {r['vocab']} tokens (covers {pct(m['vocab_coverage_chat'])} of "
             f"held-out chat tokens)" if r["vocab"] else "full head")
    lines = [
        f"distilled draft ({r['name']} recipe): {root}",
        f"  from               {t['folder']}",
        f"  draft              layers {d['layer_ids']} of {t['layers']}, {vocab}, "
        + ("reading the target's states, " if r.get("features") else "") +
        f"{d['params'] / 1e6:.1f} M params",
        f"  data               {card['data']['note']}",
        f"  agreement, chat    top-1 {pct(chat['top1'])}  top-4 {pct(chat['top4'])}  "
        + (f"top-1 on its own states {pct(chat['top1_own'])}  " if "top1_own" in chat else "")
        + f"({chat['positions']} held-out answer tokens)",
        f"  agreement, text    top-1 {pct(text['top1'])}  top-4 {pct(text['top4'])}  "
        f"({text['positions']} held-out tokens)",
        f"  one-token forward  target {t['latency_ms_1thread']:.2f} ms  draft "
        f"{d['latency_ms_1thread']:.2f} ms  (cost ratio {card['cost_ratio_1thread']:.3f}; fp32, "
        f"1 thread)",
        f"  time               generation {card['seconds']['data']:.0f} s (its batches: "
        f"{card['seconds'].get('data_batches_one_thread', 0):.0f} s of one thread), training "
        f"{card['seconds']['train']:.0f} s, build {card['seconds']['build']:.0f} s "
        f"({card['build_machine']['threads']} threads)",
    ]
    return "\n".join(lines)


# --- building -----------------------------------------------------------------------------


def _build_into(tmp: Path, recipe: DistillRecipe, hash12: str, folder: Path, fp: dict,
                data_folder: Path, progress: bool, device: torch.device) -> dict:
    """Distil the draft of `recipe` from the target at `folder` into `tmp` (its data generated
    into or read from `data_folder`), measure it as saved and write its card; returns the
    card."""
    from mcsd_runtime.distill.head import head_of
    from mcsd_runtime.toy.build import _params, build_machine, write_card

    start = time.perf_counter()
    target, draft, data, layer_ids, pad, train_seconds = _distil_into(
        tmp, recipe, folder, data_folder, progress, device)
    reduced = head_of(draft)
    context = (data.heldout_chat or data.heldout_text or data.train)[0].tokens[:LATENCY_CONTEXT]
    chat, text, (t_ms, d_ms) = _measure(draft, target, data, recipe, pad, context, progress)
    counts = data.counts()
    card = {
        "format": CARD_FORMAT,
        "recipe": recipe.to_dict(),
        "recipe_hash": hash12,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "build_machine": {**build_machine(recipe.precision, torch.get_num_threads()),
                          "threads": torch.get_num_threads(), "device": _device_name(device)},
        "target": {"folder": str(folder), "fingerprint": fp,
                   "layers": target.config.num_hidden_layers,
                   "params": _params(target), "latency_ms_1thread": round(t_ms, 3)},
        "draft": {"layer_ids": layer_ids, "params": _params(draft),
                  "vocab": reduced.ids.numel() if reduced is not None else None,
                  "latency_ms_1thread": round(d_ms, 3)},
        "data": {"folder": str(data_folder), "has_chat_template": data.has_chat,
                 "prompt_set_instructions": data.prompts, "counts": counts,
                 "note": _data_note(data, counts)},
        "metrics": _metrics(data, chat, text, reduced, recipe),
        "cost_ratio_1thread": round(d_ms / t_ms, 4),
        "latency_note": (f"median ms of a one-token forward with a KV cache of "
                         f"{int(context.numel())} tokens, fp32, one thread, target and draft "
                         f"alternating, on the build machine"),
        "seconds": {"data": round(data.seconds, 1),
                    "data_batches_one_thread": round(data.batch_seconds, 1),
                    "train": round(train_seconds, 1),
                    "build": round(time.perf_counter() - start, 1)},
    }
    return write_card(tmp, card, CARD_NAME)


def _distil_into(tmp: Path, recipe: DistillRecipe, folder: Path, data_folder: Path,
                 progress: bool, device: torch.device) -> tuple:
    """Load the target at `folder`, generate (or read) its data, distil the draft of `recipe`
    and save it into `tmp/draft`; returns (target, the draft as saved and reloaded, the data,
    the layers kept, the padding id, the training seconds)."""
    from mcsd_runtime.backend.layers import check_layer_ids, target_layer_indices
    from mcsd_runtime.distill.data import generate_data
    from mcsd_runtime.progress import working

    with working(f"loading the target {folder.name}", file=sys.stdout, disable=not progress):
        target, tokenizer = load_target(folder)
    n_layers = target.config.num_hidden_layers
    layer_ids = (check_layer_ids(recipe.layer_ids, n_layers) if recipe.layer_ids
                 else target_layer_indices(n_layers, recipe.layers))
    # generation: on the CPU one process of one thread per core (see data.run_jobs)
    data = generate_data(data_folder, target.to(device), tokenizer, recipe, progress,
                         workers=torch.get_num_threads() if device.type == "cpu" else 1,
                         target_folder=folder)
    target.cpu()
    draft, head, pad, train_seconds = _train_draft(target, tokenizer, data, recipe, layer_ids,
                                                   progress, device)
    out = tmp / "draft"
    _save_draft(draft, head, tokenizer, out, recipe)
    del draft, head
    return target, _load_draft(out), data, layer_ids, pad, train_seconds


def _train_draft(target, tokenizer, data, recipe: DistillRecipe, layer_ids: list[int],
                 progress: bool, device: torch.device) -> tuple:
    """The draft of `recipe` cut from `target` (its layers `layer_ids`), with its reduced head
    (None for the full one), distilled on `data`; returns (draft, head, padding id, training
    seconds)."""
    from mcsd_runtime.backend.layers import cut_draft
    from mcsd_runtime.distill.data import end_ids
    from mcsd_runtime.distill.feature import with_feature_input
    from mcsd_runtime.distill.feature_train import distill_features
    from mcsd_runtime.distill.head import pick_vocab, reduced_head_from
    from mcsd_runtime.distill.train import distill

    stops = end_ids(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    draft = cut_draft(target, layer_ids)
    draft.generation_config = target.generation_config
    head = None
    if recipe.vocab:
        keep = sorted(set(tokenizer.all_special_ids) | set(stops))
        head = reduced_head_from(draft, pick_vocab(data.train, recipe.vocab,
                                                   target.config.vocab_size, keep))
    if recipe.features:
        draft = with_feature_input(draft)
        train_seconds = distill_features(draft, head, target, data.train, recipe, pad, progress,
                                         device)
    else:
        train_seconds = distill(draft, head, data.train, recipe, pad, progress, device)
    return draft, head, pad, train_seconds


def _save_draft(draft, head, tokenizer, out: Path, recipe: DistillRecipe) -> None:
    """Save the trained draft (on the CPU), the target's tokenizer and a reduced head to
    `out`."""
    from mcsd_runtime.distill.feature import save_feature_draft
    from mcsd_runtime.distill.head import save_reduced_head

    draft.cpu()
    if recipe.features:
        save_feature_draft(draft, out)
    else:
        draft.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if head is not None:
        save_reduced_head(head, out)


def _load_draft(out: Path):
    """The draft saved in `out`, loaded as users load it (fp32, eval mode, with its reduced
    head and feature input)."""
    from transformers import AutoModelForCausalLM

    from mcsd_runtime.distill.feature import attach_feature_input
    from mcsd_runtime.distill.head import attach_reduced_head

    return attach_feature_input(attach_reduced_head(
        AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32), out), out).eval()


def _metrics(data, chat: dict, text: dict, reduced, recipe: DistillRecipe) -> dict:
    """The card's `metrics`: the draft's held-out agreement on chat and text, and what share
    of held-out chat tokens its reduced head covers."""
    from mcsd_runtime.distill.agreement import coverage

    return {"heldout_chat": chat, "heldout_text": text,
            "vocab_coverage_chat": coverage(
                reduced.ids if reduced is not None else None, data.heldout_chat),
            "note": "agreement of the draft's argmax (top-1) and top-4 with the "
                    "target's argmax, teacher-forced on held-out sequences never "
                    "trained on: the target's own greedy chat answers to self-written "
                    "queries, and stdlib text" + (
                        "; a feature draft reads the target's state one position back "
                        "(top1, top4: depth 1 of a step) or its own (top1_own: what "
                        "depth 2 and beyond read)" if recipe.features else "")}


def _measure(draft, target, data, recipe: DistillRecipe, pad: int, context: torch.Tensor,
             progress: bool) -> tuple[dict, dict, tuple[float, float]]:
    """The draft's agreement with the target on the held-out chat and text, and the one-thread
    latencies (ms) of a target and a draft forward."""
    from mcsd_runtime.distill.agreement import agreement
    from mcsd_runtime.distill.feature_train import feature_agreement
    from mcsd_runtime.progress import working
    from mcsd_runtime.toy.build import decode_latency_ms
    from mcsd_runtime.toy.training import torch_threads

    held_out = len(data.heldout_chat) + len(data.heldout_text)
    with torch_threads(1), working(f"measuring the draft: agreement on {held_out} held-out "
                                   f"sequences, latency", file=sys.stdout,
                                   disable=not progress):
        if recipe.features:
            chat = feature_agreement(draft, target, data.heldout_chat, recipe.seq_len, pad)
            text = feature_agreement(draft, target, data.heldout_text, recipe.seq_len, pad)
        else:
            chat = agreement(draft, data.heldout_chat, recipe.seq_len, pad)
            text = agreement(draft, data.heldout_text, recipe.seq_len, pad)
        return chat, text, decode_latency_ms(target, draft, context)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def _data_note(data, counts: dict) -> str:
    train = counts["train"]
    parts = [f"{v['sequences']} {k} sequences ({v['trained_tokens']} trained tokens)"
             for k, v in train.items()]
    note = ", ".join(parts) or "no training data"
    if not data.has_chat:
        note += "; the target has no chat template: text only, no self-generated conversations"
    return note


def _holds(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _broken(root: str | Path, what: str) -> str:
    return (f"the distilled draft at {root} is incomplete or damaged: {what}. Rebuild it with "
            f"`mcsd draft distill --force` (same --target, recipe and --out) or delete the "
            f"folder")
