"""The recorder the decoder calls after every step: it turns a `StepTrace` into node rows.

Rows are built per step with one device-to-host transfer of a stacked float64 matrix (node
features, p_target, q_draft and token ids are all exact in float64), plus one for the hidden
states when they are kept; no per-node Python loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch

from collect.schema import prompt_hash, row_schema
from mcsd_runtime.decisions.features import NODE_FEATURES, TRAJECTORY_FEATURES
from mcsd_runtime.decode.decoder import StepTrace
from mcsd_runtime.tree import Tree, parse_k_config

_N = len(NODE_FEATURES)


@dataclass
class _Open:
    """The rows recorded so far for one prompt."""

    prompt_id: str
    prompt_hash: str
    parts: list[dict[str, np.ndarray]] = field(default_factory=list)
    hidden: list[np.ndarray] = field(default_factory=list)


class RowRecorder:
    """Collects the rows of prompts: `begin(prompt_id, tokens)`, let the decoder call
    `on_step(trace)` for every step, then `finish()` returns the prompt's columns. In a batch,
    `begin(..., row=i)` and `finish(row=i)` for the prompt the decoder numbers `i`
    (`StepTrace.row`); several prompts are then open at once.

    `on_accepted_path` marks the nodes of the verified accepted path (for `init="target"` that
    path starts with the chosen depth-1 root, so it has L + 1 nodes; otherwise L).
    """

    def __init__(self, k_config: tuple[int, ...], run_id: str, init: str,
                 save_hidden: bool = False) -> None:
        self.tree = Tree(parse_k_config(k_config))
        self.parent = np.asarray(self.tree.parents(), dtype=np.int16).clip(min=0)
        self.run_id, self.init = run_id, init
        self.needs_hidden = bool(save_hidden)  # read by the decoder (`decoder.Recorder`)
        self.schema = row_schema(self.needs_hidden)
        self._open: dict[int, _Open] = {}

    def begin(self, prompt_id: str, tokens: Sequence[int], row: int = 0) -> None:
        """Start the rows of the prompt `prompt_id`, whose token ids are `tokens`, decoded as
        row `row` of a batch."""
        self._open[row] = _Open(prompt_id, prompt_hash(tokens))

    @torch.inference_mode()
    def on_step(self, trace: StepTrace) -> None:
        if trace.row not in self._open:
            raise RuntimeError(f"a step of row {trace.row}, for which begin() was not called")
        rows = self._open[trace.row]
        c = int(trace.tokens.shape[0]) - 1
        if c <= 0:
            return
        dense = torch.cat([trace.node_features.to(torch.float64),
                           trace.target_prob.to(torch.float64)[:, None],
                           trace.draft_prob.to(torch.float64)[:, None],
                           trace.tokens[1:].to(torch.float64)[:, None]], dim=1).cpu().numpy()
        feats = dense[:, :_N].astype(np.float32)
        p_target, q_draft = dense[:, _N], dense[:, _N + 1]
        on_path = np.zeros(c, dtype=np.bool_)
        if trace.path:
            on_path[np.asarray(trace.path, dtype=np.int64) - 1] = True
        soft = np.minimum(1.0, p_target / np.maximum(q_draft, 1e-30))
        traj = np.asarray(trace.trajectory, dtype=np.float32)
        part = {
            "step": np.full(c, trace.step, dtype=np.int32),
            "position": np.full(c, int(trace.trajectory[0]), dtype=np.int32),
            "node": np.arange(1, c + 1, dtype=np.int16),
            "parent": self.parent[1 : c + 1],
            "token": dense[:, _N + 2].astype(np.int32),
            "node_features": feats,
            "trajectory": np.broadcast_to(traj, (c, traj.shape[0])),
            "on_accepted_path": on_path,
            "accepted_length": np.full(c, trace.accepted, dtype=np.int16),
            "drafted_depth": np.full(c, trace.drafted, dtype=np.int16),
            "soft_label": soft.astype(np.float32),
            "p_target": p_target.astype(np.float32),
        }
        rows.parts.append(part)
        if self.needs_hidden:
            if trace.hidden is None:
                raise RuntimeError("the decoder gave no hidden states although they were asked for")
            rows.hidden.append(trace.hidden.to(torch.float16).cpu().numpy())

    def finish(self, row: int = 0) -> pa.Table:
        """The rows of the prompt begun as `row`, as a table of `self.schema` (possibly
        empty); the row is closed."""
        rows = self._open.pop(row)
        return self.to_table(rows.parts, rows.hidden, rows.prompt_id, rows.prompt_hash)

    def to_table(self, parts: list[dict[str, np.ndarray]], hidden: list[np.ndarray],
                 prompt_id: str, prompt_hash: str) -> pa.Table:
        if not parts:
            return self.schema.empty_table()
        cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        n = len(cat["step"])
        cols: dict[str, pa.Array] = {
            "run_id": pa.array(np.full(n, self.run_id, dtype=object), pa.string()),
            "prompt_id": pa.array(np.full(n, prompt_id, dtype=object), pa.string()),
            "prompt_hash": pa.array(np.full(n, prompt_hash, dtype=object), pa.string()),
            "init": pa.array(np.full(n, self.init, dtype=object), pa.string()),
        }
        for name in ("step", "position", "node", "parent", "token"):
            cols[name] = pa.array(cat[name])
        for group, names in (("node_features", NODE_FEATURES),
                             ("trajectory", TRAJECTORY_FEATURES)):
            for i, name in enumerate(names):
                cols[name] = pa.array(np.ascontiguousarray(cat[group][:, i]))
        for name in ("on_accepted_path", "accepted_length", "drafted_depth", "soft_label",
                     "p_target"):
            cols[name] = pa.array(cat[name])
        if self.needs_hidden:
            h = np.concatenate(hidden)
            offsets = np.arange(0, h.size + 1, h.shape[1], dtype=np.int32)
            cols["hidden"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(h.reshape(-1)))
        return pa.Table.from_arrays([cols[f.name].cast(f.type) for f in self.schema],
                                    schema=self.schema)
