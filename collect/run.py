"""Collection jobs: the decoder over a prompt set with a `RowRecorder`, rows into a run folder.

One process (`collect_prompts`) or several through Lightning Fabric (`run_job`): ranks take
disjoint slices of the prompts still missing, each writes its own shards, and rank 0 writes the
manifest (counts, summary, timings) once every rank is done.

One lock per job (`store.run_lock`) keeps a second job off the folder: a job in one process takes
it before loading the pair; with several processes, global rank 0 takes it and tells the others.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collect import store
from collect.defaults import DEFAULT_SHARD_PROMPTS
from collect.recorder import RowRecorder
from collect.schema import ROW_SCHEMA_VERSION
from collect.store import now
from mcsd_runtime import metrics
from mcsd_runtime.cli.args import set_threads
from mcsd_runtime.decisions.features import FEATURE_NAMES, SCHEMA_VERSION
from mcsd_runtime.decode.decoder import DecodeConfig, GenerationResult, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.pair import Pair
from mcsd_runtime.prompts.chat import check_chat, encode_prompt, prompt_format
from mcsd_runtime.prompts.sets import Prompt

DEFAULT_SHARD_ROWS = 1 << 18


def prompt_seed(seed: int, prompt_id: str) -> int:
    """The decoder seed of one prompt: fixed by the run seed and the prompt id alone, so any
    rank, in any session, reproduces the same rows."""
    h = int(hashlib.sha256(prompt_id.encode()).hexdigest()[:15], 16)
    return (seed * 1_000_003 + h) % (1 << 62)


def unique_ids(prompts: Sequence[Prompt]) -> list[Prompt]:
    """Prompts with repeated ids renamed `id#2`, `id#3`... (rows are keyed by prompt id)."""
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        n = seen.get(p.id, 0) + 1
        seen[p.id] = n
        out.append(p if n == 1 else replace(p, id=f"{p.id}#{n}"))
    return out


def dense_config(config: DecodeConfig) -> DecodeConfig:
    """`--dense`: a full tree drafted and verified at every position, one token committed."""
    if config.temperature != 0:
        raise MCSDError("--dense needs greedy decoding (--temperature 0): a dense run walks the "
                        "one AR output, which only greedy decoding defines")
    if config.init != "draft":
        raise MCSDError("--dense needs --init draft: target-initialized trees are not lossless, "
                        "so their steps do not line up with the AR output")
    if not config.k_config:
        raise MCSDError("--dense needs a non-empty --k-config")
    return replace(config, commit_limit=1)


@dataclass
class CollectJob:
    """Everything a rank needs (picklable, for spawned Fabric processes)."""

    prompts: list[Prompt]
    out: str
    config: DecodeConfig
    prompt_set: str = ""
    limit: int | None = None
    dense: bool = False
    save_hidden: bool = False
    run_id: str | None = None
    shard_prompts: int = DEFAULT_SHARD_PROMPTS
    shard_rows: int = DEFAULT_SHARD_ROWS
    progress: bool = True
    threads: int | None = None
    batch_size: int = 1  # prompts decoded together (MCSDDecoder.generate_batch)
    chat: str = "auto"  # how prompts reach the model (mcsd_runtime.prompts.chat)
    # How each rank gets its pair: pair_loader(device) if given, else load_pair(**pair_args), its
    # dtype as a command's --dtype (`auto`: the device's fast one, models.device.command_dtype).
    pair_args: dict[str, Any] = field(default_factory=dict)
    pair_loader: Callable[[str], Pair] | None = None

    def __post_init__(self) -> None:
        if self.shard_prompts < 1:
            raise MCSDError("--shard-prompts must be >= 1")
        if self.batch_size < 1:
            raise MCSDError(f"--batch-size must be 1 or more, got {self.batch_size}")
        check_chat(self.chat)
        if self.run_id and "/" in self.run_id:  # training keys a sequence `run_id/prompt_id`
            raise MCSDError(f"--run-id {self.run_id!r}: a run id may not contain '/'")
        self.prompts = unique_ids(self.prompts)
        if self.save_hidden and self.config.init == "target":
            raise MCSDError("--save-hidden needs --init draft: the target-initialized first "
                            "layer is proposed by the target, so no draft hidden state "
                            "proposed it")
        if self.dense:
            self.config = dense_config(self.config)


def weights_probe(model) -> str:
    """A cheap checksum of a model's weights (the first values of its first and last few
    tensors), so that a folder retrained under the same name and config is told apart."""
    import torch

    params = list(model.state_dict().values())
    h = hashlib.sha256()
    with torch.no_grad():
        for t in params[:3] + params[-3:]:
            h.update(t.detach().reshape(-1)[:4096].to("cpu", torch.float64).numpy().tobytes())
    return h.hexdigest()[:16]


def identity(job: CollectJob, pair: Pair) -> dict[str, Any]:
    cfg = job.config
    return {
        "format": store.FORMAT,
        "pair": dict(pair.fingerprint),
        "pair_weights": {"target": weights_probe(pair.target),
                         "draft": weights_probe(pair.draft)},
        "dtype": str(pair.dtype).removeprefix("torch."),
        "k_config": cfg.k_config.json(),
        "init": cfg.init,
        "temperature": float(cfg.temperature),
        "verify": cfg.verify,
        "max_new_tokens": cfg.max_new_tokens,
        "seed": cfg.seed,
        "dense": job.dense,
        "save_hidden": job.save_hidden,
        "feature_schema_version": SCHEMA_VERSION,
        "row_schema_version": ROW_SCHEMA_VERSION,
        "feature_names": list(FEATURE_NAMES),
        "prompt_set": job.prompt_set,
        "limit": job.limit,
        "prompt_ids": [p.id for p in job.prompts],
        "prompt_format": prompt_format(job.prompts, pair.tokenizer, job.chat),
        "chat": job.chat,
    }


class _ShardWriter:
    def __init__(self, job: CollectJob, recorder: RowRecorder, rank: int) -> None:
        self.job, self.recorder, self.rank = job, recorder, rank
        self.dir = Path(job.out)
        self.tables, self.metas = [], []
        self.rows = 0
        self.written: list[str] = []

    def add(self, table, meta: dict[str, Any]) -> None:
        self.tables.append(table)
        self.metas.append(meta)
        self.rows += table.num_rows
        if len(self.metas) >= self.job.shard_prompts or self.rows >= self.job.shard_rows:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if not self.metas:
            return
        first = self.metas[0]["index"]
        name = store.shard_name(first, self.rank)
        meta = {"rank": self.rank, "written": now(),
                "prompt_indices": [m["index"] for m in self.metas],
                "prompt_ids": [m["id"] for m in self.metas], "prompts": self.metas}
        table = pa.concat_tables(self.tables) if len(self.tables) > 1 else self.tables[0]
        if table.num_rows:
            store.write_shard(self.dir / name, table, meta)
        else:
            store.write_empty_marker(self.dir / name, meta)
        self.written.append(name)
        self.tables, self.metas, self.rows = [], [], 0


# Per-prompt decoding statistics in each shard's metadata that a `Tally` sums.
SUMMED = ("rows", "steps", "new_tokens", "target_calls", "acceptance_sum", "drafting_steps",
          "seconds")


def prompt_meta(index: int, prompt_id: str, rows: int, result: GenerationResult,
                depth: int) -> dict[str, Any]:
    """One prompt's entry in its shard's metadata: its place, rows and decoding statistics."""
    st = result.stats
    hist = [0] * (depth + 1)
    for s in result.steps:
        hist[s.accepted] += 1
    return {"index": index, "id": prompt_id, "rows": rows, "steps": len(result.steps),
            "new_tokens": st.new_tokens, "target_calls": st.target_calls,
            "drafted_tokens": st.drafted_tokens, "accepted_tokens": st.accepted_tokens,
            "acceptance_sum": st.acceptance_sum, "drafting_steps": st.drafting_steps,
            "accepted_hist": hist, "seconds": st.wall_time}


@dataclass
class Tally:
    """Statistics summed over prompt metadata (`prompt_meta`): a rank's progress while it
    decodes, or a whole run's manifest counts, summary and timings."""

    depth: int
    prompts: int = 0
    rows: int = 0
    steps: int = 0
    new_tokens: int = 0
    target_calls: int = 0
    acceptance_sum: float = 0.0
    drafting_steps: int = 0
    seconds: float = 0.0
    accepted_hist: list[int] = field(init=False)  # steps by accepted length 0..depth

    def __post_init__(self) -> None:
        self.accepted_hist = [0] * (self.depth + 1)

    @classmethod
    def of(cls, metas: Iterable[dict[str, Any]], depth: int) -> Tally:
        tally = cls(depth)
        for meta in metas:
            tally.add(meta)
        return tally

    def add(self, meta: dict[str, Any]) -> None:
        self.prompts += 1
        for key in SUMMED:
            setattr(self, key, getattr(self, key) + meta[key])
        for L, n in enumerate(meta["accepted_hist"]):
            self.accepted_hist[L] += n

    def rates(self, seconds: float) -> str:
        """Tokens/s and rows/s over `seconds` of wall time (the progress line)."""
        seconds = max(seconds, 1e-9)
        return (f"{metrics.throughput(self.new_tokens, seconds):.1f} tok/s, "
                f"{metrics.throughput(self.rows, seconds):.0f} rows/s")

    def manifest_fields(self, prompts: int, shards: int, wall_seconds: float) -> dict[str, Any]:
        """The manifest's `counts`, `summary` and `timings` of a run of `prompts` prompts whose
        done ones this tally holds, in `shards` shards, over sessions of `wall_seconds`."""
        hist, rows, seconds = self.accepted_hist, self.rows, self.seconds
        return {
            "counts": {"prompts_done": self.prompts, "rows": rows, "steps": self.steps,
                       "new_tokens": self.new_tokens, "target_calls": self.target_calls,
                       "shards": shards, "prompts": prompts},
            "summary": {
                "tau": metrics.tau(self.new_tokens, self.target_calls),
                "mean_accepted": sum(L * n for L, n in enumerate(hist)) / max(self.steps, 1),
                "acceptance_rate": metrics.acceptance_rate(self.acceptance_sum,
                                                           self.drafting_steps),
                "accepted_length_histogram": {str(L): n for L, n in enumerate(hist)},
            },
            "timings": {"decode_seconds": round(seconds, 3),
                        "rows_per_decode_s": round(metrics.throughput(rows, seconds), 1),
                        "wall_seconds": round(wall_seconds, 3)},
        }


