"""Columns of a collected row (one per drafted node) and of a run's manifest.

Feature columns are exactly `mcsd_runtime.decisions.features.FEATURE_NAMES` (float32), so a
feature is defined once. Trajectory features are those of the collection run's own trajectory;
replay recomputes them along its own.

Row schema versions: 2 added `prompt_hash` (rows of version 1 lack it; they still load).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from mcsd_runtime.decisions.features import FEATURE_NAMES, SCHEMA_VERSION

ROW_SCHEMA_VERSION = 2

IDENTITY = [
    ("run_id", pa.string()),
    ("prompt_id", pa.string()),
    ("prompt_hash", pa.string()),  # the prompt itself (see prompt_hash), equal across runs
    ("step", pa.int32()),  # step index within the prompt's generation, from 0
    ("position", pa.int32()),  # new tokens committed before this step
    ("node", pa.int16()),  # breadth-first node index, 1..tree size (0 is the root)
    ("parent", pa.int16()),  # parent node index, 0 for depth-1 nodes
    ("init", pa.string()),  # "draft" or "target"
    ("token", pa.int32()),
]
LABELS = [
    ("on_accepted_path", pa.bool_()),
    ("accepted_length", pa.int16()),  # the step's L (drafted tokens accepted)
    ("drafted_depth", pa.int16()),  # the step's s (depths drafted)
    ("soft_label", pa.float32()),  # min(1, p_target(x) / q_draft(x))
    ("p_target", pa.float32()),  # target probability of the token at its parent
]
FEATURES = [(name, pa.float32()) for name in FEATURE_NAMES]
HIDDEN = ("hidden", pa.list_(pa.float16()))  # optional: draft last hidden state at the node


def prompt_hash(tokens: Sequence[int]) -> str:
    """The identity of a prompt across runs: 16 hex digits of the SHA-256 of its token ids (as
    little-endian int64), so the same prompt under another id or in another run hashes alike."""
    return hashlib.sha256(np.asarray(tokens, dtype="<i8").tobytes()).hexdigest()[:16]


def row_schema(with_hidden: bool = False) -> pa.Schema:
    fields = IDENTITY + FEATURES + LABELS + ([HIDDEN] if with_hidden else [])
    return pa.schema(fields, metadata={"feature_schema_version": str(SCHEMA_VERSION),
                                       "row_schema_version": str(ROW_SCHEMA_VERSION)})
