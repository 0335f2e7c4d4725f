"""`mcsd toy`: build or inspect the embedded toy target/draft pair."""

from __future__ import annotations

import argparse
import time

from mcsd_runtime.cli.args import (
    add_force_arg,
    add_list_arg,
    add_out_arg,
    add_recipe_arg,
    add_seed_arg,
)
from mcsd_runtime.toy.draft_recipe import DRAFT_PRESETS
from mcsd_runtime.toy.recipe import PRESETS

PRECISIONS = ("auto", "32-true")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `mcsd toy build`, `mcsd toy info` and `mcsd toy draft` (and `mcsd prompts`, which
    previews the toy pair's prompt sets, when its own entry point has not added it)."""
    if "prompts" not in subparsers.choices:
        from mcsd_runtime.cli.prompts import register as register_prompts

        register_prompts(subparsers)
    toy = subparsers.add_parser(
        "toy",
        help="build or inspect the embedded toy model pair",
        description=(
            "The embedded default model pair: a Llama-architecture target and draft trained "
            "offline on this Python interpreter's standard-library sources, sharing one "
            "byte-level BPE tokenizer. Use it anywhere a model pair is expected as "
            "--target toy --draft toy (or toy:tiny)."
        ),
    )
    sub = toy.add_subparsers(dest="toy_command", metavar="ACTION", required=True)
    _add_build(sub)
    _add_info(sub)
    _add_draft(sub)


def _add_build(sub: argparse._SubParsersAction) -> None:
    """Add `mcsd toy build`."""
    build = sub.add_parser(
        "build",
        help="build the pair (instant when already built)",
        description=(
            "Build the toy pair: train the tokenizer, the target and the draft (distilled from "
            "the target) with Lightning on CPU, then write target/, draft/ and card.json "
            "(held-out losses, greedy agreement, decode latencies). The pair is cached under "
            "<cache>/models/toy-<preset>-<hash> (the cache: $MCSD_CACHE, else "
            "$XDG_CACHE_HOME/mcsd, else ~/.cache/mcsd; the hash covers the recipe, seed, code "
            "and stdlib version), so building again is instant and any directory finds it. "
            "Presets: tiny (seconds, for tests), "
            "default (about 10-15 minutes on a 2-core CPU, for demos and benchmarks)."
        ),
    )
    _common(build)
    add_force_arg(build, "rebuild even if a pair already exists at the location")
    build.set_defaults(func=run_build)


def _add_info(sub: argparse._SubParsersAction) -> None:
    """Add `mcsd toy info`."""
    info = sub.add_parser(
        "info",
        help="verify a built pair and print its card summary",
        description="Verify a built toy pair (card, checksums, loadable configs) and summarize "
                    "its card; fails if it is not built. Prints the folder on the first line.",
    )
    _common(info)
    info.set_defaults(func=run_info)


def _add_draft(sub: argparse._SubParsersAction) -> None:
    """Add `mcsd toy draft`."""
    draft = sub.add_parser(
        "draft",
        help="build (or find) extra drafts distilled from the toy target",
        description=(
            "Distil extra drafts from a built toy target, which is never retrained (built "
            "first if missing): each starts from some of the target's layers and learns the "
            "target's distribution on its training split. A draft is cached under "
            "<cache>/models/toy-draft-<name>-<hash> (the hash covers the draft's recipe and the "
            "target's) with a card: held-out loss, greedy agreement with the target, decode "
            "latencies and their ratio. Every command that takes a pair loads it with "
            "--draft toy-draft:NAME, and builds it on first use (Python: load_pair('toy', "
            "'toy-draft:NAME', build=True)). Drafts: " + ", ".join(
                f"{n} ({r.shape.layers} layer{'s' if r.shape.layers > 1 else ''}, for the "
                f"{r.target_preset} target)" for n, r in DRAFT_PRESETS.items()) + "."),
    )
    draft.add_argument("names", nargs="*", metavar="NAME",
                       help=f"draft presets to build: {', '.join(DRAFT_PRESETS)}")
    add_list_arg(draft, "list the draft presets and where each is built")
    add_seed_arg(draft, "the seed of the toy target to distil from (default: 0)")
    add_out_arg(draft, "folder for the draft instead of the cache (one NAME only)")
    add_force_arg(draft)
    draft.set_defaults(func=run_draft)


def _common(parser: argparse.ArgumentParser) -> None:
    add_recipe_arg(parser, sorted(PRESETS), "model sizes and training budget (default: "
                                            "%(default)s)")
    add_seed_arg(parser, "training seed (default: 0)")
    add_out_arg(parser, "folder for the pair instead of the cache (<cache>/models)")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="training precision: auto (bf16 autocast where the CPU has native "
                             "bf16 kernels, else fp32) or 32-true (fp32 everywhere); a pair "
                             "built with 32-true is cached under its own hash (default: "
                             "%(default)s)")


