"""The benchmark behind `mcsd bench` (mcsd_runtime/cli/bench.py): tokens/s side by side in one
process, prompt by prompt after a warm-up, of `ar` (the target alone through our decoder's
loop), `hf` (the target's own generate()) and MCSD with one stopper; with τ, the share of wall
time inside model forwards and greedy output equality with ar and hf."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from mcsd_runtime.decode.decoder import DecodeConfig
from mcsd_runtime.evaluate.loop import run_runners
from mcsd_runtime.evaluate.methods import short_name
from mcsd_runtime.evaluate.record import Record
from mcsd_runtime.evaluate.runners import DecoderRunner, build_method, decoder_for, encode_prompt
from mcsd_runtime.evaluate.stats import summarize
from mcsd_runtime.models.pair import Pair

if TYPE_CHECKING:
    from mcsd_runtime.prompts.domains import Prompt


def bench_runners(pair: Pair, config: DecodeConfig, stopper: str, built,
                  batch_size: int = 1) -> dict:
    """`ar`, `hf` (not at batch sizes above 1: it decodes one sequence at a time) and MCSD with
    the stopper `built` from the spec `stopper`, named `mcsd:K` or `mcsd:K+STOPPER`."""
    sd_name = f"mcsd:{config.k_config}"
    if stopper != f"static:{len(config.k_config)}":
        sd_name += f"+{short_name(stopper)}"
    runners = {"ar": build_method("ar", pair, config), "hf": build_method("hf", pair, config),
               sd_name: DecoderRunner(decoder_for(pair, config, built))}
    if batch_size > 1:
        del runners["hf"]
    return runners


def run_bench(pair: Pair, config: DecodeConfig, stopper: str, built, prompts: list[Prompt],
              prompt_set: str, batch_size: int = 1, chat: str = "auto"
              ) -> tuple[dict, list[Record], list[dict]]:
    """The benchmark on `prompts` (from the set named `prompt_set`): its figures (per method:
    tokens/s median, min and max, τ, share of wall time in forwards, speedups and output
    equality; and where greedy outputs leave hf's), the records and `summarize`'s rows."""
    greedy = config.temperature == 0
    runners = bench_runners(pair, config, stopper, built, batch_size)
    encoded = [(p.id, encode_prompt(pair, p, chat)) for p in prompts]
    records = run_runners(pair, runners, encoded, greedy, desc="bench", batch_size=batch_size)
    rows = summarize(records, greedy)
    by_name = {r["method"]: r for r in rows}
    report = {"pair": pair.fingerprint, "config": asdict(config), "stopper": stopper,
              "prompts": prompt_set, "n_prompts": len(prompts), "batch_size": batch_size,
              "methods": {}}
    for name in runners:
        mine = [r for r in records if r.method == name]
        tps = [r.tokens_per_s for r in mine]
        row = by_name[name]
        report["methods"][name] = {
            "tokens_per_s_median": row["tokens_per_s_median"],
            "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
            "tau": row["tau"],
            "forward_fraction": sum(r.forward_time for r in mine) / sum(r.wall_time for r in mine),
            "new_tokens": row["new_tokens"],
            "speedup_vs_ar": row["speedup_vs_ar"], "speedup_vs_hf": row["speedup_vs_hf"],
            "ar_equal_share": row["ar_equal_share"], "hf_equal_share": row["hf_equal_share"],
        }
    report["hf_divergences"] = [{"method": r.method, "prompt_id": r.prompt_id} | r.hf_divergence
                                for r in records if r.hf_divergence]
    return report, records, rows
