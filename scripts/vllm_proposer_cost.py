"""What the proposer class costs on the host: `propose` timed per step and per row on contexts of
200-600 tokens with some repetition, at 1, 8 and 16 requests.

    .venv-vllm/bin/python scripts/vllm_proposer_cost.py COPY_FOLDER
    .venv-vllm/bin/python scripts/vllm_proposer_cost.py COPY_FOLDER STOPPER DRAFT_FOLDER
    .venv-vllm/bin/python scripts/vllm_proposer_cost.py - STOPPER DRAFT_FOLDER

(`-`: no copy length; STOPPER: a stopper spec, e.g. static:4 or a trained stopper's folder.)
"""

import os
import sys
import time

import numpy as np


def main() -> None:
    from mcsd_runtime.serving.vllm_proposer import MCSDProposer, ProposerSpec

    copy, stopper, draft = (sys.argv[1:] + [None, None])[:3]
    spec = ProposerSpec(copy=None if copy == "-" else copy, stopper=stopper, draft=draft)
    os.environ["MCSD_VLLM_PROPOSER"] = spec.to_env()

    class Config:
        class speculative_config:  # noqa: N801 (vLLM's attribute name)
            num_speculative_tokens = 6

    proposer = MCSDProposer(Config)
    rng = np.random.default_rng(0)
    for rows, ctx in ((1, 200), (1, 600), (8, 300), (16, 300)):
        tokens = rng.integers(0, 49152, size=(rows, ctx + 200))
        tokens[:, ctx - 40 : ctx] = tokens[:, 50:90]  # a repeat, so that matches exist
        n = np.full(rows, ctx)
        times = []
        for _ in range(60):
            sampled = [[int(tokens[r, n[r] - 1])] for r in range(rows)]
            t0 = time.perf_counter()
            proposer.propose(sampled, n, tokens)
            times.append(time.perf_counter() - t0)
            n = n + 1
        t = float(np.median(times[10:]))
        print(f"rows {rows}, context {ctx}: {t * 1e3:.3f} ms a step, {t / rows * 1e3:.3f} ms a row")


if __name__ == "__main__":
    main()
