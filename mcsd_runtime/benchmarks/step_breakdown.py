"""Where a decode step's time goes: forwards against everything else, eager against captured,
and how far a step is from what reading the weights costs.

`mcsd step-breakdown --device cuda --shape llama2-7b` decodes AR
and static depths with a pair and reports, per step, the wall time, the target's and draft's
forward times (each forward synchronized and timed, `DecodeConfig(profile=True)`) and the rest:
the decoder's own host work. Every method runs under each `--graphs` setting (default `off,on`:
eager, then fixed-shape forwards over preallocated caches replayed as CUDA graphs,
`DecodeConfig(graphs=...)`), so the two paths sit side by side, each row saying which ran
(`path`: eager, fixed shapes without capture as on a CPU or after a failed capture, or
captured); `hf` adds the target's own `generate()` (eager, per new token). Each figure is
the median of `--rounds` runs (3) over the prompts, a run timed with CUDA events on a GPU
(`time.perf_counter` elsewhere) after a warm-up run; a step's time excludes the prompt's
prefill (the decoder's own prefill time is taken off).

Shapes (`--shape`): random-weight pairs built directly on the device in the chosen dtype
(`torch.device` as the default device, so a 7B target is never materialised on the CPU first),
so a GPU machine needs no weights; acceptance is then near zero, which does not matter here:
each step's forwards are timed against that step's wall time.
- `smollm2`: SmolLM2-135M's shape (30 layers, tied head); the draft keeps `--draft-layers`
  of its layers.
- `llama2-7b`: Llama-2-7B (vocab 32000, hidden 4096, intermediate 11008, 32 layers, 32 heads,
  32 kv heads, 4096 positions, untied), with a draft of JackFram/llama-68m's shape (hidden 768,
  intermediate 3072, 2 layers, 12 heads, untied): the seed paper's pair.
- `tiny`: a CPU-sized pair for tests.

Beside the steps the report gives:
- `bound`: the bandwidth bound. Bytes one forward reads (every weight once; an untied input
  embedding only by the rows of its tokens, so it is left out) over the device's measured copy
  bandwidth: the bytes a `--copy-mib` (1 GiB) device-to-device copy reads plus writes per
  second. `ar_over_bound` is an AR step's time over the target forward's bound.
- `launches`: the torch profiler over one run of AR and of the deepest method (when the
  profiler is available): kernel launches, stream synchronizations, device-to-host copies and
  `.item()` calls per step, and `device_busy`, the share of the run's wall time during which
  the GPU ran a kernel or copy (the union of their intervals; None on a CPU).
- `forward_probe`: one target forward over 1 new token after `--prompt-tokens` cached tokens:
  the first one after the prompt's prefill (`first`), again at that same shape (`warm`,
  median), at a new cache length each time as decode steps are (`fresh`), and on CUDA at new
  lengths with the cuDNN attention backend excluded (`fresh_no_cudnn`).

Why `mcsd profile` timed a toy target at 43 ms a forward on an H200 while a plain forward of
the same model took 1.7 ms. The profile times forwards twice: isolated forwards over one fixed
cache length (`measure`, after a warm-up round), then the decoder's own forwards in end-to-end
AR and static runs (`static_runs`), whose medians replace the isolated ones. Each decode step
attends over a cache one token longer than the last, and on that machine the decoder's masked
attention calls ran on the cuDNN backend of `scaled_dot_product_attention`
(`aten::_cudnn_attention_forward`), which builds and caches an execution graph per shape, query
and key lengths included: a cache miss costs tens of milliseconds (PyTorch measured 42-51 ms a
call on a path whose cache never hit; `TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1` is its opt-in way
around rebuilding per sequence length), and even a hit cost 0.7 ms of host time per call there,
most of the 1.7 ms of a two-layer forward. The isolated forwards repeat one shape and hit the
cache after their warm-up round; the calibration runs had warmed up on one prompt with one
depth, so nearly every forward they timed met a new key length and their median was a graph
build. That is the explanation the figures fit (it was not yet confirmed on a GPU: the forward
probe below measures it, `fresh` far above `warm` being the build and `fresh_no_cudnn` near
`warm` saying that pinning another backend removes it). The synchronization was not at fault:
`ForwardTimer` synchronizes before and after each forward, so a forward's time is its host
launches and its kernels, as the decoder pays them. The measurement is fixed in
`measure.static_runs`: on an accelerator every decoder first decodes every prompt untimed, so
that the timed runs meet shapes already built, as a long decode does after its first pass over
each length (a captured path's graph capture is such a first-use cost too); a CPU keeps its
single warm-up. The eager decoder itself still pays a build per new shape and the backend's host
cost per call until its attention backend is pinned or its shapes are fixed (captured).

`--decisions` adds each stopper's cost per decision inside the decoder on the same pair
(`decision_cost`; on a GPU it includes waiting for the draft forward the decision reads).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from mcsd_runtime.errors import MCSDError

# Llama-family shapes whose random-weight twins `shaped_pair` builds.
SHAPES = {
    "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    max_position_embeddings=8192, tie_word_embeddings=True),
    "llama2-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      max_position_embeddings=4096, tie_word_embeddings=False),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                 tie_word_embeddings=True),
}
# shapes whose draft has a shape of its own (name, config); the others draft with
# --draft-layers of their own layers
DRAFT_SHAPES = {
    "llama2-7b": ("llama-68m", dict(vocab_size=32000, hidden_size=768, intermediate_size=3072,
                                    num_hidden_layers=2, num_attention_heads=12,
                                    num_key_value_heads=12, max_position_embeddings=2048,
                                    tie_word_embeddings=False)),
}
# what launch_counts reports, per step
PROFILED = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch", "cudaStreamSynchronize",
            "cudaMemcpyAsync", "aten::_local_scalar_dense")
DEFAULT_METHODS = ("ar", "static:1", "static:2", "static:4", "static:6")
DEFAULT_GRAPHS = ("off", "on")


@dataclass
class StepRow:
    method: str
    graphs: str  # the DecodeConfig.graphs the method ran under
    steps: int
    step_ms: float  # wall time per step, unsynchronized runs: the median of the runs
    step_ms_synced: float  # the same with every forward synchronized and timed
    target_ms_per_call: float
    draft_ms_per_call: float
    forwards_ms_per_step: float  # target + draft forward time per step (synchronized run)
    other_ms_per_step: float  # step_ms_synced - forwards_ms_per_step: the decoder's host work
    step_ms_runs: list[float] | None = None  # each unsynchronized run's ms per step
    path: str | None = None  # what ran: eager, fixed (shapes, no capture) or captured
    decision_us: float | None = None  # median µs per stop decision (--decisions), None for ar
    error: str | None = None  # why the method failed under this setting (capture, memory)


class Clock:
    """Seconds of a call: CUDA events on a GPU (after a synchronize, so that only the call's own
    work falls between them), `time.perf_counter` elsewhere."""

    def __init__(self, device) -> None:
        self.cuda = torch.device(device).type == "cuda"

    @property
    def name(self) -> str:
        return "cuda-events" if self.cuda else "perf_counter"

    def time(self, fn: Callable):
        """(seconds, fn())"""
        if not self.cuda:
            t0 = time.perf_counter()
            out = fn()
            return time.perf_counter() - t0, out
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, out


def _build(config: dict, layers: int, device: str, dtype: torch.dtype, seed: int):
    """A random-weight Llama of `config` with `layers` layers, created on `device` in `dtype`
    (never materialised elsewhere first), with the decoder's default attention and no EOS."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mcsd_runtime.models.attention import register

    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**config, "num_hidden_layers": layers}, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(cfg, dtype=dtype, attn_implementation=register())
    model.requires_grad_(False)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def shaped_pair(shape: str, draft_layers: int, device: str, dtype: torch.dtype, seed: int = 0):
    """A random-weight target of `shape` and its draft (`DRAFT_SHAPES`, else the same shape with
    `draft_layers` layers), on `device` in `dtype` (eos unset, so every run decodes its full
    length)."""
    from mcsd_runtime.models.pair import Pair

    if shape not in SHAPES:
        raise MCSDError(f"unknown shape {shape!r}; use one of {', '.join(SHAPES)}")
    target = _build(SHAPES[shape], SHAPES[shape]["num_hidden_layers"], device, dtype, seed)
    if shape in DRAFT_SHAPES:
        name, config = DRAFT_SHAPES[shape]
        draft = _build(config, config["num_hidden_layers"], device, dtype, seed + 1)
    else:
        name = f"{shape}-shaped-{draft_layers}"
        draft = _build(SHAPES[shape], draft_layers, device, dtype, seed + 1)
    return Pair(target, draft, target_name=f"{shape}-shaped", draft_name=name)


