"""Check a replay against reality: decode the same held-out prompts end to end, every stopper in
a fresh random order per prompt (after a warm-up), and compare replayed tokens/s with measured
(decode phase: the prefill, which no stopper changes and replay does not model, is left out).

A cost model (profile + replay) earns trust only when it predicts end-to-end speed: within a few
percent per stopper, and the same order of static depths. `end_to_end_check` reports both, per
stopper: replayed and measured tokens/s, the relative error, and whether the static depths rank
alike.
"""

from __future__ import annotations

import math
import random
import statistics

from mcsd_runtime import metrics
from mcsd_runtime.costmodel.profile import CostProfile
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.progress import progress as progress_bar
from mcsd_runtime.prompts.chat import chat_mode_of, encode_prompt
from mcsd_runtime.prompts.domains import Prompt
from train import replay as R
from train.data import sequence_parts


def _prompt_ids(data: R.ReplayData, manifests: list[dict], limit: int
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


def end_to_end_check(data: R.ReplayData, manifests: list[dict], profile: CostProfile,
                     stoppers: dict[str, object], limit: int = 8, seed: int = 0,
                     decision_s: dict[str, float] | None = None, pair=None,
                     progress: bool = False, batch_size: int = 1, repeats: int = 1,
                     decision_row_s: dict[str, float] | None = None) -> dict:
    """Replayed against measured tokens/s for each named stopper on up to `limit` prompts of
    `data` (greedy, the collection's pair, k-config and max_new_tokens). Above batch size 1 the
    prompts are decoded `repeats` times together with `generate_batch` per stopper (stoppers in
    a fresh random order each time) and replayed at that batch size, in the same order."""
    import torch

    from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
    from mcsd_runtime.models.device import command_dtype
    from mcsd_runtime.models.pair import load_pair

    if profile.threads:  # time as the profile was timed
        torch.set_num_threads(profile.threads)
    m = manifests[0]
    if pair is None:
        fp = m.get("pair") or {}
        device = _profile_device(profile)
        pair = load_pair(fp["target"], fp["draft"], device=device,
                         dtype=command_dtype(m.get("dtype", "auto"), device))
    chosen = _prompt_ids(data, manifests, limit)
    sub = data.subset([k for k, _ in chosen])
    sub.prompts = {k: sub.prompts[k] for k, _ in chosen}  # admitted in the decoded order
    cfg = DecodeConfig(k_config=data.tree.k_config, max_new_tokens=int(m["max_new_tokens"]))
    decoders = {name: MCSDDecoder(pair, cfg, stopper=s) for name, s in stoppers.items()}
    chats = {m.get("run_id"): chat_mode_of(m.get("prompt_format")) for m in manifests}
    first = decoders[next(iter(decoders))]  # prompts as their collection formatted them
    encoded = [_encode(first, prompt, chats.get(sequence_parts(key)[0], "off"))
               for key, prompt in chosen]
    for dec in decoders.values():  # warm-up
        if batch_size == 1:
            dec.generate(encoded[0])
        else:
            dec.generate_batch(encoded[:batch_size], batch_size=batch_size)
    tokens = dict.fromkeys(decoders, 0)
    wall = dict.fromkeys(decoders, 0.0)
    order = random.Random(seed)
    units = ([[ids] for ids in encoded] if batch_size == 1 else [encoded] * repeats)
    for unit in progress_bar(units, desc="end-to-end check", unit="prompt" if batch_size == 1
                             else "round", disable=not progress):
        names = list(decoders)
        order.shuffle(names)
        for name in names:
            st = (decoders[name].generate(unit[0]).stats if batch_size == 1
                  else decoders[name].generate_batch(unit, batch_size=batch_size).stats)
            tokens[name] += st.new_tokens
            wall[name] += st.decode_time
    rows = {}
    for name, stopper in stoppers.items():
        r = R.replay(sub, stopper, profile, name=name, batch_size=batch_size,
                     decision_s=(decision_s or {}).get(name, 0.0),
                     decision_row_s=(decision_row_s or {}).get(name, 0.0))
        measured = metrics.throughput(tokens[name], wall[name])
        rows[name] = {"replayed": r.throughput, "measured": measured,
                      "error": r.throughput / measured - 1, "tokens_replayed": r.tokens,
                      "tokens_measured": tokens[name] // (repeats if batch_size > 1 else 1)}
    # a common factor (the machine busier or quieter than when profiled) moves every stopper
    # alike and leaves decisions unchanged: the error once it is divided out
    common = math.exp(statistics.mean(math.log(1 + r["error"]) for r in rows.values()))
    for r in rows.values():
        r["relative_error"] = (1 + r["error"]) / common - 1
    statics = sorted((n for n in rows if n.startswith("static:")), key=lambda n: int(n[7:]))
    rank = {k: sorted(statics, key=lambda n, k=k: -rows[n][k]) for k in ("replayed", "measured")}
    return {"prompts": len(chosen), "batch_size": batch_size, "per_stopper": rows,
            "common_factor": common,
            "max_abs_error": max(abs(r["error"]) for r in rows.values()),
            "max_abs_relative_error": max(abs(r["relative_error"]) for r in rows.values()),
            "static_order_replayed": rank["replayed"], "static_order_measured": rank["measured"],
            "same_static_order": rank["replayed"] == rank["measured"],
            "best_static_agrees": rank["replayed"][:1] == rank["measured"][:1]}


def format_check(check: dict) -> str:
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
