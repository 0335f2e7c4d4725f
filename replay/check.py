"""Checking a replay against reality, for every learned decision: decode held-out prompts end to
end with each method (in a fresh random order per prompt, after a warm-up) and compare the
decode-phase tokens/s that replay predicts with what was measured (the prefill, which no
decision changes and replay does not model, is left out on both sides).

A cost model (profile + replay) earns trust only when it predicts end-to-end speed: within a few
percent per method once a common factor (the machine busier or quieter than when profiled,
which moves every method alike and leaves decisions unchanged) is divided out.

- `stopper_check`: depth stoppers, on the test prompts of collected runs (`replay.depth`), at
  batch size 1 or a larger one; also whether the static depths rank alike.
- `outputs_check`: decisions trained on the target's outputs (`collect.outputs`): the copy
  length (`copy_replayed`) and the width (`width_replayed`). Under greedy decoding the
  decoder's output is the trace's, so replay and decoder take the same steps: their step counts
  must agree exactly, and the time error is the cost model's alone. When sampling, the decoder
  draws other outputs than the traces and only totals compare; with the profile, the check
  therefore also prices the steps each decoder took (`CostProfile.decode_seconds`): the cost
  model's own error, at any temperature.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collect.outputs import Ranked, Trace
from mcsd_runtime import metrics
from mcsd_runtime.decisions.contract import Stopper
from mcsd_runtime.decisions.copy_length import CopyLength
from mcsd_runtime.decisions.width import WidthPolicy
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.pricing.profile import CostProfile
from mcsd_runtime.progress import progress as progress_bar
from mcsd_runtime.prompts.chat import chat_mode_of, encode_prompt
from mcsd_runtime.prompts.domains import Prompt
from replay import data as D
from replay.copy import BESIDE, Replay, copy_all, never
from replay.runs import sequence_parts

LEARNED = "learned"
Replayed = Callable[[str, Trace], "tuple[float, int]"]  # a method, an output -> (seconds, steps)


@dataclass
class Measured:
    """One method's decodes: tokens, decode seconds, steps, the profile's price of those steps,
    and per category each prompt's tokens/s."""

    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    priced: float = 0.0
    per_category: dict[str, list[float]] = field(default_factory=dict)

    def add(self, stats, steps: int, category: str = "", priced: float = 0.0) -> None:
        self.tokens += stats.new_tokens
        self.seconds += stats.decode_time
        self.steps += steps
        self.priced += priced
        self.per_category.setdefault(category, []).append(
            metrics.throughput(stats.new_tokens, stats.decode_time))

    @property
    def throughput(self) -> float:
        return metrics.throughput(self.tokens, self.seconds)


def measure(decoders: dict, units: Sequence, decode: Callable, seed: int = 0,
            progress: bool = False, unit: str = "prompt") -> dict[str, Measured]:
    """Decode every unit with every decoder, the decoders in a fresh random order per unit
    (seeded), after one warm-up decode each of the first unit. `decode(decoder, name, unit,
    measured)` decodes and adds to `measured` (the method's `Measured`)."""
    for name, dec in decoders.items():  # warm-up
        decode(dec, name, units[0], Measured())
    out = {name: Measured() for name in decoders}
    order = random.Random(seed)
    for u in progress_bar(units, desc="end-to-end check", unit=unit, disable=not progress):
        names = list(decoders)
        order.shuffle(names)
        for name in names:
            decode(decoders[name], name, u, out[name])
    return out


def divide_common(rows: dict, key: str = "error", out: str = "relative_error") -> float:
    """The geometric mean of `1 + rows[*][key]`, and each row's `out`: its error with that
    common factor divided out."""
    common = metrics.geomean([1 + r[key] for r in rows.values()])
    for r in rows.values():
        r[out] = (1 + r[key]) / common - 1
    return common


