"""What replay reads: full-depth collected rows arranged by prompt and step (`ReplayData`,
`Prompt`, `Step`), and the frontier a stopper sees at one depth of a replayed step
(`_Frontier`, served from the stored node features plus the replayed trajectory) or before it
(`_Start`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from mcsd_runtime.decisions.contract import Frontier, StepStart
from mcsd_runtime.decisions.features import (
    FEATURE_NAMES,
    NODE_FEATURES,
    decision_from_nodes,
    with_trajectory,
)
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.tree import KConfig, Tree, parse_k_config
from replay.runs import SEQUENCE_KEY, sequence_ids

NODE_COLS = list(NODE_FEATURES)
NO_NODES = np.zeros((0, len(NODE_FEATURES)), dtype=np.float32)  # a step before it drafts

REPLAY_MODES = ("auto", "exact", "estimate")  # auto: exact on dense greedy runs, else estimate


@dataclass
class Step:
    position: int
    accepted: int  # L of the full-depth step
    cap: int  # depths the decoder could draft at this position (drafted_depth of the row)
    nodes: list[np.ndarray]  # node features per depth 1..cap, [n_d, len(NODE_FEATURES)]
    hidden: list[np.ndarray] | None = None


@dataclass
class Prompt:
    key: str
    steps: list[Step]  # in recorded order
    by_position: dict[int, Step] = field(default_factory=dict)
    new_tokens: int = 0  # length of the AR output (dense collections)



class _Frontier:
    """`mcsd_runtime.decisions.contract.Frontier` served from collected rows. Replay's own stoppers
    also read `key` (prompt, position, depth) and `oracle_accepted` (the step's accepted
    length); `read` records whether the stopper looked at the nodes (a decision costs time only
    then)."""

    __slots__ = ("depth", "max_depth", "oracle_accepted", "read", "_nodes", "_traj", "_hidden",
                 "key")

    def __init__(self, depth: int, max_depth: int, nodes: np.ndarray, traj: list[float],
                 hidden: np.ndarray | None, accepted: int, key: tuple[str, int, int]) -> None:
        self.depth, self.max_depth, self._nodes, self._traj = depth, max_depth, nodes, traj
        self._hidden, self.oracle_accepted, self.read, self.key = hidden, accepted, False, key

    def trajectory(self) -> list[float]:
        return self._traj

    def features(self) -> torch.Tensor:
        self.read = True
        return with_trajectory(torch.tensor(self._nodes), self._traj)

    def column(self, name: str) -> torch.Tensor:
        return self.features()[:, FEATURE_NAMES.index(name)]

    def decision_features(self) -> np.ndarray:
        self.read = True
        return decision_from_nodes(self._nodes, self._traj)

    def hidden(self) -> torch.Tensor:
        if self._hidden is None:
            raise MCSDError("this replay has no hidden states: load the rows with hidden=True")
        self.read = True
        return torch.from_numpy(self._hidden)


class _Start(_Frontier, StepStart):
    """A row before its replayed step, as the planner sees it (`contract.StepStart`: depth 0, no
    nodes, its `cap`, `pending` tokens and `row`), served as `_Frontier` so that replay's own
    stoppers read its key and the step's accepted length."""

    def __init__(self, max_depth: int, traj: list[float], cap: int, row: object,
                 pending: int, accepted: int, key: tuple[str, int, int]) -> None:
        super().__init__(0, max_depth, NO_NODES, traj, None, accepted, key)
        self.cap, self.row, self.pending = cap, row, pending


def replayed(frontier: Frontier) -> _Frontier:
    """`frontier` as replay serves it, for stoppers that read what only replay knows (`key`,
    `oracle_accepted`); MCSDError for a decoder's frontier."""
    if not isinstance(frontier, _Frontier):
        raise MCSDError("this stopper reads each step's recorded outcome: it runs in replay only")
    return frontier


