"""`mcsd replay-batches`: what ragged batches could win, replayed on dense collections.

`mcsd replay-batches --runs DIR... --cost-profile cost.json --batch-size 1,4,8,16`
walks the dense greedy collections (`mcsd collect --dense`, a chain k-config for the budget
rules) in batches of B rows, prompts admitted in order into free slots, and prints per batch
size the replayed tokens/s of autoregressive decoding and of each rule family at its best
setting, with its ratio to AR and to the best padded static depth:

- `padded static`: today's batches, every row drafted and verified to the batch's depth, a
  forward priced as rows x widest (`replay.depth`);
- `ragged static`, `cumprod`, `survival`: per-row depths in ragged batches (a forward priced
  by its total tokens, `CostProfile.ragged_step_seconds`): the same depth for every row,
  each row's own cumprod stopper, the verification budget of `mcsd_runtime.decisions.budget` on
  the cumulative draft probability;
- `oracle-budget`: the budget rule fed the truth (survival 1 up to the accepted length);
- `oracle`: each row verifies exactly what it will accept and drafts nothing when that is
  nothing, per batch step: the bound of per-row depths.

Ragged forwards are priced from the profile's padded curves (B rows of T / B tokens each)
until `mcsd profile` measures them; `--affine` prices from a line through each curve instead,
`--draft-scale X` prices the draft's forwards at X times the profile's. Each family's setting
is chosen by replayed speed on the same prompts, or with `--holdout` on alternate prompts and
reported on the others. See `replay.ragged`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mcsd_runtime.errors import MCSDError


def register(sub: argparse._SubParsersAction) -> None:
    """`mcsd replay-batches`."""
    from mcsd_runtime.cli.args import (
        add_batch_size_arg,
        add_cost_profile_arg,
        add_out_arg,
        add_runs_arg,
    )

    p = sub.add_parser("replay-batches", help="replay per-row (ragged) batch rules and the "
                                              "batch oracle against padded static depths",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_runs_arg(p, "dense collection folders (mcsd collect --dense); required")
    add_cost_profile_arg(p, "the cost profile that prices steps (mcsd profile --batch-size "
                            "covering every B); required", required=True)
    add_batch_size_arg(p, "batch sizes to replay (default %(default)s)", several=True,
                       default="1,4,8,16")
    p.add_argument("--holdout", action="store_true",
                   help="choose each family's setting on alternate prompts, report on the others")
    p.add_argument("--families", default=None, metavar="NAME[,NAME...]",
                   help="replay only these families (default: all; AR is always replayed)")
    p.add_argument("--draft-scale", type=float, default=1.0, metavar="X",
                   help="price every draft forward at X times the profile's (what a cheaper or "
                        "costlier draft of the same acceptance would win; default 1)")
    p.add_argument("--affine", action="store_true",
                   help="price from a least-squares line through each of the profile's curves "
                        "(token counts up to the tree's depth + 1), so that one noisy count "
                        "cannot decide a comparison")
    add_out_arg(p, "also write the result as JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mcsd_runtime.cli.args import parse_batch_sizes
    from mcsd_runtime.pricing.profile import CostProfile
    from replay.data import ReplayData
    from replay.ragged import affine_profile, compare, families, scaled_draft, table
    from replay.runs import collected_k_config, load_runs, output_lengths

    if not args.runs:
        raise MCSDError("--runs DIR... is required: the dense collections to replay")
    sizes = parse_batch_sizes(args.batch_size, "--batch-size")
    profile = CostProfile.load(args.cost_profile)
    if args.draft_scale != 1.0:
        profile = scaled_draft(profile, args.draft_scale)
    for b in sizes:
        profile.check_rows(b)
    df, manifests = load_runs(args.runs)
    data = ReplayData(df, collected_k_config(manifests), mode="exact",
                      new_tokens=output_lengths(manifests))
    if args.affine:
        profile = affine_profile(profile, data.depth + 1)
    fams = families(data.depth)
    if args.families:
        wanted = [n.strip() for n in args.families.split(",") if n.strip()]
        unknown = sorted(set(wanted) - {f.name for f in fams})
        if unknown:
            raise MCSDError(f"--families: unknown {', '.join(unknown)}; choose among "
                            f"{', '.join(f.name for f in fams)}")
        fams = [f for f in fams if f.name in wanted]
    tune = None
    if args.holdout:
        keys = sorted(data.prompts)
        if len(keys) < 2:
            raise MCSDError("--holdout needs at least 2 prompts")
        tune, data = data.subset(keys[0::2]), data.subset(keys[1::2])
    result = compare(data, profile, list(sizes), fams, tune)
    print(f"{len(data.prompts)} prompts, {data.n_steps} dense steps, tree {data.tree}"
          + (f"; settings chosen on {len(tune.prompts)} other prompts" if tune else ""))
    print(table(result))
    if args.out:
        Path(args.out).write_text(json.dumps({str(b): r for b, r in result.items()}, indent=1)
                                  + "\n")
    return 0