def _decoder(pair, method: str, k_config: tuple[int, ...], max_new_tokens: int,
             profile: bool, graphs: str = "off"):
    from mcsd_runtime.decisions.builtin import make_stopper
    from mcsd_runtime.decode.decoder import ARDecoder, DecodeConfig, MCSDDecoder

    if method == "ar":
        return ARDecoder(pair, DecodeConfig(k_config=(), max_new_tokens=max_new_tokens,
                                            profile=profile, graphs=graphs))
    cfg = DecodeConfig(k_config=k_config, max_new_tokens=max_new_tokens, profile=profile,
                       graphs=graphs)
    return MCSDDecoder(pair, cfg, stopper=make_stopper(method, k_config))


def forward_path(dec) -> str | None:
    """How `dec`'s forwards ran: eager, fixed shapes without capture (a CPU, or after a capture
    failed), or captured as CUDA graphs (None: a decoder without `forwards`)."""
    forwards = getattr(dec, "forwards", None)
    if forwards is None:
        return None
    if not hasattr(forwards, "capture"):
        return "eager"
    return "captured" if forwards.capture else "fixed"


def _one_pass(dec, prompts: list[list[int]], clock: Clock) -> dict:
    """One run of `dec` over `prompts`: decode seconds (each generation timed by `clock`, less
    the decoder's prefill time), steps, forward seconds and calls."""
    tot = dict(wall=0.0, fwd=0.0, steps=0, t=0.0, d=0.0, tc=0, dc=0)
    for ids in prompts:
        seconds, result = clock.time(lambda ids=ids: dec.generate(ids))
        st = result.stats
        tot["wall"] += seconds - st.prefill_time
        tot["fwd"] += st.target_time + st.draft_time - st.prefill_time
        tot["steps"] += st.target_calls - 1
        tot["t"] += st.target_time
        tot["d"] += st.draft_time
        tot["tc"] += st.target_calls
        tot["dc"] += st.draft_calls
    return tot


