"""Training data for a distilled draft, generated offline by the target itself.

Three kinds of sequences, each stored with the target's `top_k` largest log-probabilities at
every trained position (so training never runs the target):

- `chat`: Magpie-style self-generated conversations. The target is fed its chat template's
  user-turn prefix (the template rendered around a placeholder, cut before it) and samples a
  query until its end of turn; then, with the template applied to that query, it writes its
  greedy answer. Trained positions: the answer's tokens (its end of turn included). These are
  what a draft for a chat model must predict, and no corpus has them.
- `prompt`: instructions of a prompt set (`--prompts SPEC`) answered the same way.
- `text`: windows of plain text (the interpreter's stdlib sources, TEXT_WINDOW tokens each)
  scored by the target.

Generation is batched (left padding, `generate` on `gen_batch` rows): one-token forwards are
latency-bound on a CPU, many rows per forward cost little more than one. Each batch is saved
as it finishes (`<stream>-NNNNN.pt`, plus `conversations.jsonl` to read), so a run that stops
resumes where it was; batch `b` of a stream is sampled from a seed of (recipe seed, stream,
b), so the data do not depend on where a run stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.progress import progress, working

PLACEHOLDER = "\x00MCSD-QUERY\x00"
TEXT_BATCH = 8  # windows per target forward when scoring text
TEXT_CHUNK = 32  # windows per saved text batch (a unit of work and of resumption)
TEXT_WINDOW = 256  # tokens per text window (fewer when the recipe's rows are shorter)
CHARS_PER_TOKEN_SAMPLED = 8  # text sampled per token of text wanted (tokens are ~3-4 chars)


@dataclass
class Sequence:
    """Token ids with the target's top-k at the trained positions: the target's distribution
    at position `start - 1 + j` (predicting `tokens[start + j]`) has its `top_k` largest
    log-probabilities `top_logp[j]` at ids `top_ids[j]`, largest first."""

    kind: str
    tokens: torch.Tensor  # [n] int64
    start: int
    top_ids: torch.Tensor  # [n - start, k] int32
    top_logp: torch.Tensor  # [n - start, k] float16

    @property
    def trained(self) -> int:
        return int(self.tokens.numel()) - self.start

    def to_dict(self) -> dict:
        return {"kind": self.kind, "tokens": self.tokens, "start": self.start,
                "top_ids": self.top_ids, "top_logp": self.top_logp}


# --------------------------------------------------------------------------- the chat template
def user_prefix(tokenizer) -> str | None:
    """The text of a chat up to where the user's first message begins (the system turn the
    template adds by default included), or None when the tokenizer has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    full = tokenizer.apply_chat_template([{"role": "user", "content": PLACEHOLDER}],
                                         tokenize=False, add_generation_prompt=False)
    if PLACEHOLDER not in full:
        return None
    return full[: full.index(PLACEHOLDER)]


def chat_prompt(tokenizer, query: str) -> str:
    """The chat template applied to one user message, ready for the assistant's answer."""
    return tokenizer.apply_chat_template([{"role": "user", "content": query}], tokenize=False,
                                         add_generation_prompt=True)


def end_ids(model, tokenizer) -> list[int]:
    """Token ids that end a turn: the generation config's and tokenizer's EOS, and the special
    token the chat template puts right after a message's content, if any."""
    ids: set[int] = set()
    for eos in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
    if getattr(tokenizer, "chat_template", None):
        full = tokenizer.apply_chat_template([{"role": "user", "content": PLACEHOLDER}],
                                             tokenize=False, add_generation_prompt=False)
        after = full[full.index(PLACEHOLDER) + len(PLACEHOLDER):] if PLACEHOLDER in full else ""
        first = tokenizer(after, add_special_tokens=False)["input_ids"][:1]
        if first and first[0] in set(tokenizer.all_special_ids):
            ids.add(first[0])
    if not ids:
        raise MCSDError("the target names no end-of-sequence token: cannot generate answers")
    return sorted(ids)


def _pad_id(tokenizer, stops: list[int]) -> int:
    pad = tokenizer.pad_token_id
    return int(pad) if pad is not None else stops[0]


