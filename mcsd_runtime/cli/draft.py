"""`mcsd draft`: distil a draft for any target (`distill`) and show a built draft (`show`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mcsd_runtime.cli.args import (
    add_device_arg,
    add_force_arg,
    add_limit_arg,
    add_out_arg,
    add_prompts_arg,
    add_recipe_arg,
    add_seed_arg,
    add_target_arg,
    add_threads_arg,
)
from mcsd_runtime.distill.recipe import PRESETS


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `mcsd draft distill` and `mcsd draft show`."""
    draft = subparsers.add_parser(
        "draft",
        help="distil a draft for any target, or show a built one",
        description=(
            "Drafts distilled from a target: the target's embeddings, final norm and a few of "
            "its layers, trained on the target's own chat answers (it writes queries itself "
            "from its chat template's user prefix and answers them greedily, offline) and some "
            "plain text, optionally with a reduced-vocabulary head (exact: tokens it lacks "
            "get probability 0). Built drafts are cached by recipe and target fingerprint."),
    )
    sub = draft.add_subparsers(dest="draft_command", metavar="ACTION", required=True)
    _add_distill(sub)
    _add_show(sub)


def _add_distill(sub: argparse._SubParsersAction) -> None:
    """Add `mcsd draft distill`."""
    default = PRESETS["default"]
    distill = sub.add_parser(
        "distill",
        help="build (or find) the draft of a recipe for a target",
        description=(
            "Distil a draft from TARGET (a local model folder written by save_pretrained or "
            "holding one .gguf file; toy or toy:tiny for the embedded toy target). The draft "
            "is cached under <cache>/models/distill-<shape>-<recipe>-<hash> (the cache: "
            "$MCSD_CACHE, else $XDG_CACHE_HOME/mcsd, else ~/.cache/mcsd) with a card: held-out "
            "greedy and top-4 agreement with the target on its own chat answers and on text, "
            "one-token latencies and their ratio; the generated data are cached apart (a "
            "crashed run resumes, other recipes reuse them). The default recipe ("
            f"{default.layers} layers, vocab {default.vocab}, {default.conversations} "
            f"conversations, {default.steps} steps) takes about 25 minutes for a SmolLM2-sized "
            "target on a 2-core CPU and about 2 on a GPU (--device); features is a one-layer "
            "draft reading the target's states (--features) trained on three times the "
            "conversations (about an hour on a 2-core CPU); tiny is for tests. Options below "
            "override the recipe (and so its hash)."),
    )
    add_target_arg(distill, "the target: a local model folder, smollm2, or toy / toy:tiny",
                   required=True)
    add_recipe_arg(distill, sorted(PRESETS), "the recipe preset (default: %(default)s)")
    _add_recipe_overrides(distill)
    _add_build_options(distill)
    distill.set_defaults(func=run_distill)


def _add_recipe_overrides(distill: argparse.ArgumentParser) -> None:
    """The options of `mcsd draft distill` that override the recipe's fields, from --layers to
    --batch-size."""
    layers = distill.add_mutually_exclusive_group()
    layers.add_argument("--layers", type=int, default=None,
                        help="number of target layers kept, evenly spaced from the first to "
                             "the last (default: the recipe's)")
    layers.add_argument("--layer-ids", default=None, metavar="I,J,...",
                        help="the target layers kept, e.g. 0,10,20,29 (-1: the last)")
    distill.add_argument("--features", action="store_true", default=None,
                         help="a feature draft: it also reads the target's final state one "
                              "position back (the decoder hands the target's states over), "
                              "e.g. with --layers 1")
    distill.add_argument("--steps", type=int, default=None,
                         help="optimizer steps (default: the recipe's)")
    distill.add_argument("--conversations", type=int, default=None,
                         help="self-generated training conversations (default: the recipe's)")
    distill.add_argument("--vocab", type=int, default=None,
                         help="tokens of the reduced head, 0 for the target's full head "
                              "(default: the recipe's)")
    distill.add_argument("--text-tokens", type=int, default=None,
                         help="tokens of plain text trained on (default: the recipe's)")
    distill.add_argument("--lr", type=float, default=None, help="peak learning rate "
                         "(default: the recipe's)")
    distill.add_argument("--seq-len", type=int, default=None,
                         help="tokens per packed training row (default: the recipe's)")
    distill.add_argument("--batch-size", type=int, default=None,
                         help="rows per optimizer step (default: the recipe's)")