def _recipe(args: argparse.Namespace):
    from mcsd_runtime.toy.recipe import get_recipe

    # "auto" is the preset's own value: the default pair's name (hash) stays as it is
    overrides = {} if args.precision == "auto" else {"precision": args.precision}
    return get_recipe(args.recipe, args.seed, **overrides)


def run_build(args: argparse.Namespace) -> int:
    from mcsd_runtime.toy.build import build_pair, pair_dir, read_card, summary

    dest = args.out if args.out is not None else pair_dir(args.recipe, args.seed, args.precision)
    cached = dest.is_dir() and any(dest.iterdir()) and not args.force
    start = time.perf_counter()
    root = build_pair(args.recipe, out=args.out, seed=args.seed, force=args.force,
                      recipe=_recipe(args))
    if cached:
        print(f"toy pair already built ({time.perf_counter() - start:.1f} s to verify):")
        print(summary(root, read_card(root)))
    return 0


def run_info(args: argparse.Namespace) -> int:
    from mcsd_runtime.errors import MCSDError
    from mcsd_runtime.toy.build import pair_dir, summary, verify_pair, where_looked

    dest = args.out if args.out is not None else pair_dir(args.recipe, args.seed, args.precision)
    if not dest.exists():
        where = (f"no toy pair at {dest}" if args.out
                 else f"no toy pair {dest.name}: {where_looked()}")
        raise MCSDError(f"{where}; build it with `mcsd toy build --recipe "
                        f"{args.recipe}" + (f" --out {dest}" if args.out else "")
                        + (f" --precision {args.precision}" if args.precision != "auto" else "")
                        + "`")
    recipe = None if args.out is not None else _recipe(args)
    print(summary(dest, verify_pair(dest, recipe)))
    return 0


def run_draft(args: argparse.Namespace) -> int:
    from mcsd_runtime.errors import MCSDError
    from mcsd_runtime.toy.draft_recipe import get_draft_recipe

    if args.list:
        from mcsd_runtime.toy.drafts import list_drafts

        for name, recipe, folder in list_drafts(args.seed):
            where = str(folder) if folder else "not built"
            layers = f"{recipe.shape.layers} layer" + ("s" if recipe.shape.layers > 1 else "")
            print(f"toy-draft:{name:<8} {layers}, d={recipe.shape.hidden}, for the "
                  f"{recipe.target_preset} target ({recipe.steps} steps): {where}")
        return 0
    if not args.names:
        raise MCSDError("name the drafts to build (e.g. `mcsd toy draft l2 l4`), or pass --list")
    if args.out is not None and len(args.names) > 1:
        raise MCSDError("--out takes one draft; build the others into the cache")
    for name in args.names:
        get_draft_recipe(name)  # every name checked before any build
    from mcsd_runtime.toy.drafts import build_draft, draft_dir, draft_summary, verify_draft

    for name in args.names:
        dest = args.out if args.out is not None else draft_dir(name, args.seed)
        cached = dest.is_dir() and any(dest.iterdir()) and not args.force
        root = build_draft(name, args.seed, out=args.out, force=args.force)
        if cached:
            print(draft_summary(root, verify_draft(root)))
    return 0