def collect_prompts(job: CollectJob, pair: Pair, rank: int = 0, world_size: int = 1,
                    barrier: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run one rank of `job` on `pair`; returns the run's manifest (rank 0) or this rank's
    counts. With `world_size == 1` this is the whole job in this process, which holds the
    folder's lock; several ranks rely on the lock their job took (see `_fabric_worker`)."""
    with store.run_lock(job.out) if world_size == 1 else nullcontext():
        return _collect(job, pair, rank, world_size, barrier or (lambda: None))


def _collect(job: CollectJob, pair: Pair, rank: int, world_size: int,
             barrier: Callable[[], None]) -> dict[str, Any]:
    t_start = time.perf_counter()
    started = now()
    run_dir = Path(job.out)
    ident = identity(job, pair)
    old = store.check_compatible(run_dir, ident)
    run_id = (old or {}).get("run_id") or job.run_id or run_dir.resolve().name
    recorder = RowRecorder(job.config.k_config, run_id, job.config.init, job.save_hidden)
    decoder = MCSDDecoder(pair, job.config, stopper="static", recorder=recorder)
    encoded = _encode_prompts(job, pair, decoder)
    barrier()
    if rank == 0:
        _start_manifest(run_dir, old, ident, run_id, started)
    barrier()
    before = store.scan_shards(run_dir)
    done = store.done_indices(before)
    barrier()  # every rank has the same view before anyone writes
    todo = [i for i in range(len(job.prompts)) if i not in done]
    mine = todo[rank::world_size]
    if not todo and rank == 0:
        print(f"all {len(job.prompts)} prompts already collected in {run_dir}; nothing to do",
              file=sys.stderr)
    tally = _decode_prompts(job, decoder, recorder, encoded, mine, rank,
                            show=job.progress and rank == 0 and bool(todo), run_id=run_id)
    barrier()
    if rank != 0:
        return {"rank": rank, "prompts": tally.prompts, "rows": tally.rows,
                "new_tokens": tally.new_tokens}
    return _finish(job, run_dir, before, started=started, t_start=t_start,
                   world_size=world_size, device=str(pair.device))


def _encode_prompts(job: CollectJob, pair: Pair, decoder: MCSDDecoder) -> list:
    """Every prompt of `job`, encoded for `decoder` (every rank checks every prompt, so all
    ranks fail alike, early); MCSDError naming the prompt that does not encode."""
    encoded = []
    for p in job.prompts:
        try:
            encoded.append(decoder.encode(encode_prompt(p, pair.tokenizer, job.chat)))
        except MCSDError as err:
            raise MCSDError(f"prompt {p.id!r}: {err}") from None
    return encoded


def _start_manifest(run_dir: Path, old: dict[str, Any] | None, ident: dict[str, Any],
                    run_id: str, started: str) -> None:
    """Rank 0, before any rank decodes: the run folder, cleaned of temporary files, with a
    `running` manifest of this session."""
    run_dir.mkdir(parents=True, exist_ok=True)
    store.clean_temp_files(run_dir)
    manifest = (old or {}) | ident | {"run_id": run_id, "status": "running",
                                      "created": (old or {}).get("created", started),
                                      "updated": started}
    manifest.setdefault("sessions", [])
    store.write_manifest(run_dir, manifest)


def _decode_prompts(job: CollectJob, decoder: MCSDDecoder, recorder: RowRecorder,
                    encoded: list, mine: list[int], rank: int, *, show: bool,
                    run_id: str) -> Tally:
    """Decode this rank's prompts (`mine`, indices into `job.prompts`), one at a time or in
    batches, writing their rows to shards (the buffered ones kept on an interrupt) with a
    progress bar when `show`; returns the tally of what was decoded."""
    from mcsd_runtime.progress import progress

    writer = _ShardWriter(job, recorder, rank)
    depth = len(job.config.k_config)
    tally = Tally(depth)
    bar = progress(total=len(mine), unit="prompt", desc=f"collect {run_id}", disable=not show,
                   file=sys.stderr)
    last = [time.perf_counter()]

    def done_prompt(k: int, res: GenerationResult) -> None:
        i = mine[k]
        table = recorder.finish(row=k if job.batch_size > 1 else 0)
        meta = prompt_meta(i, job.prompts[i].id, table.num_rows, res, depth)
        if job.batch_size > 1:  # rows overlap in time: each prompt gets the time it added
            t = time.perf_counter()
            meta["seconds"], last[0] = t - last[0], t
        writer.add(table, meta)
        tally.add(meta)
        bar.set_postfix_str(tally.rates(bar.elapsed), refresh=False)
        bar.update(1)

    try:
        if job.batch_size == 1:
            for k, i in enumerate(mine):
                recorder.begin(job.prompts[i].id, encoded[i])
                done_prompt(k, decoder.generate(encoded[i], seed=prompt_seed(job.config.seed,
                                                                           job.prompts[i].id)))
        elif mine:
            for k, i in enumerate(mine):
                recorder.begin(job.prompts[i].id, encoded[i], row=k)
            decoder.generate_batch([encoded[i] for i in mine], batch_size=job.batch_size,
                                   seeds=[prompt_seed(job.config.seed, job.prompts[i].id)
                                          for i in mine], on_result=done_prompt)
        writer.flush()
    except KeyboardInterrupt:
        writer.flush()  # the buffered prompts are whole: keep them
        raise
    finally:
        bar.close()
    return tally


def _finish(job: CollectJob, run_dir: Path, before: dict[str, dict[str, Any]], *, started: str,
            t_start: float, world_size: int, device: str) -> dict[str, Any]:
    """Rank 0, once every rank is done: the manifest with this session (what its new shards
    hold) and the counts, summary and timings of every shard, written and returned."""
    depth = len(job.config.k_config)
    after = store.scan_shards(run_dir)
    new = Tally.of(store.iter_metas({n: m for n, m in after.items() if n not in before}), depth)
    wall = time.perf_counter() - t_start
    session = {"started": started, "finished": now(), "wall_seconds": round(wall, 3),
               "world_size": world_size, "device": device, "batch_size": job.batch_size,
               "prompts": new.prompts,
               "rows": new.rows, "rows_per_s": round(metrics.throughput(new.rows, wall), 1)}
    manifest = store.read_manifest(run_dir) or {}
    sessions = [*manifest.get("sessions", []), session]
    run = Tally.of(store.iter_metas(after), depth)
    manifest.update({"status": "complete" if run.prompts == len(job.prompts) else "incomplete",
                     "updated": now(), "sessions": sessions}
                    | run.manifest_fields(len(job.prompts), len(after),
                                          sum(s["wall_seconds"] for s in sessions)))
    store.write_manifest(run_dir, manifest)
    return manifest


def format_summary(manifest: dict[str, Any]) -> str:
    c, s = manifest["counts"], manifest["summary"]
    hist = s["accepted_length_histogram"]
    total = max(sum(hist.values()), 1)
    lines = [
        f"run {manifest['run_id']}: {manifest['status']}, {c['prompts_done']}/{c['prompts']} "
        f"prompts, {c['rows']} rows in {c['shards']} shards",
        f"steps {c['steps']}, new tokens {c['new_tokens']}, target calls {c['target_calls']}",
        f"tau {s['tau']:.3f}   mean accepted length {s['mean_accepted']:.3f}   "
        f"acceptance rate {s['acceptance_rate']:.3f}",
        "accepted length histogram:",
    ]
    for L, n in hist.items():
        lines.append(f"  L={L:>2} {n:>8} {n / total:6.1%} {'#' * round(40 * n / total)}")
    if manifest.get("sessions"):
        last = manifest["sessions"][-1]
        lines.append(f"this session: {last['prompts']} prompts, {last['rows']} rows in "
                     f"{last['wall_seconds']:.1f}s ({last['rows_per_s']:.0f} rows/s, "
                     f"{last['world_size']} process(es))")
    return "\n".join(lines)


# --- processes --------------------------------------------------------------------------------


def _load_pair(job: CollectJob, device: str, say: bool = True) -> Pair:
    """This process's pair for `job`, loaded on the job's torch threads (set here, once per
    process, so that spawned Fabric workers get them too); `say`: lines while it loads (one
    rank says it)."""
    set_threads(job.threads)
    if job.pair_loader is not None:
        return job.pair_loader(device)
    from mcsd_runtime.backend.device import command_dtype
    from mcsd_runtime.models.pair import load_pair
    from mcsd_runtime.progress import working

    dtype = command_dtype(job.pair_args.get("dtype", "auto"), device)
    with working(f"loading the pair on {device}", disable=not (job.progress and say)):
        return load_pair(**(job.pair_args | {"device": device, "dtype": dtype}))


def _fabric_worker(fabric, job_bytes: bytes, shared: str | None = None) -> dict[str, Any]:
    """One rank's collection, on its Fabric device or on `shared`, the device every process
    of the job uses (`run_job(per_device=...)`)."""
    import pickle

    job: CollectJob = pickle.loads(job_bytes)
    with ExitStack() as lock:
        error = None
        if fabric.global_rank == 0:  # one lock for the job, taken before any pair is loaded
            try:
                lock.enter_context(store.run_lock(job.out))
            except MCSDError as err:
                error = str(err)
        error = fabric.broadcast(error, src=0)  # so that every rank stops alike
        if error is not None:
            return {"error": error}
        try:
            pair = _load_pair(job, shared or str(fabric.device), say=fabric.global_rank == 0)
            return collect_prompts(job, pair, fabric.global_rank, fabric.world_size,
                                   fabric.barrier)
        except MCSDError as err:  # every rank meets user errors before the first barrier
            return {"error": str(err)}


def externally_launched() -> bool:
    """True under torchrun, SLURM or `fabric run`: processes exist already, one per rank."""
    def count(key: str) -> int:
        try:
            return int(os.environ.get(key, "1"))
        except ValueError:
            return 1

    return count("WORLD_SIZE") > 1 or count("SLURM_NTASKS") > 1


def run_job(job: CollectJob, devices: int = 1, num_nodes: int = 1,
            accelerator: str = "auto", per_device: int = 1) -> dict[str, Any]:
    """Run `job` on `devices` processes per node (Lightning Fabric DDP, gloo for the barriers)
    or, with one device and one node, in this process. `per_device` > 1 runs that many
    processes on the one device the job's pair names instead (a GPU that a small model's
    forwards leave mostly idle). Returns rank 0's manifest."""
    from mcsd_runtime.backend.device import pick_device

    device = job.pair_args.get("device", "auto")
    if devices < 1 or num_nodes < 1 or per_device < 1:
        raise MCSDError("--devices, --num-nodes and --processes-per-device must be >= 1")
    shared = None
    if per_device > 1:
        if devices > 1:
            raise MCSDError("--processes-per-device shares the one device --device names: use "
                            "it without --devices (several GPUs: --devices N, one each)")
        shared = str(pick_device(device))
        devices, accelerator = per_device, "cpu"
    if devices == 1 and num_nodes == 1 and not externally_launched():
        with store.run_lock(job.out):  # before the pair loads: a second job is refused at once
            return collect_prompts(job, _load_pair(job, str(pick_device(device))))
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import DDPStrategy

    if accelerator == "auto":
        import torch

        accelerator = ("cuda" if (device == "auto" and torch.cuda.is_available())
                       or str(device).startswith("cuda") else "cpu")
    if accelerator == "cpu" and shared is None and str(device) not in ("auto", "cpu"):
        raise MCSDError(f"--devices {devices} with --device {device}: several processes use "
                        f"--device auto, cpu or cuda (one GPU per process); to share one "
                        f"device, --processes-per-device N")
    strategy = DDPStrategy(start_method="spawn", process_group_backend="gloo")
    fabric = Fabric(accelerator=accelerator, devices=devices, num_nodes=num_nodes,
                    strategy=strategy)
    import pickle

    # pickled by hand: Fabric walks launch arguments and refuses frozen dataclasses
    result = fabric.launch(_fabric_worker, pickle.dumps(job), shared)
    if isinstance(result, dict) and "error" in result:
        raise MCSDError(result["error"])
    return result
