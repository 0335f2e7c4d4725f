"""End-to-end evaluation (`mcsd eval`, `mcsd bench`; their command lines are in mcsd_runtime.cli).

- `methods`: method names (`ar`, `mcsd:K`, a stopper spec, ...): checks, labels, the tree
- `runners`: a runner per method, turning prompt ids into a `record.Record`
- `loop`: the interleaved run of every method on every prompt or batch
- `divergence`: where greedy outputs part from `hf`'s, and token agreement
- `quality`: output-quality proxies scored after the timed runs
- `stats`: paired speedups, the best static schedule, `summarize` (one row per method)
- `eval_report`, `cells`, `plots`, `training_results`: the report folder of one run
- `domain_report`, `batch_report`, `multi_draft`: across prompt sets, batch sizes, drafts
- `bench`: the benchmark of ar, hf and one MCSD stopper
"""