def _batch_seed(seed: int, stream: str, batch: int) -> int:
    blob = f"{seed}:{stream}:{batch}".encode()
    return int(hashlib.sha256(blob).hexdigest()[:8], 16)


def _cut(row: torch.Tensor, stops: list[int]) -> torch.Tensor:
    """A generated row up to and including its first end token."""
    hit = torch.isin(row, torch.tensor(stops))
    return row[: int(hit.nonzero()[0]) + 1] if hit.any() else row


@torch.inference_mode()
def sample_queries(model, tokenizer, n: int, max_tokens: int, temperature: float,
                   seed: int) -> list[str]:
    """`n` queries the target writes itself after its chat template's user prefix (sampled,
    one `generate` call, all rows of the same length so no padding)."""
    prefix = user_prefix(tokenizer)
    stops = end_ids(model, tokenizer)
    ids = torch.tensor([tokenizer(prefix, add_special_tokens=False)["input_ids"]] * n,
                       device=model.device)
    torch.manual_seed(seed)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                         temperature=temperature, top_k=0, top_p=1.0,
                         max_new_tokens=max_tokens, eos_token_id=stops,
                         pad_token_id=_pad_id(tokenizer, stops))
    rows = out[:, ids.shape[1]:].cpu()
    special = set(tokenizer.all_special_ids)
    queries = []
    for row in rows:
        kept = [t for t in _cut(row, stops).tolist() if t not in special]
        queries.append(tokenizer.decode(kept, skip_special_tokens=True).strip())
    return queries


class TopKRecorder:
    """A logits processor that keeps the top-k log-probabilities of every generation step's
    scores and changes nothing (storing whole logits would take GBs at 49k tokens)."""

    def __init__(self, k: int):
        self.k = k
        self.ids: list[torch.Tensor] = []
        self.logp: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        top = torch.log_softmax(scores.float(), -1).topk(self.k, -1)
        self.ids.append(top.indices.to(torch.int32))
        self.logp.append(top.values.to(torch.float16))
        return scores


@torch.inference_mode()
def answer(model, tokenizer, queries: list[str], max_tokens: int, top_k: int,
           kind: str = "chat") -> list[Sequence]:
    """The target's greedy answers to `queries` (chat template applied, one left-padded
    `generate` call), each a Sequence over prompt + answer with the target's top-k at every
    answer token, recorded from the logits the generation computes anyway."""
    from transformers import LogitsProcessorList

    stops = end_ids(model, tokenizer)
    prompts = [tokenizer(chat_prompt(tokenizer, q), add_special_tokens=False)["input_ids"]
               for q in queries]
    width = max(map(len, prompts))
    pad = _pad_id(tokenizer, stops)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                        device=model.device)
    recorder = TopKRecorder(top_k)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                         max_new_tokens=max_tokens, eos_token_id=stops, pad_token_id=pad,
                         logits_processor=LogitsProcessorList([recorder])).cpu()
    top_ids = torch.stack(recorder.ids, 1).cpu()
    top_logp = torch.stack(recorder.logp, 1).cpu()
    seqs = []
    for i, prompt in enumerate(prompts):
        ans = _cut(out[i, width:], stops)
        n = ans.numel()
        seqs.append(Sequence(kind, torch.tensor(prompt + ans.tolist()), len(prompt),
                             top_ids[i, :n].clone(), top_logp[i, :n].clone()))
    return seqs


@torch.inference_mode()
def score_text(model, windows: torch.Tensor, top_k: int, batch: int = TEXT_BATCH
               ) -> list[Sequence]:
    """Text windows [n, L] scored by the target: each a Sequence trained from its second
    token on."""
    seqs = []
    for i in range(0, windows.shape[0], batch):
        rows = windows[i : i + batch]
        logits = model(input_ids=rows.to(model.device)).logits[:, :-1]
        top = torch.log_softmax(logits.float(), -1).topk(top_k, -1)
        ids, values = top.indices.to(torch.int32).cpu(), top.values.to(torch.float16).cpu()
        for j in range(rows.shape[0]):
            seqs.append(Sequence("text", rows[j].clone(), 1, ids[j], values[j]))
    return seqs


