"""Decode a grid of decoder settings on the tests' small pair and write every row's tokens and
steps to a JSON file: run it on two commits and compare the files to show that a restructure
changed no decision (`python scripts/decode_fingerprint.py OUT.json`, about 5 minutes here).

The grid: built-in stoppers and two verification budgets, a chain and a tree, greedy and
T=0.7, one row and batches of 3, max and row depth, padded and ragged layouts, prompt lookup
on and off, and target-initialized roots (one row, no lookup). Settings the decoder refuses
are recorded with their error.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import torch  # noqa: E402
from test_ragged import ragged_ready  # noqa: E402
from test_verify_budget import PROFILE  # noqa: E402

from conftest import make_pair  # noqa: E402
from mcsd_runtime.decisions.verify_budget import (  # noqa: E402
    DraftProbability,
    OnlineAcceptance,
    VerifyBudget,
)
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder  # noqa: E402

STOPPERS = {"static:2": lambda: "static:2", "heuristic": lambda: "heuristic",
            "confidence": lambda: "confidence:0.4", "cumprod": lambda: "cumprod:0.3",
            "entropy": lambda: "entropy",
            "budget": lambda: VerifyBudget(DraftProbability(1.0), PROFILE),
            "online": lambda: VerifyBudget(OnlineAcceptance(0.2), PROFILE)}
BUDGETS = ("budget", "online")


def settings():
    """(label, stopper name, DecodeConfig, batch size) of every setting of the grid."""
    grid = itertools.product(STOPPERS, [(1, 1, 1, 1), (3, 2, 1)], [0.0, 0.7], [1, 3],
                             ["max", "row"], ["padded", "ragged"], [0, 4], ["draft", "target"])
    for name, k, temp, b, depth, layout, lookup, init in grid:
        if init == "target" and (lookup or name in BUDGETS or layout == "ragged"):
            continue
        if name in BUDGETS and k != (1, 1, 1, 1):
            continue
        cfg = DecodeConfig(k_config=k, max_new_tokens=20, temperature=temp, seed=5,
                           batch_depth=depth, batch_layout=layout, lookup=lookup, init=init)
        yield f"{name} {k} T{temp} B{b} {depth} {layout} L{lookup} {init}", name, cfg, b


def main(out: str) -> None:
    pair = ragged_ready(make_pair(noise=0.05))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (5, 9, 7, 12, 6)]
    prompts[1] = prompts[1] + prompts[1][:4] + prompts[1]  # something to copy
    result: dict[str, object] = {}
    for label, name, cfg, b in settings():
        try:
            decision = STOPPERS[name]()
            dec = (MCSDDecoder(pair, cfg, planner=decision) if name in BUDGETS
                   else MCSDDecoder(pair, cfg, stopper=decision))
            rows = (dec.generate_batch(prompts, batch_size=b) if b > 1
                    else [dec.generate(p) for p in prompts])
            result[label] = [[r.token_ids, [(s.drafted, s.accepted, s.committed, s.tree_size,
                                             s.copied) for s in r.steps]] for r in rows]
        except Exception as err:  # noqa: BLE001 - a refused setting is part of the record
            result[label] = f"error {type(err).__name__}: {err}"
    Path(out).write_text(json.dumps(result))
    refused = sum(isinstance(v, str) for v in result.values())
    print(f"{len(result)} settings ({refused} refused) -> {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/decode_fingerprint.py OUT.json")
    main(sys.argv[1])
