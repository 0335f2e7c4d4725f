"""Measuring what a step costs: forward-latency profiles on this machine (`measure`, `mcsd
profile`), decision costs (`decision_cost`), where a step's time goes (`step_breakdown`), padded
against ragged forwards (`ragged_bench`). The step's rules and the profile they are priced by live
in `mcsd_runtime.pricing`."""