# ------------------------------------------------------------------ depth stoppers
def _prompt_ids(data: D.ReplayData, manifests: list[dict], limit: int
                ) -> list[tuple[str, Prompt]]:
    """(sequence key, prompt) of up to `limit` replayed sequences, from their runs' sets."""
    from mcsd_runtime.prompts.sets import load_prompts

    by_run = {m.get("run_id"): m for m in manifests}
    texts: dict[str, dict[str, Prompt]] = {}
    out = []
    for key in sorted(data.prompts)[:limit]:
        run, pid = sequence_parts(key)
        m = by_run.get(run)
        if m is None or not m.get("prompt_set"):
            raise MCSDError(f"run {run!r} records no prompt set: the end-to-end check needs "
                            f"the collection's manifest")
        if run not in texts:
            texts[run] = {p.id: p for p in load_prompts(m["prompt_set"])}
        if pid not in texts[run]:
            raise MCSDError(f"prompt {pid!r} is no longer in set {m['prompt_set']!r}")
        out.append((key, texts[run][pid]))
    return out


def _encode(decoder, prompt: Prompt | list[int], chat: str) -> list[int]:
    """A prompt's token ids as its collection gave them to the model (`chat`: the --chat
    setting that reproduces the run's prompt_format); token ids pass as they are."""
    if isinstance(prompt, Prompt):
        prompt = encode_prompt(prompt, decoder.pair.tokenizer, chat)
    return decoder.encode(prompt)


def _profile_device(profile: CostProfile) -> str:
    """The device the check decodes on: the one the profile was timed on, which must be here."""
    import torch

    device = profile.device or "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise MCSDError(f"the cost profile was measured on {device}, which this machine lacks: "
                        f"the end-to-end check decodes where the profile was timed; train on "
                        f"that machine or pass --check-prompts 0")
    return device


def _collection_pair(manifest: dict, profile: CostProfile):
    """The collection's pair, loaded on the device the profile was timed on."""
    from mcsd_runtime.backend.device import command_dtype
    from mcsd_runtime.models.pair import load_pair

    fp = manifest.get("pair") or {}
    device = _profile_device(profile)
    return load_pair(fp["target"], fp["draft"], device=device,
                     dtype=command_dtype(manifest.get("dtype", "auto"), device))


def stopper_check(data: D.ReplayData, manifests: list[dict], profile: CostProfile,
                  stoppers: Mapping[str, Stopper | str], limit: int = 8, seed: int = 0,
                  decision_s: dict[str, float] | None = None, pair=None,
                  progress: bool = False, batch_size: int = 1, repeats: int = 1,
                  decision_row_s: dict[str, float] | None = None) -> dict:
    """Replayed against measured tokens/s for each named stopper on up to `limit` prompts of
    `data` (greedy, the collection's pair, k-config and max_new_tokens). Above batch size 1 the
    prompts are decoded `repeats` times together with `generate_batch` per stopper (stoppers in
    a fresh random order each time) and replayed at that batch size, in the same order."""
    import torch

    from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
    from replay.depth import replay

    if profile.threads:  # time as the profile was timed
        torch.set_num_threads(profile.threads)
    m = manifests[0]
    pair = pair if pair is not None else _collection_pair(m, profile)
    chosen = _prompt_ids(data, manifests, limit)
    sub = data.subset([k for k, _ in chosen])
    sub.prompts = {k: sub.prompts[k] for k, _ in chosen}  # admitted in the decoded order
    cfg = DecodeConfig(k_config=data.tree.k_config, max_new_tokens=int(m["max_new_tokens"]))
    decoders = {name: MCSDDecoder(pair, cfg, stopper=s) for name, s in stoppers.items()}
    chats = {m.get("run_id"): chat_mode_of(m.get("prompt_format")) for m in manifests}
    first = decoders[next(iter(decoders))]  # prompts as their collection formatted them
    encoded = [_encode(first, prompt, chats.get(sequence_parts(key)[0], "off"))
               for key, prompt in chosen]

    def decode(dec, name: str, unit: list, into: Measured) -> None:
        out = (dec.generate(unit[0]) if batch_size == 1
               else dec.generate_batch(unit, batch_size=batch_size))
        into.add(out.stats, 0)

    units = [[ids] for ids in encoded] if batch_size == 1 else [encoded] * repeats
    measured = measure(decoders, units, decode, seed, progress,
                       "prompt" if batch_size == 1 else "round")
    rows = {}
    for name, stopper in stoppers.items():
        r = replay(sub, stopper, profile, name=name, batch_size=batch_size,
                   decision_s=(decision_s or {}).get(name, 0.0),
                   decision_row_s=(decision_row_s or {}).get(name, 0.0))
        real = measured[name].throughput
        rows[name] = {"replayed": r.throughput, "measured": real,
                      "error": r.throughput / real - 1, "tokens_replayed": r.tokens,
                      "tokens_measured": measured[name].tokens // (repeats if batch_size > 1
                                                                    else 1)}
    common = divide_common(rows)
    statics = sorted((n for n in rows if n.startswith("static:")), key=lambda n: int(n[7:]))
    rank = {k: _by(rows, statics, k) for k in ("replayed", "measured")}
    return {"prompts": len(chosen), "batch_size": batch_size, "per_stopper": rows,
            "common_factor": common,
            "max_abs_error": max(abs(r["error"]) for r in rows.values()),
            "max_abs_relative_error": max(abs(r["relative_error"]) for r in rows.values()),
            "static_order_replayed": rank["replayed"], "static_order_measured": rank["measured"],
            "same_static_order": rank["replayed"] == rank["measured"],
            "best_static_agrees": rank["replayed"][:1] == rank["measured"][:1]}


