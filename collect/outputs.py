"""The target's own outputs of prompts, and what the draft proposed along them: the data that
the copy-length and width decisions are trained and replayed on (`replay.copy`,
`replay.width`), as `collect.run` logs drafted trees for the depth stopper.

Prompt lookup is lossless, so the target's own output decides what every copy would have
accepted: one pass per prompt (greedy, or sampled at the decoding temperature; with the target's
top-1 probability at each token). Beside a draft, what a drafted step's first depth accepts is
known from the output too under greedy decoding: whether the output's next token is among the
draft's candidates there, read from one teacher-forced pass of the target and the draft per
output (`draft_hits`, `draft_ranks`), the same distributions the decoder's drafting step
computes. When sampling, a drafted step's acceptance is a draw of its own: each output is then
drawn through that step's verification at every position (`drafted_traces`), which records the
draw. `TraceCache` keeps outputs in a JSON file between runs.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.progress import progress


@dataclass
class Trace:
    """A prompt, the target's output (greedy, or sampled at the decoder's temperature) and the
    target's top-1 probability (at temperature 1, as the decoder reports it) at each token."""

    prompt: list[int]
    tokens: list[int]
    conf: list[float]
    hits: list[int] | None = None  # per token: among the draft's first-depth candidates there


@torch.no_grad()
def target_traces(pair, prompts: Sequence[list[int]], max_new_tokens: int,
                  temperature: float = 0.0, seed: int = 0, stop_at_eos: bool = False,
                  desc: str = "target outputs") -> list[Trace]:
    """The target's output of each prompt, token by token with its cache: greedy at temperature
    0, else sampled (each prompt's generator seeded from `seed` and its tokens: an output does
    not depend on the prompts beside it).

    A sampled output replays lossless lookup exactly: a copied token is accepted with the
    target's probability of it, and on rejection the token comes from the target's other
    tokens, so "the copy was accepted" is "the copy equals the output's token"."""
    from transformers import DynamicCache

    from mcsd_runtime.backend.compat import cache_kwargs

    model, out = pair.target, []
    for ids in progress(prompts, desc=desc, unit="prompt"):
        cache, tokens, conf = DynamicCache(), [], []
        gen = torch.Generator(device=pair.device).manual_seed(seed + zlib.crc32(str(ids).encode()))
        x = torch.tensor([ids], device=pair.device)
        for _ in range(max_new_tokens):
            logits = model(input_ids=x, **cache_kwargs(model, cache), use_cache=True).logits[0, -1]
            p = torch.softmax(logits.float(), -1)
            if temperature > 0:
                sampling = torch.softmax(logits.float() / temperature, -1)
                token = int(torch.multinomial(sampling, 1, generator=gen))
            else:
                token = int(p.argmax())
            tokens.append(token)
            conf.append(float(p.max()))
            if stop_at_eos and token in pair.eos_token_ids:
                break
            x = torch.tensor([[token]], device=pair.device)
        out.append(Trace(list(ids), tokens, conf))
    return out


@torch.no_grad()
def draft_hits(pair, traces: Sequence[Trace], width: int,
               desc: str = "draft candidates") -> list[Trace]:
    """`traces` with `hits`: whether each output token is among the `width` likeliest of the
    draft's distribution at its position (a drafted step's greedy first depth), from one forward
    of the draft over prompt and output (and of the target before it, for a feature draft, which
    reads the target's state one position back, as the decoder feeds it)."""
    out = []
    for t in progress(traces, desc=desc, unit="output"):
        top = teacher_forced_draft_logits(pair, t).float().topk(width, dim=-1).indices
        truth = torch.tensor(t.tokens, device=pair.device)[:, None]
        out.append(replace(t, hits=(top == truth).any(-1).int().tolist()))
    return out


@torch.no_grad()
def drafted_traces(pair, prompts: Sequence[list[int]], max_new_tokens: int, temperature: float,
                   width: int, verify: str = "mcss", seed: int = 0, stop_at_eos: bool = False,
                   desc: str = "target outputs with drafted steps") -> list[Trace]:
    """Sampled outputs with `hits` for a policy beside a draft at `temperature` > 0: every token
    comes from a drafted step's verification at its position — `width` candidates drawn from
    the draft's distribution there and verified against the target's with `verify`, as the
    decoder's first depth does (`decode.speculative_sampling`) — and `hits` says whether a
    candidate was accepted. Verification is lossless, so each output is a sample of the
    target's, and the replay's copies read it as `target_traces`' (accepted when equal to the
    output's token); each position's token and acceptance are jointly one draw of the decoder's
    drafted step there. Seeded per prompt from `seed` and its tokens, as `target_traces`."""
    from transformers import DynamicCache

    from mcsd_runtime.backend.compat import cache_kwargs
    from mcsd_runtime.decode import speculative_sampling as V
    from mcsd_runtime.distill.feature import is_feature_draft

    if temperature <= 0:
        raise ValueError("drafted_traces samples: greedy hits come from `draft_hits`")
    draw = V.sample_with_replacement if verify == "mcss-replacement" else (
        V.sample_without_replacement)
    features, out = is_feature_draft(pair.draft), []
    for ids in progress(prompts, desc=desc, unit="prompt"):
        cache, tokens, conf, hits = DynamicCache(), [], [], []
        gen = torch.Generator(device=pair.device).manual_seed(seed + zlib.crc32(str(ids).encode()))
        x, states = torch.tensor([ids], device=pair.device), []
        for _ in range(max_new_tokens):
            t_out = pair.target(input_ids=x, **cache_kwargs(pair.target, cache), use_cache=True,
                                output_hidden_states=features)
            if features:
                states.append(t_out.hidden_states[-1])
            context = torch.tensor([ids + tokens], device=pair.device)
            d_logits = _draft_logits(pair, context, torch.cat(states, 1) if features else None,
                                     keep=1)[-1]
            p = torch.softmax(t_out.logits[0, -1].float() / temperature, -1)[None]
            q = torch.softmax(d_logits.float() / temperature, -1)[None]
            cands = draw(q, width, gen)
            rank, nxt = V.verify_children(p, q, cands, verify, gen)
            r = int(rank)
            token = int(cands[0, r]) if r >= 0 else int(nxt)
            tokens.append(token)
            hits.append(int(r >= 0))
            conf.append(float(torch.softmax(t_out.logits[0, -1].float(), -1).max()))
            if stop_at_eos and token in pair.eos_token_ids:
                break
            x = torch.tensor([[token]], device=pair.device)
        out.append(Trace(list(ids), tokens, conf, hits))
    return out


