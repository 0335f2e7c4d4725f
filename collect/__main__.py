"""`python -m collect ...`: the same options as `mcsd collect`."""

import sys

from collect.cli import register
from mcsd_runtime.cli import build_parser, run_parser


def main(argv=None) -> int:
    parser = build_parser([register], prog="python -m collect")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "collect":
        argv = ["collect", *argv]
    return run_parser(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