def _by(rows: dict[str, dict], names: list[str], key: str) -> list[str]:
    """`names` by their rows' `key`, highest first (equals in their order)."""
    return sorted(names, key=lambda n: -rows[n][key])


def format_stopper_check(check: dict) -> str:
    lines = [f"replay vs end to end on {check['prompts']} test prompts at batch size "
             f"{check.get('batch_size', 1)} (tokens/s):"]
    for name, r in check["per_stopper"].items():
        lines.append(f"  {name:<14} replayed {r['replayed']:8.1f}  measured {r['measured']:8.1f}"
                     f"  error {r['error']:+.1%} ({r['relative_error']:+.1%} without the "
                     f"common factor)")
    lines.append(f"  common factor replayed/measured {check['common_factor']:.3f}")
    lines.append(f"  static order: replayed {' > '.join(check['static_order_replayed'])}; "
                 f"measured {' > '.join(check['static_order_measured'])}")
    return "\n".join(lines)


# ------------------------------------------------------------------ decisions on outputs
def outputs_check(decoders: dict, traces: dict[str, list[Trace]], replayed: Replayed,
                  deploy: str, temperature: float = 0.0, limit: int = 4, seed: int = 0,
                  progress: bool = False, profile: CostProfile | None = None,
                  shape: tuple[int, ...] = (4,)) -> dict:
    """Replayed against measured decode tokens/s of each decoder (by method name; `LEARNED` the
    learned decision, `deploy` what a user would deploy instead) on the first `limit` outputs of
    every category in `traces`, decoded to the outputs' length with EOS ignored. `replayed(name,
    trace)` gives a method's replayed (seconds, steps) on one output. With `profile` (the one
    the replay prices with), also the decoders' own steps priced by it against their measured
    time (`priced`, `cost_error`), on the tree `shape`."""
    from mcsd_runtime.tree import Tree, parse_k_config

    chosen = [(cat, t) for cat, outs in traces.items() for t in outs[:limit]]
    tree = Tree(parse_k_config(shape))

    def decode(dec, name: str, unit: tuple[str, Trace], into: Measured) -> None:
        out = dec.generate(unit[1].prompt)
        priced = (profile.decode_seconds(tree, out.steps, from_prefill=name == "ar")
                  if profile is not None else 0.0)
        into.add(out.stats, len(out.steps), unit[0], priced)

    measured = measure(decoders, chosen, decode, seed, progress)
    rows = {}
    tokens = sum(len(t.tokens) for _, t in chosen)
    for name, m in measured.items():
        seconds, steps = 0.0, 0
        for _, trace in chosen:
            s, k = replayed(name, trace)
            seconds, steps = seconds + s, steps + k
        replay_tps = metrics.throughput(tokens, seconds)
        rows[name] = {"replayed": replay_tps, "measured": m.throughput,
                      "error": replay_tps / m.throughput - 1,
                      "steps_replayed": steps, "steps_measured": m.steps}
        if profile is not None:
            rows[name]["priced"] = metrics.throughput(m.tokens, m.priced)
            rows[name]["cost_error"] = rows[name]["priced"] / m.throughput - 1
    common = divide_common(rows)
    cost_common = divide_common(rows, "cost_error", "cost_relative_error") if profile else None
    per_cat = {cat: {name: m.per_category[cat] for name, m in measured.items()}
               for cat in traces if any(c == cat for c, _ in chosen)}
    categories = {cat: metrics.paired_speedup(by[LEARNED], by[deploy])
                  for cat, by in per_cat.items()}
    return {"prompts": len(chosen), "temperature": temperature, "deploy": deploy,
            "per_method": rows, "common_factor": common, "cost_common_factor": cost_common,
            "max_abs_error": max(abs(r["error"]) for r in rows.values()),
            "max_abs_relative_error": max(abs(r["relative_error"]) for r in rows.values()),
            "learned_vs_deploy_measured": categories, "per_prompt_tokens_per_s": per_cat}