def _add_build_options(distill: argparse.ArgumentParser) -> None:
    """The options of `mcsd draft distill` from --prompts on: extra instructions, seed, where
    the draft and its data go, threads, device and --force."""
    add_prompts_arg(distill, "also answer the instructions of this prompt set (`mcsd prompts`) "
                             "and train on them")
    add_limit_arg(distill, "at most this many instructions of --prompts")
    add_seed_arg(distill, "seed (default: the recipe's)", default=None)
    add_out_arg(distill, "folder for the draft instead of the cache")
    distill.add_argument("--data", type=Path, default=None,
                         help="folder for the generated data instead of the cache")
    add_threads_arg(distill, default=0, help="torch threads for the build (default 0: torch's "
                                             "own)")
    add_device_arg(distill, " (default %(default)s): where the target generates the data and "
                            "the draft trains; the draft is the same recipe wherever it is built")
    add_force_arg(distill)


def _add_show(sub: argparse._SubParsersAction) -> None:
    """Add `mcsd draft show`."""
    show = sub.add_parser(
        "show",
        help="verify a built draft and print its card",
        description="Verify a distilled draft's folder (card, checksums) and print a summary of "
                    "its card, or the whole card with --json. PATH is the folder holding "
                    "card.json or its draft/ subfolder.")
    show.add_argument("path", type=Path, metavar="PATH",
                      help="the draft's folder (holding card.json) or its draft/ subfolder")
    show.add_argument("--json", action="store_true", help="print the whole card as JSON")
    show.set_defaults(func=run_show)


def _overrides(args: argparse.Namespace) -> dict:
    from mcsd_runtime.errors import MCSDError

    out = {"layers": args.layers, "steps": args.steps, "conversations": args.conversations,
           "vocab": args.vocab, "text_tokens": args.text_tokens, "lr": args.lr,
           "seq_len": args.seq_len, "batch_size": args.batch_size,
           "prompts": args.prompts, "prompt_limit": args.limit, "seed": args.seed,
           "features": args.features}
    if args.layer_ids is not None:
        try:
            out["layer_ids"] = tuple(int(x) for x in args.layer_ids.split(",") if x.strip())
        except ValueError:
            raise MCSDError(f"--layer-ids takes comma-separated integers, e.g. 0,10,20,29; got "
                            f"{args.layer_ids!r}") from None
    return out


def run_distill(args: argparse.Namespace) -> int:
    from mcsd_runtime.cli.args import check_threads
    from mcsd_runtime.distill.cache import build_draft
    from mcsd_runtime.distill.recipe import get_recipe

    check_threads(args.threads)
    recipe = get_recipe(args.recipe, **_overrides(args))
    root = build_draft(args.target, recipe, out=args.out, force=args.force, data=args.data,
                       threads=args.threads or None, device=args.device)
    print(root / "draft")
    return 0


def run_show(args: argparse.Namespace) -> int:
    import json

    from mcsd_runtime.distill.cache import CARD_NAME, summary, verify_draft
    from mcsd_runtime.errors import MCSDError

    root = args.path
    if root.name == "draft" and not (root / CARD_NAME).exists():
        root = root.parent
    if not root.is_dir():
        raise MCSDError(f"no draft folder at {args.path}")
    card = verify_draft(root)
    print(json.dumps(card, indent=2) if args.json else summary(root, card))
    return 0