def text_windows(tokenizer, split: str, n_tokens: int, seq_len: int) -> torch.Tensor:
    """`max(1, n_tokens // seq_len)` windows [n, seq_len] of the stdlib split `split`, evenly
    spaced over a sample of its files (every k-th, about CHARS_PER_TOKEN_SAMPLED characters per
    token wanted, so that little text is tokenized for nothing)."""
    from mcsd_runtime.toy.corpus import read_source, source_files
    from mcsd_runtime.toy.training import token_stream

    files = source_files(split)
    n = max(1, n_tokens // seq_len)
    want = n * seq_len * CHARS_PER_TOKEN_SAMPLED
    sizes = [f.path.stat().st_size for f in files]
    stride = max(1, int(sum(sizes) // max(want, 1)))
    stream = token_stream([read_source(f) for f in files[::stride]], tokenizer)
    if stream.numel() < seq_len:
        raise MCSDError(f"the stdlib {split} split has fewer than {seq_len} tokens")
    n = min(n, stream.numel() // seq_len)
    step = stream.numel() // n
    return torch.stack([stream[i * step : i * step + seq_len] for i in range(n)])


# ------------------------------------------------------------------------- the cached streams
class DataStore:
    """A folder of generated batches (`<stream>-NNNNN.pt`) and a readable log of the
    conversations (`conversations.jsonl`)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, stream: str, batch: int) -> Path:
        return self.folder / f"{stream}-{batch:05d}.pt"

    def has(self, stream: str, batch: int) -> bool:
        return self.path(stream, batch).is_file()

    def load(self, stream: str, batch: int) -> list[Sequence] | None:
        got = self._read(stream, batch)
        return None if got is None else [Sequence(**r) for r in got["seqs"]]

    def seconds(self, stream: str, batch: int) -> float:
        """Seconds (one thread) it took to generate a saved batch."""
        got = self._read(stream, batch)
        return 0.0 if got is None else float(got["seconds"])

    def _read(self, stream: str, batch: int) -> dict | None:
        path = self.path(stream, batch)
        if not path.is_file():
            return None
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # noqa: BLE001 - a damaged batch is generated again
            return None

    def save(self, stream: str, batch: int, seqs: list[Sequence], seconds: float,
             tokenizer=None) -> None:
        path = self.path(stream, batch)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"seqs": [s.to_dict() for s in seqs], "seconds": seconds}, tmp)
        tmp.replace(path)
        if tokenizer is not None and seqs and seqs[0].kind != "text":
            lines = [json.dumps({"stream": stream, "batch": batch,
                                 "prompt": tokenizer.decode(s.tokens[: s.start]),
                                 "answer": tokenizer.decode(s.tokens[s.start:])}) + "\n"
                     for s in seqs]
            with (self.folder / "conversations.jsonl").open("a") as f:
                f.write("".join(lines))  # one write per batch: workers do not interleave


@dataclass(frozen=True)
class Job:
    """One batch to generate: `kind` chat (self-written queries), prompt (`texts` answered)
    or text (`windows` scored)."""

    stream: str
    batch: int
    kind: str
    texts: tuple[str, ...] = ()
    windows: torch.Tensor | None = None


def run_job(job: Job, model, tokenizer, recipe, store: DataStore) -> int:
    """Generate and save `job`'s batch unless the store has it; returns its sequences."""
    got = store.load(job.stream, job.batch)
    if got is not None:
        return len(got)
    start = time.perf_counter()
    if job.kind == "chat":
        seed = _batch_seed(recipe.seed, job.stream, job.batch)
        queries = sample_queries(model, tokenizer, recipe.gen_batch, recipe.query_tokens,
                                 recipe.query_temperature, seed)
        queries = [q for q in dict.fromkeys(queries) if q]  # no empty or repeated query
        got = answer(model, tokenizer, queries, recipe.answer_tokens, recipe.top_k) \
            if queries else []
    elif job.kind == "prompt":
        got = answer(model, tokenizer, list(job.texts), recipe.answer_tokens, recipe.top_k,
                     kind="prompt")
    else:
        got = score_text(model, job.windows, recipe.top_k)
    store.save(job.stream, job.batch, got, time.perf_counter() - start, tokenizer)
    return len(got)


def run_jobs(jobs: list[Job], model, tokenizer, recipe, store: DataStore, bar=None,
             workers: int = 1, target_folder: Path | None = None) -> None:
    """Run the jobs the store lacks: here, or in `workers` processes of one torch thread each
    (`python -m mcsd_runtime.distill.worker_process`, each loading the target from `target_folder`).
    Processes rather than threads: on a shared CPU one busy core stalls every multi-threaded
    kernel, and one process per core does not. Plain subprocesses rather than
    multiprocessing's spawn, which would run the caller's script again in every worker."""
    todo = [j for j in jobs if not store.has(j.stream, j.batch)]
    for j in jobs:
        if store.has(j.stream, j.batch) and bar is not None:
            bar.update(len(store.load(j.stream, j.batch) or []))
    if not todo:
        return
    if workers <= 1 or len(todo) == 1 or target_folder is None:
        for job in todo:
            n = run_job(job, model, tokenizer, recipe, store)
            if bar is not None:
                bar.update(n)
        return
    from mcsd_runtime.distill.worker import run_workers

    run_workers(todo, recipe, store, Path(target_folder), min(workers, len(todo)), bar)


def _chat_jobs(stream: str, first: int, count: int) -> list[Job]:
    return [Job(stream, b, "chat") for b in range(first, first + count)]


def _collect(store: DataStore, stream: str, n: int) -> tuple[list[Sequence], int]:
    """The first `n` sequences of a stream's saved batches, and the batches read."""
    seqs: list[Sequence] = []
    batch = 0
    while len(seqs) < n:
        got = store.load(stream, batch)
        if got is None:
            break
        seqs.extend(got[: n - len(seqs)])
        batch += 1
    return seqs, batch


@dataclass
class DistillData:
    """The sequences of one recipe, by role, and the seconds spent generating them here."""

    train: list[Sequence]
    heldout_chat: list[Sequence]
    heldout_text: list[Sequence]
    seconds: float
    has_chat: bool
    prompts: int = 0
    batch_seconds: float = 0.0  # one-thread seconds it took to generate the batches used

    def counts(self) -> dict:
        kinds: dict[str, dict[str, int]] = {}
        for s in self.train:
            k = kinds.setdefault(s.kind, {"sequences": 0, "trained_tokens": 0})
            k["sequences"] += 1
            k["trained_tokens"] += s.trained
        return {"train": kinds,
                "heldout_chat": {"sequences": len(self.heldout_chat),
                                 "tokens": sum(s.trained for s in self.heldout_chat)},
                "heldout_text": {"sequences": len(self.heldout_text),
                                 "tokens": sum(s.trained for s in self.heldout_text)}}


def generate_data(folder: Path, model, tokenizer, recipe, progress_on: bool = True,
                  workers: int = 1, target_folder: Path | None = None) -> DistillData:
    """All sequences of `recipe` for this target, generated into (or read from) `folder`;
    with `workers` > 1 and `target_folder`, batches are generated by that many processes."""
    store = DataStore(folder)
    start = time.perf_counter()
    has_chat = user_prefix(tokenizer) is not None
    texts = _prompt_texts(recipe, has_chat)
    size = recipe.gen_batch
    wanted = {"heldout": recipe.heldout_conversations, "chat": recipe.conversations} \
        if has_chat else {}
    jobs = [j for stream, n in wanted.items() for j in _chat_jobs(stream, 0, -(-n // size))]
    prompt_stream = "prompts-" + hashlib.sha256("\0".join(texts).encode()).hexdigest()[:12]
    jobs += [Job(prompt_stream, b, "prompt", tuple(texts[i : i + size]))
             for b, i in enumerate(range(0, len(texts), size))]
    text_streams = _text_jobs(tokenizer, recipe, progress_on)
    jobs += [j for js in text_streams.values() for j in js]
    total = sum(wanted.values()) + len(texts) + sum(
        j.windows.shape[0] for j in jobs if j.kind == "text")
    chats = _generate(jobs, wanted, store, size, total, progress_on,
                      lambda js, bar: run_jobs(js, model, tokenizer, recipe, store, bar, workers,
                                               target_folder))
    prompted = [s for b in range(-(-len(texts) // size)) for s in store.load(prompt_stream, b)]
    text = {role: [s for j in js for s in store.load(j.stream, j.batch)]
            for role, js in text_streams.items()}
    used = [(j.stream, j.batch) for j in jobs if j.kind != "chat"] + [
        (stream, b) for stream, seqs in chats.items()
        for b in range(_collect(store, stream, len(seqs))[1])]
    return DistillData(train=chats.get("chat", []) + prompted + text["text"],
                       heldout_chat=chats.get("heldout", []), heldout_text=text["heldout-text"],
                       seconds=time.perf_counter() - start, has_chat=has_chat,
                       prompts=len(texts),
                       batch_seconds=sum(store.seconds(st, b) for st, b in used))


def _prompt_texts(recipe, has_chat: bool) -> list[str]:
    """The instructions of the recipe's prompt set (none without one); MCSDError when the
    target has no chat template to answer them in."""
    if not recipe.prompts:
        return []
    if not has_chat:
        raise MCSDError("--prompts needs a target with a chat template; this one has none")
    from mcsd_runtime.prompts.sets import load_prompts

    return [p.text for p in load_prompts(recipe.prompts, limit=recipe.prompt_limit or None,
                                         seed=recipe.seed)]


def _text_jobs(tokenizer, recipe, progress_on: bool) -> dict[str, list[Job]]:
    """The jobs scoring the recipe's stdlib text, by role: `text` (the train split) and
    `heldout-text` (the eval split); a role of no tokens has none."""
    text_streams: dict[str, list[Job]] = {}
    for role, split, n_tokens in (("text", "train", recipe.text_tokens),
                                  ("heldout-text", "eval", recipe.heldout_text_tokens)):
        text_streams[role] = []
        if n_tokens > 0:
            window = min(TEXT_WINDOW, recipe.seq_len)
            with working(f"reading {n_tokens} tokens of stdlib {split} text", disable=not
                         progress_on):
                windows = text_windows(tokenizer, split, n_tokens, window)
            stream = f"{role}-{windows.shape[0]}x{window}"
            text_streams[role] = [Job(stream, b, "text", windows=windows[i : i + TEXT_CHUNK])
                                  for b, i in enumerate(range(0, windows.shape[0], TEXT_CHUNK))]
    return text_streams


def _generate(jobs: list[Job], wanted: dict[str, int], store: DataStore, size: int, total: int,
              progress_on: bool, run: Callable[[list[Job], Any], None]
              ) -> dict[str, list[Sequence]]:
    """Run `jobs` (through `run(jobs, bar)`) behind a progress bar of `total` sequences, then
    more batches of `size` queries for each chat stream short of its `wanted` sequences
    (dropped queries); returns the chat streams' sequences. MCSDError when the target keeps
    writing too few usable queries."""
    bar = progress(total=total, desc="generating data", unit="seq", disable=not progress_on)
    chats: dict[str, list[Sequence]] = {}
    try:
        run(jobs, bar)
        for _ in range(64):  # a stream short of sequences (dropped queries): more batches
            short = {}
            for stream, n in wanted.items():
                chats[stream], read = _collect(store, stream, n)
                if len(chats[stream]) < n:
                    short[stream] = (read, n - len(chats[stream]))
            if not short:
                break
            more = [j for stream, (first, missing) in short.items()
                    for j in _chat_jobs(stream, first, -(-missing // size) + 1)]
            run(more, None)
        else:
            raise MCSDError("the target wrote too few usable queries: check its chat template")
    finally:
        bar.close()
    return chats
