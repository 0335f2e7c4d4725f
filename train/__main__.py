"""`python -m train ...` is `mcsd train ...`."""

import argparse
import sys

from mcsd_runtime.cli import run_parser
from train.cli import __doc__ as doc
from train.cli import add_args, run

parser = argparse.ArgumentParser(prog="python -m train", description=doc, add_help=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
add_args(parser)
parser.set_defaults(func=run)
sys.exit(run_parser(parser, None))