def format_outputs_check(check: dict) -> str:
    lines = [f"replay vs end to end on {check['prompts']} held-out prompts at temperature "
             f"{check['temperature']:g} (decode tokens/s; steps):"]
    wide = max(12, *map(len, check["per_method"]))
    for name, r in check["per_method"].items():
        lines.append(f"  {name:<{wide}} replayed {r['replayed']:7.2f}  measured "
                     f"{r['measured']:7.2f}"
                     f"  error {r['error']:+6.1%} ({r['relative_error']:+6.1%} without the "
                     f"common factor)  steps {r['steps_replayed']} / {r['steps_measured']}")
    lines.append(f"  common factor replayed/measured {check['common_factor']:.3f}")
    if check.get("cost_common_factor"):
        lines.append("  the cost model alone, on the steps each decoder took (decode tokens/s):")
        for name, r in check["per_method"].items():
            lines.append(f"  {name:<{wide}} priced   {r['priced']:7.2f}  measured "
                         f"{r['measured']:7.2f}  error {r['cost_error']:+6.1%} "
                         f"({r['cost_relative_error']:+6.1%} without the common factor)")
        lines.append(f"  common factor priced/measured {check['cost_common_factor']:.3f}")
    lines.append(f"  measured learned vs {check['deploy']} by category (paired, 95% CI):")
    for cat, v in check["learned_vs_deploy_measured"].items():
        lines.append(f"    {cat:<20} {v['geomean']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]")
    return "\n".join(lines)


def format_check(check: dict) -> str:
    """Either check, formatted."""
    return (format_stopper_check(check) if "per_stopper" in check
            else format_outputs_check(check))


def copy_replayed(policy: CopyLength, costs: list[float]) -> Replayed:
    """Replayed (seconds, steps) of `ar`, a static `lookup:K:N` (or `lookup:K:N+static:1`),
    the draft alone (`static:1`) or the learned copy length, on one output."""
    draft_costs, prior = policy.draft_costs, policy.draft_prior  # beside a draft

    def replayed(name: str, trace: Trace) -> tuple[float, int]:
        if name == "ar":  # the first token comes from the prefill's logits
            return (len(trace.tokens) - 1) * costs[0], len(trace.tokens)
        if name == LEARNED:
            walked = Replay(trace, policy.max_copy, policy.min_ngram, policy.max_ngram).walk(
                policy.choose, costs, None, draft_costs, prior)
            return walked.cost_s, walked.steps
        if name == BESIDE:
            walked = Replay(trace, 1, 4, 4).walk(never, costs, None, draft_costs, prior)
            return walked.cost_s, walked.steps
        k, n = (int(v) for v in name.partition("+")[0].split(":")[1:])
        beside = draft_costs if "+" in name else None
        walked = Replay(trace, k, n, 4).walk(copy_all(k), costs[: k + 1], None, beside, prior)
        return walked.cost_s, walked.steps

    return replayed