def _median_pass(passes: list[dict]) -> dict:
    """The run whose time per step is the median of `passes`."""
    ranked = sorted(passes, key=lambda p: p["wall"] / max(p["steps"], 1))
    return ranked[(len(ranked) - 1) // 2]


def breakdown(pair, method: str, k_config: tuple[int, ...], prompts: list[list[int]],
              max_new_tokens: int, graphs: str = "off", repeats: int = 3) -> StepRow:
    """One method under `graphs` decoded over `prompts` `repeats` times plain, then `repeats`
    times with forwards synchronized and timed, each after a warm-up run (first-use costs:
    kernel choice, attention plans, graph capture); times per step exclude the prefill."""
    clock = Clock(pair.device)
    runs, paths = {}, []
    for profile in (False, True):
        dec = _decoder(pair, method, k_config, max_new_tokens, profile, graphs)
        dec.generate(prompts[0])
        runs[profile] = [_one_pass(dec, prompts, clock) for _ in range(max(repeats, 1))]
        paths.append(forward_path(dec))
    per_step = [p["wall"] / max(p["steps"], 1) * 1e3 for p in runs[False]]
    synced = _median_pass(runs[True])
    steps = max(synced["steps"], 1)
    fwd = synced["fwd"] / steps * 1e3
    return StepRow(
        method=method, graphs=graphs, steps=synced["steps"],
        step_ms=round(statistics.median(per_step), 3),
        step_ms_synced=round(synced["wall"] / steps * 1e3, 3),
        target_ms_per_call=round(synced["t"] / max(synced["tc"], 1) * 1e3, 3),
        draft_ms_per_call=round(synced["d"] / max(synced["dc"], 1) * 1e3, 3),
        forwards_ms_per_step=round(fwd, 3),
        other_ms_per_step=round(synced["wall"] / steps * 1e3 - fwd, 3),
        step_ms_runs=[round(x, 3) for x in per_step], path=paths[0])


def hf_row(pair, prompts: list[list[int]], max_new_tokens: int, repeats: int = 3) -> StepRow:
    """The target's own `generate()` (greedy, eager, its default cache): ms per new token, the
    prefill included, median of `repeats` runs over `prompts` after a warm-up."""
    clock = Clock(pair.device)

    def run_all() -> int:
        tokens = 0
        for ids in prompts:
            x = torch.tensor([ids], device=pair.device)
            out = pair.target.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                       max_new_tokens=max_new_tokens,
                                       min_new_tokens=max_new_tokens)
            tokens += out.shape[1] - x.shape[1]
        return tokens

    with torch.inference_mode():
        run_all()
        runs = [clock.time(run_all) for _ in range(max(repeats, 1))]
    per_token = [s / max(n, 1) * 1e3 for s, n in runs]
    ms = round(statistics.median(per_token), 3)
    return StepRow(method="hf", graphs="off", steps=runs[0][1], step_ms=ms, step_ms_synced=ms,
                   target_ms_per_call=ms, draft_ms_per_call=0.0, forwards_ms_per_step=ms,
                   other_ms_per_step=0.0, step_ms_runs=[round(x, 3) for x in per_token],
                   path="eager")