@torch.no_grad()
def teacher_forced_draft_logits(pair, t: Trace) -> torch.Tensor:
    """The draft's logits [n, V] before each of the output's n tokens, from one forward over
    prompt and output (and one of the target before it, for a feature draft, which reads the
    target's state one position back, as the decoder feeds it)."""
    from mcsd_runtime.distill.feature import is_feature_draft

    ids = torch.tensor([t.prompt + t.tokens], device=pair.device)
    states = None
    if is_feature_draft(pair.draft):
        states = pair.target(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    return _draft_logits(pair, ids, states)[len(t.prompt) - 1 : -1]


def _draft_logits(pair, ids: torch.Tensor, states: torch.Tensor | None,
                  keep: int = 0) -> torch.Tensor:
    """The draft's logits [n, V] at every position of `ids` [1, n] (`keep` > 0: the last `keep`
    positions only); a feature draft reads at each position the target's state one position
    back (`states` [1, n, H]: the target's final states there), as the decoder feeds it."""
    extra = {}
    if states is not None:
        extra["prev_hidden"] = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], 1)
    return pair.draft(input_ids=ids, logits_to_keep=keep, **extra).logits[0]


@dataclass
class Ranked:
    """One output with, at each position, the draft's k largest probabilities (`top` [n, k],
    descending) and the rank of the output's token among those k (`rank` [n], -1: none)."""

    top: np.ndarray
    rank: np.ndarray


@torch.no_grad()
def draft_ranks(pair, traces: Sequence, k: int, desc: str = "draft candidates") -> list[Ranked]:
    """`Ranked` of each trace (`train.copy.fit.Trace`: a prompt and the target's output),
    from the draft's teacher-forced distributions (`teacher_forced_draft_logits`, which
    `train.copy.fit.draft_hits` reads too)."""
    out = []
    for t in progress(traces, desc=desc, unit="output"):
        logits = teacher_forced_draft_logits(pair, t).float()
        top = torch.softmax(logits, -1).topk(k, dim=-1)
        hit = top.indices == torch.tensor(t.tokens, device=pair.device)[:, None]
        rank = torch.where(hit.any(-1), hit.int().argmax(-1), -1)
        out.append(Ranked(top.values.cpu().numpy().astype(float), rank.cpu().numpy()))
    return out


class TraceCache:
    """The target's outputs by prompt, kept in a JSON file when one is given."""

    def __init__(self, path: Path | None, target: str, max_new_tokens: int,
                 stop_at_eos: bool, temperature: float = 0.0, seed: int = 0,
                 drafted: dict | None = None) -> None:
        self.path = path
        self.key = {"target": target, "max_new_tokens": max_new_tokens,
                    "stop_at_eos": stop_at_eos}
        if temperature > 0:  # greedy outputs need neither
            self.key |= {"temperature": temperature, "seed": seed}
        if drafted is not None:  # outputs drawn through a draft's verification, with hits
            self.key |= {"drafted": drafted}
        self.traces: dict[str, list] = {}
        if path is not None and path.exists():
            try:
                data = json.loads(path.read_text())
            except ValueError as err:
                raise MCSDError(f"--traces {path} is not JSON ({err}); delete it") from None
            if data.get("key") != self.key:
                raise MCSDError(f"--traces {path} holds outputs of {data.get('key')}, not "
                                f"{self.key}: use another file")
            self.traces = data["traces"]

    def get(self, pair, prompts: list, chat: str, name: str) -> list:
        from mcsd_runtime.evaluate.runners import encode_prompt

        ids = [encode_prompt(pair, p, chat) for p in prompts]
        keys = [hashlib.sha1(json.dumps(i).encode()).hexdigest() for i in ids]
        todo = [i for i, k in zip(ids, keys, strict=True) if k not in self.traces]
        if todo:
            k = self.key
            if "drafted" in k:
                made = drafted_traces(pair, todo, k["max_new_tokens"], k["temperature"],
                                      k["drafted"]["width"], k["drafted"]["verify"], k["seed"],
                                      k["stop_at_eos"], desc=f"outputs with drafted steps: {name}")
            else:
                made = target_traces(pair, todo, k["max_new_tokens"], k.get("temperature", 0.0),
                                     k.get("seed", 0), k["stop_at_eos"],
                                     desc=f"target outputs: {name}")
            for t in made:
                self.traces[hashlib.sha1(json.dumps(t.prompt).encode()).hexdigest()] = [
                    t.tokens, t.conf, *([t.hits] if t.hits is not None else [])]
            self.save()
        return [Trace(i, *self.traces[k]) for i, k in zip(ids, keys, strict=True)]

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps({"key": self.key, "traces": self.traces}))
        tmp.replace(self.path)