def copy_check(pair, policy: CopyLength, traces: dict[str, list[Trace]],
               statics: Sequence[str], limit: int = 4, seed: int = 0, progress: bool = False,
               tree: tuple[int, ...] | None = None, profile: CostProfile | None = None) -> dict:
    """`outputs_check` of `ar`, each static (`lookup:K:N`, or `lookup:K:N+static:1`) and the
    learned copy length (`statics[0]` the deploy); with `tree` (a policy trained beside a
    draft), `static:1` and the composed policy on it."""
    from mcsd_runtime.decode.records import DecodeConfig
    from mcsd_runtime.evaluate.runners import build_method, learned_lookup_decoder

    n_tokens = len(next(t for outs in traces.values() for t in outs).tokens)
    shape: dict[str, Any] = {} if tree is None else {"k_config": tree}
    base = DecodeConfig(max_new_tokens=n_tokens, temperature=policy.temperature, eos_token_ids=(),
                        seed=seed, **shape)
    names = ("ar", *statics, *((BESIDE,) if tree is not None else ()))
    decoders = {name: build_method(name, pair, base).decoder for name in names}
    decoders[LEARNED] = learned_lookup_decoder(pair, base, policy,
                                               BESIDE if tree is not None else None)
    return outputs_check(decoders, traces, copy_replayed(policy, policy.costs), statics[0],
                         policy.temperature, limit, seed, progress, profile, base.k_config)


def capped(statics: Sequence[str], max_copy: int, beside: str | None = None) -> list[str]:
    """Static `lookup:K:N` names with K capped at the policy's `max_copy` (composed with
    `beside`, when given), duplicates dropped."""
    out: list[str] = []
    for name in statics:
        k, n = (int(v) for v in name.split(":")[1:])
        name = f"lookup:{min(k, max_copy)}:{n}" + (f"+{beside}" if beside else "")
        if name not in out:
            out.append(name)
    return out


def width_check(pair, policy: WidthPolicy, traces: dict[str, list[Trace]],
                ranked: dict[str, list[Ranked]], profile: CostProfile, limit: int = 4,
                seed: int = 0, progress: bool = False) -> dict:
    """`outputs_check` of `ar`, every static width (`static:1` on the tree `(w,)`) and the
    learned width (on `(k,)`; the widest static the deploy), greedy: replay and decoder take the
    same steps."""
    from dataclasses import replace

    from mcsd_runtime.decisions.builtin import make_stopper
    from mcsd_runtime.decode.decoder import MCSDDecoder
    from mcsd_runtime.decode.records import DecodeConfig
    from mcsd_runtime.evaluate.runners import build_method
    from mcsd_runtime.tree import KConfig
    from replay.width import WidthReplay, learned, static

    k = policy.k
    n_tokens = len(next(t for outs in traces.values() for t in outs).tokens)
    base = DecodeConfig(max_new_tokens=n_tokens, eos_token_ids=(), seed=seed,
                        k_config=KConfig((k,)))
    decoders = {"ar": build_method("ar", pair, base).decoder}
    decoders |= {f"width {w}": MCSDDecoder(pair, replace(base, k_config=KConfig((w,))),
                                           stopper=make_stopper("static:1"))
                 for w in range(1, k + 1)}
    decoders[LEARNED] = MCSDDecoder(pair, base, stopper=make_stopper("static:1"), width=policy)
    rank_of = {id(t): r for cat in traces for t, r in zip(traces[cat], ranked[cat], strict=True)}
    walker = WidthReplay(profile, k)
    ar_s = profile.copy_step_seconds(0)  # a step of the target alone, as the copy replay

    def replayed(name: str, trace: Trace) -> tuple[float, int]:
        if name == "ar":
            return (len(trace.tokens) - 1) * ar_s, len(trace.tokens)
        rule = learned(policy) if name == LEARNED else static(int(name.split()[1]))
        walked = walker.walk(rank_of[id(trace)], rule)
        return walked.cost_s, walked.steps

    return outputs_check(decoders, traces, replayed, f"width {k}", 0.0, limit, seed, progress,
                         profile, (k,))