def _busy_share(events, wall_s: float) -> float | None:
    """The share of `wall_s` covered by the union of the device events' intervals."""
    from torch.autograd import DeviceType

    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.device_type == DeviceType.CUDA)
    if not spans or wall_s <= 0:
        return None
    covered, (lo, hi) = 0.0, spans[0]
    for start, end in spans[1:]:
        if start > hi:
            covered, lo = covered + hi - lo, start
        hi = max(hi, end)
    covered += hi - lo
    return round(min(covered / (wall_s * 1e6), 1.0), 3)


def launch_counts(pair, method: str, k_config: tuple[int, ...], prompt: list[int],
                  max_new_tokens: int, graphs: str = "off") -> dict[str, float]:
    """Per step of one run of `method`: the torch profiler's counts of `PROFILED` events, and
    the share of the run's wall time during which the device computed (`device_busy`: the union
    of its kernels' and copies' intervals; None on a CPU run)."""
    from torch.profiler import ProfilerActivity, profile

    dec = _decoder(pair, method, k_config, max_new_tokens, profile=False, graphs=graphs)
    dec.generate(prompt)
    cuda = pair.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        seconds, result = Clock(pair.device).time(lambda: dec.generate(prompt))
    steps = max(result.stats.target_calls - 1, 1)
    events = prof.key_averages()
    counts = {e.key: e.count for e in events if e.key in PROFILED}
    out = {k: round(counts.get(k, 0) / steps, 2) for k in PROFILED}
    out["device_busy"] = _busy_share(prof.events(), seconds) if cuda else None
    out["steps"] = steps
    return out


def copy_bandwidth(device, mib: int = 1024, repeats: int = 5) -> float:
    """Bytes per second a `mib` MiB device-to-device copy reads plus writes (median of
    `repeats` after a warm-up)."""
    n = mib << 20
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    clock = Clock(device)
    dst.copy_(src)
    seconds = statistics.median(clock.time(lambda: dst.copy_(src))[0]
                                for _ in range(max(repeats, 1)))
    return 2 * n / max(seconds, 1e-12)


def weight_bytes(model) -> int:
    """Bytes of weights one forward reads: every parameter once (a tied head counts once),
    less an untied input embedding, of which a forward reads only its tokens' rows."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if emb.data_ptr() != head.data_ptr():
        total -= emb.numel() * emb.element_size()
    return total


def bandwidth_bound(pair, mib: int = 1024) -> dict:
    """The forwards' bandwidth bound: weight bytes over the measured copy bandwidth."""
    bw = copy_bandwidth(pair.device, mib)
    tb, db = weight_bytes(pair.target), weight_bytes(pair.draft)
    return {"copy_mib": mib, "copy_GBps": round(bw / 1e9, 2), "target_bytes": tb,
            "draft_bytes": db, "target_forward_ms": round(tb / bw * 1e3, 4),
            "draft_forward_ms": round(db / bw * 1e3, 4)}


