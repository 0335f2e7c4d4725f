"""The `mcsd` command. Subcommands come from the `mcsd.commands` entry-point group, so any
installed package (collect, train, or a user's own) can add one without this module importing it.

Each entry point is a function `register(subparsers)` that adds a parser and sets
`func=run(args) -> int | None` as its default.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.extras import missing_extra_message

Register = Callable[[argparse._SubParsersAction], None]


def build_parser(registers: Sequence[Register] | None = None,
                 prog: str = "mcsd") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Learned early-stop decisions for multi-candidate speculative decoding (MCSD).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if registers is None:
        registers = []
        for ep in sorted(entry_points(group="mcsd.commands"), key=lambda ep: ep.name):
            try:
                registers.append(ep.load())
            except ImportError as err:  # a broken plugin must not take the other commands down
                print(f"{prog}: warning: command {ep.name!r} unavailable: "
                      f"{missing_extra_message(err) or err}", file=sys.stderr)
    for register in registers:
        register(sub)
    return parser


def run_parser(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse, dispatch, and turn user errors into a message and exit code 2."""
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except MCSDError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    except ImportError as err:  # a package of an extra that is not installed
        message = missing_extra_message(err)
        if message is None:
            raise
        command = " ".join(filter(None, (parser.prog, getattr(args, "command", None))))
        print(f"{parser.prog}: error: {command}: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


def main(argv: Sequence[str] | None = None) -> int:
    return run_parser(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
