"""What a decode step costs: which forwards a step runs and what it commits (`step_model`), and
the cost profile that prices those forwards, padded and ragged (`profile`). Below the decisions
(a verification budget weighs tokens against seconds) and everything that replays or measures
steps; `mcsd_runtime.benchmarks` measures profiles."""
