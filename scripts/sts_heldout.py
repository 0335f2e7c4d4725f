"""An STS table (`mcsd train --decision sts`) judged on other collections than it was fitted on:
per draft position, the ECE, Brier score and AUROC of the survival before (T = 1) and after
(the table's temperatures, and its offsets where it has them).

    .venv/bin/python scripts/sts_heldout.py data/runs/sts-real/sts data/runs/sts-real/heldout

Prints a Markdown table and writes it as JSON beside the table (`heldout-<run>.json`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mcsd_runtime.decisions.sts import StsCalibration, position_metrics
from mcsd_runtime.errors import MCSDError
from train.sts.chains import collection_samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", type=Path, help="sts.json, or the folder holding it")
    parser.add_argument("runs", type=Path, nargs="+", help="dense collections to judge it on")
    args = parser.parse_args(argv)
    try:
        table = StsCalibration.load(args.table)
        samples, _ = collection_samples(args.runs, table.gamma)
    except MCSDError as err:
        print(f"sts_heldout: error: {err}", file=sys.stderr)
        return 2
    ones = [1.0] * table.gamma
    before = position_metrics(samples.logits, samples.valid, samples.prefix_mask, ones)
    after = position_metrics(samples.logits, samples.valid, samples.prefix_mask,
                             table.temperatures, table.offsets)
    print("| position | samples | all accepted | T | ECE before | ECE after | Brier before | "
          "Brier after | AUROC before | AUROC after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b, a, t in zip(before, after, table.temperatures, strict=True):
        print(f"| {b['position']} | {b['samples']} | {b['accepted']} | {t:.3g} | "
              f"{b['ece']:.4f} | {a['ece']:.4f} | {b['brier']:.4f} | {a['brier']:.4f} | "
              f"{b['auroc']:.3f} | {a['auroc']:.3f} |")
    halved = all(a["ece"] <= b["ece"] / 2 for a, b in zip(after, before, strict=True))
    print(f"ECE halved at every position: {'yes' if halved else 'no'}")
    folder = args.table if args.table.is_dir() else args.table.parent
    out = folder / f"heldout-{args.runs[0].name}.json"
    out.write_text(json.dumps({"runs": [str(r) for r in args.runs], "before": before,
                               "after": after, "halved": halved}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