class ReplayData:
    """Full-depth rows arranged by prompt and step, ready to replay.

    `new_tokens`: sequence id -> the decoder's output length (`replay.runs.output_lengths`).
    A sequence missing from it gets a guess from its last step, which cannot tell an output
    ending in EOS one token before the budget from one the budget ended."""

    def __init__(self, df: pd.DataFrame, k_config: KConfig | tuple[int, ...] | None = None,
                 mode: str = "auto", hidden: bool = False,
                 new_tokens: dict[str, int] | None = None) -> None:
        if df.empty:
            raise MCSDError("nothing to replay: no rows")
        if "init" in df.columns and (df["init"] != "draft").any():
            raise MCSDError("replay models draft-initialized steps; these rows include "
                            "init='target' steps")
        self.tree = Tree(parse_k_config(k_config) if k_config else _infer_k_config(df))
        self.depth = self.tree.depth
        df = df.sort_values([*SEQUENCE_KEY, "step", "node"], kind="stable")
        keys = sequence_ids(df).to_numpy()
        step = df["step"].to_numpy()
        feats = df[NODE_COLS].to_numpy(dtype=np.float32)
        depth = df["depth"].to_numpy().astype(np.int64)
        pos = df["position"].to_numpy()
        acc = df["accepted_length"].to_numpy()
        cap = df["drafted_depth"].to_numpy()
        hid = np.stack(df["hidden"].tolist()).astype(np.float32) if hidden else None
        bounds = np.nonzero((keys[1:] != keys[:-1]) | (step[1:] != step[:-1]))[0] + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [len(df)]])
        self.prompts: dict[str, Prompt] = {}
        for a, b in zip(starts, ends, strict=True):
            d = depth[a:b]
            cuts = np.searchsorted(d, np.arange(1, int(cap[a]) + 2))
            nodes = [feats[a + cuts[i]: a + cuts[i + 1]] for i in range(int(cap[a]))]
            hs = ([hid[a + cuts[i]: a + cuts[i + 1]] for i in range(int(cap[a]))]
                  if hid is not None else None)  # kept if hidden
            if any(len(n) == 0 for n in nodes):
                raise MCSDError(f"step {step[a]} of {keys[a]} lacks rows of some depth: replay "
                                f"needs full-depth collections (static stopper)")
            p = self.prompts.setdefault(keys[a], Prompt(keys[a], []))
            p.steps.append(Step(int(pos[a]), int(acc[a]), int(cap[a]), nodes, hs))
        dense = True
        for p in self.prompts.values():
            p.by_position = {s.position: s for s in p.steps}
            positions = [s.position for s in p.steps]
            dense &= positions == list(range(len(positions)))
            last = p.steps[-1]
            extra = 1 if (last.cap == 1 and self.depth > 1) else 0  # budget hit: a 0-depth step
            p.new_tokens = (new_tokens or {}).get(p.key, last.position + 1 + extra)
        if mode not in REPLAY_MODES:
            raise MCSDError(f"unknown replay mode {mode!r}: exact, estimate or auto")
        if mode == "auto":
            mode = "exact" if dense else "estimate"
        if mode == "exact" and not dense:
            raise MCSDError("exact replay needs a dense greedy collection (one step at every "
                            "position); use mode='estimate'")
        self.mode = mode

    def subset(self, keys) -> ReplayData:
        out = object.__new__(ReplayData)
        out.__dict__ = dict(self.__dict__)
        keys = set(keys)
        out.prompts = {k: v for k, v in self.prompts.items() if k in keys}
        return out

    @property
    def n_steps(self) -> int:
        return sum(len(p.steps) for p in self.prompts.values())


def _infer_k_config(df: pd.DataFrame) -> KConfig:
    """The k-config of the widest step: children per parent from the sibling ranks, nodes per
    depth from the frontier size (a depth with fewer than its parents' children is capped)."""
    by_depth = df.groupby("depth")
    sizes = by_depth["frontier_size"].max().sort_index().astype(int).tolist()
    ks = (by_depth["sibling_rank"].max().sort_index().astype(int) + 1).tolist()
    full, caps = 1, []
    for k, size in zip(ks, sizes, strict=True):
        caps.append(size if size < full * k else None)
        full = size
    return KConfig(ks, caps)
