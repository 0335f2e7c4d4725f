"""Benchmarks: measuring what a step costs. Forward-latency profiles on this machine (`measure`,
`mcsd profile`), decision costs (`decision_cost`), where a step's time goes (`step_breakdown`),
padded against ragged forwards (`ragged_bench`), attention implementations (`attention_bench`),
eager against captured forwards (`capture_spike`). The step's rules and the profile they are
priced by (the cost model) live in `mcsd_runtime.pricing`."""