def _probe_forwards(model, cache, start: int, count: int, crop: bool, clock: Clock) -> list:
    """ms of `count` one-token forwards on `cache` (holding `start` tokens), with the decoder's
    4D mask and position ids; `crop`: the token is cut again after each (one shape), else the
    cache grows by one each time (a new shape each time)."""
    from mcsd_runtime.backend.compat import cache_kwargs

    out, dev, length = [], model.device, start
    dtype = next(model.parameters()).dtype
    for _ in range(count):
        ids = torch.randint(0, model.config.vocab_size, (1, 1), device=dev)
        pos = torch.full((1, 1), length, device=dev)
        mask = torch.zeros(1, 1, 1, length + 1, dtype=dtype, device=dev)
        kwargs = dict(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True,
                      **cache_kwargs(model, cache))
        seconds, _ = clock.time(lambda kwargs=kwargs: model(**kwargs))
        out.append(seconds * 1e3)
        if crop:
            cache.crop(-1)
        else:
            length += 1
    return out


def forward_probe(pair, context: int, count: int = 8, seed: int = 0) -> dict:
    """ms of one target forward over 1 new token after `context` cached tokens: the first after
    the prefill (`first`), the same shape again (`warm`), a new cache length each time
    (`fresh`), and on CUDA new lengths with the cuDNN attention backend excluded
    (`fresh_no_cudnn`); medians of `count`."""
    from transformers import DynamicCache

    from mcsd_runtime.backend.compat import cache_kwargs

    model, clock = pair.target, Clock(pair.device)
    count = max(1, min(count, (pair.max_positions - context - 2) // 2))
    gen = torch.Generator().manual_seed(seed)
    ctx = torch.randint(0, pair.vocab_size, (1, context), generator=gen).to(pair.device)
    cache = DynamicCache()
    out = {"context": context, "forwards": count}
    with torch.inference_mode():
        model(input_ids=ctx, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1)
        out["first_ms"] = round(_probe_forwards(model, cache, context, 1, True, clock)[0], 3)
        for name, crop in (("warm_ms", True), ("fresh_ms", False)):
            ms = _probe_forwards(model, cache, cache.get_seq_length(), count, crop, clock)
            out[name] = round(statistics.median(ms), 3)
        if clock.cuda:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            keep = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
            with sdpa_kernel(keep):
                ms = _probe_forwards(model, cache, cache.get_seq_length(), count, False, clock)
            out["fresh_no_cudnn_ms"] = round(statistics.median(ms), 3)
    return out


def _method_rows(pair, methods: list[str], graphs: str, k_config: tuple[int, ...],
                 ids: list[list[int]], max_new_tokens: int, repeats: int, decisions: bool,
                 seed: int, add: Callable[[StepRow], None]) -> list[StepRow]:
    """Every method of `methods` under one graphs setting, each row handed to `add` as soon as
    it is measured; a failure other than a user error (a capture that fails, memory that runs
    out) becomes the row's `error`."""
    from mcsd_runtime.benchmarks.decision_cost import decision_cost

    rows = []
    for method in methods:
        try:
            row = breakdown(pair, method, k_config, ids, max_new_tokens, graphs, repeats)
        except MCSDError:
            raise
        except (RuntimeError, NotImplementedError, ValueError) as err:
            row = StepRow(method, graphs, 0, *(None,) * 6,
                          error=f"{type(err).__name__}: {err}"[:500])
        if decisions and method != "ar" and row.error is None:
            cost = decision_cost(method, pair.vocab_size, k_config, prompts=len(ids),
                                 max_new_tokens=max_new_tokens, seed=seed, pair=pair)
            row.decision_us = round(cost.get("median_us", 0.0), 2)
        add(row)
        rows.append(row)
    return rows


def _launches(pair, methods: list[str], graphs: list[str], k_config, prompt, max_new_tokens,
              progress) -> dict:
    """`launch_counts` of AR and of the deepest other method under each graphs setting (an
    error's message where the profiler or the run fails)."""
    deepest = [m for m in methods if m not in ("ar", "hf")][-1:] or ["static:1"]
    out = {}
    for g in graphs:
        out[g] = {}
        for method in ("ar", deepest[0]):
            try:
                out[g][method] = launch_counts(pair, method, k_config, prompt, max_new_tokens,
                                               g)
            except MCSDError:
                raise
            except Exception as err:  # noqa: BLE001 - the profiler is optional here
                out[g][method] = {"error": f"{type(err).__name__}: {err}"[:500]}
            progress(f"per step of {method} (graphs {g}): {json.dumps(out[g][method])}")
    return out


def run(pair, methods: list[str], k_config: tuple[int, ...], prompt_tokens: int, prompts: int,
        max_new_tokens: int, seed: int = 0, progress=print, decisions: bool = False,
        graphs: tuple[str, ...] = DEFAULT_GRAPHS, repeats: int = 3, copy_mib: int = 1024,
        probe: bool = True, sink: Callable[[dict], None] | None = None) -> dict:
    """The breakdown of every method under every graphs setting in their order (`hf` once,
    after them: it is eager), the launch counts of AR and of the last non-AR method, the
    bandwidth bound and the forward probe, on `prompts` random prompts of `prompt_tokens`
    tokens; with `decisions`, each stopper's median cost per decision too. `sink(result)`, if
    given, sees the result so far after every row and section (to write it as it grows)."""
    gen = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, pair.vocab_size, (prompt_tokens,), generator=gen).tolist()
           for _ in range(max(prompts, 1))]
    out = {"device": str(pair.device), "dtype": str(pair.dtype).removeprefix("torch."),
           "target": pair.target_name, "draft": pair.draft_name, "timer": Clock(pair.device).name,
           "k_config": k_config.json(), "max_new_tokens": max_new_tokens,
           "prompt_tokens": prompt_tokens, "prompts": len(ids), "repeats": repeats,
           "graphs": list(graphs), "rows": []}
    save = sink or (lambda result: None)

    def add(row: StepRow) -> None:
        progress(json.dumps(asdict(row)))
        out["rows"].append(asdict(row))
        save(out)

    decoded = [m for m in methods if m != "hf"]
    for g in graphs:
        _method_rows(pair, decoded, g, k_config, ids, max_new_tokens, repeats, decisions, seed,
                     add)
    if "hf" in methods:
        add(hf_row(pair, ids, max_new_tokens, repeats))
    out["launches"] = _launches(pair, decoded, list(graphs), k_config, ids[0], max_new_tokens,
                                progress)
    save(out)
    out["bound"] = bandwidth_bound(pair, copy_mib)
    bound_ms = out["bound"]["target_forward_ms"]
    out["bound"]["ar_over_bound"] = {r["graphs"]: round(r["step_ms"] / bound_ms, 2)
                                     for r in out["rows"] if r["method"] == "ar"
                                     and r["error"] is None and bound_ms > 0}
    progress(f"bandwidth bound: {json.dumps(out['bound'])}")
    save(out)
    if probe:
        out["forward_probe"] = forward_probe(pair, prompt_tokens, seed=seed)
        progress(f"target forward probe: {json.dumps(out['forward_probe'])}")
        save(out)
    return out


def _cell(rows: list[dict], method: str, graphs: str) -> str:
    row = next((r for r in rows if r["method"] == method and r["graphs"] == graphs), None)
    if row is None:
        return "-"
    return "error" if row["error"] else f"{row['step_ms']:.3f}"


def summary(result: dict) -> str:
    """A Markdown table of the rows: each method's ms per step under each graphs setting."""
    graphs = result.get("graphs", [])
    lines = [f"| method | {' | '.join(f'graphs {g}: ms/step' for g in graphs)} |",
             "|---" * (len(graphs) + 1) + "|"]
    for m in dict.fromkeys(r["method"] for r in result["rows"]):
        lines.append(f"| {m} | {' | '.join(_cell(result['rows'], m, g) for g in graphs)} |")
    return "\n".join(lines)
