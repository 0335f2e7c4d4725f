"""`mcsd prompts`: list the named prompt sets, preview one, or export it as JSONL
(mcsd_runtime.prompts.sets loads them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts.domains import DOMAIN_SETS
from mcsd_runtime.prompts.sets import HUB_SETS, KNOWN_SETS, load_prompts


def register(subparsers: Any) -> None:
    """Add `mcsd prompts`: list, preview or export a prompt set."""
    parser = subparsers.add_parser(
        "prompts",
        help="preview or export a prompt set",
        description=(
            "Load a prompt set and print a preview, or write it as JSONL (id, text, source; "
            "readable back as a generic prompt file). SPEC is one of "
            f"{', '.join(KNOWN_SETS)}; SET=FILE for a local file in a benchmark's format "
            "(e.g. mt-bench=question.jsonl); or FILE (.json/.jsonl/.parquet with a prompt, "
            "text, instruction or question field). See data/prompts/README.md."
        ),
    )
    parser.add_argument("spec", metavar="SPEC", nargs="?", help="prompt set or file")
    parser.add_argument("--list", action="store_true",
                        help="list the named prompt sets with what they hold and their sizes")
    parser.add_argument("--limit", type=int, default=None,
                        help="a seeded random sample of this many prompts")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    parser.add_argument("--jsonl", type=Path, default=None, metavar="OUT",
                        help="write the prompts to this JSONL file instead of a preview")
    parser.set_defaults(func=run_prompts)


def list_sets() -> list[tuple[str, str]]:
    """(name, description) of every named prompt set."""
    toy = {"toy-code": "stdlib code, held-out eval files (evaluation)",
           "toy-code-collect": "stdlib code, held-out collect files (stopper training)"}
    hub = {name: f"benchmark {ds} from the Hugging Face hub, or SET=FILE offline"
           for name, (ds, _, _) in HUB_SETS.items()}
    return [*toy.items(), *((n, text) for n, (text, _) in DOMAIN_SETS.items()), *hub.items()]


def run_prompts(args: Any) -> int:
    if args.list:
        for name, text in list_sets():
            size = "" if name in HUB_SETS else f" ({len(load_prompts(name))} prompts)"
            print(f"{name:18} {text}{size}")
        return 0
    if args.spec is None:
        raise MCSDError("name a prompt set or file to preview (SPEC), or --list the sets")
    prompts = load_prompts(args.spec, limit=args.limit, seed=args.seed)
    if args.jsonl is not None:
        try:
            args.jsonl.parent.mkdir(parents=True, exist_ok=True)
            with args.jsonl.open("w", encoding="utf-8") as f:
                for p in prompts:
                    f.write(json.dumps({"id": p.id, "text": p.text, "source": p.source}) + "\n")
        except OSError as err:
            raise MCSDError(f"cannot write {args.jsonl}: {err.strerror or err}") from None
        print(f"wrote {len(prompts)} prompts to {args.jsonl}")
        return 0
    print(f"{len(prompts)} prompts from {args.spec}")
    for p in prompts[:3]:
        print(f"--- {p.source} {p.id}\n{p.text}")
    return 0
