"""Deprecated: the decoder's records now live in `mcsd_runtime.decode.records` (configuration,
results, statistics, traces) and `mcsd_runtime.decode.step_state` (the step's own records).
This module hands their names on, with a DeprecationWarning, for one release."""

import warnings

from mcsd_runtime.decode.records import (  # noqa: F401
    DecodeConfig,
    DecodeStats,
    GenerationResult,
    Recorder,
    StepRecord,
    StepTrace,
    causal_bias,
)
from mcsd_runtime.decode.step_state import (  # noqa: F401
    Decoding,
    Draft,
    Drafted,
    DraftFrontier,
    DraftLayer,
    Proposal,
    Row,
    RowState,
    Timing,
    Verdict,
    per_node,
    to_host,
    to_host_together,
)

warnings.warn("mcsd_runtime.decode.state is deprecated: import from mcsd_runtime.decode.records "
              "(DecodeConfig, results, statistics) or mcsd_runtime.decode.step_state (the step's "
              "records)", DeprecationWarning, stacklevel=2)
