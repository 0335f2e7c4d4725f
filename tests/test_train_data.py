"""Collections for the train tests, made in memory with the decoder and a small recorder (the
schema's columns, one row per drafted node). No tests here: imported by test_train*.py."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import torch

from collect.schema import prompt_hash
from conftest import make_pair, shared_build
from mcsd_runtime.decisions.features import FEATURE_NAMES
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
from mcsd_runtime.tree import Tree

K_CONFIG = (4, 2, 2, 1)
MAX_NEW = 40
N_PROMPTS = 18


class Recorder:
    needs_hidden = True

    def __init__(self, k_config, prompt_id: str, tokens: list[int], run_id: str = "run0") -> None:
        tree = Tree(k_config)
        self.depths, self.parents = tree.depths(), tree.parents()
        self.prompt_id, self.run_id, self.prompt_hash = prompt_id, run_id, prompt_hash(tokens)
        self.rows: list[dict] = []

    def on_step(self, trace) -> None:
        c = trace.tokens.shape[0] - 1
        feats = trace.node_features.cpu().numpy()
        traj = trace.trajectory
        path = set(trace.path)
        p, q = trace.target_prob.cpu().numpy(), trace.draft_prob.cpu().numpy()
        hidden = trace.hidden.cpu().numpy().astype(np.float16) if trace.hidden is not None else None
        for j in range(1, c + 1):
            row = {"run_id": self.run_id, "prompt_id": self.prompt_id,
                   "prompt_hash": self.prompt_hash, "step": trace.step,
                   "position": int(traj[0]), "node": j, "parent": self.parents[j],
                   "init": "draft", "token": int(trace.tokens[j])}
            row |= dict(zip(FEATURE_NAMES, [*feats[j - 1].tolist(), *traj], strict=True))
            row |= {"on_accepted_path": j in path, "accepted_length": trace.accepted,
                    "drafted_depth": trace.drafted,
                    "soft_label": float(min(1.0, p[j - 1] / max(q[j - 1], 1e-30))),
                    "p_target": float(p[j - 1])}
            if hidden is not None:
                row["hidden"] = hidden[j - 1].tolist()
            self.rows.append(row)


def prompts(n: int = N_PROMPTS, vocab: int = 64, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(torch.randint(3, 9, (1,), generator=gen)),),
                          generator=gen).tolist() for _ in range(n)]


@functools.cache
def small_pair():
    return make_pair(noise=0.02)


@functools.cache
def dense_rows(run_id: str = "run0", k_config=K_CONFIG) -> pd.DataFrame:
    """A dense greedy collection: a full tree drafted and verified at every AR position (made
    once per test run: `conftest.shared_build`)."""
    tree = str(Tree(k_config).k_config).replace("/", "_")
    return shared_build(f"dense-rows-{run_id}-{tree}", lambda: _dense_rows(run_id, k_config))


def _dense_rows(run_id: str, k_config) -> pd.DataFrame:
    pair = small_pair()
    frames = []
    for i, ids in enumerate(prompts()):
        rec = Recorder(k_config, f"p{i}", ids, run_id)
        dec = MCSDDecoder(pair, DecodeConfig(k_config=k_config, max_new_tokens=MAX_NEW,
                                             commit_limit=1), stopper="static", recorder=rec)
        dec.generate(ids)
        frames.append(pd.DataFrame(rec.rows))
    return pd.concat(frames, ignore_index=True)
