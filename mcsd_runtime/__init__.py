"""mcsd_runtime: a lossless multi-candidate speculative decoder with pluggable early-stop policies.

    pair = load_pair("meta-llama/Llama-2-7b-chat-hf", "JackFram/llama-68m")
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(4, 2, 2, 1)), stopper="confidence:0.4")
    print(dec.generate("Hello").text)

Names are imported on first use, so that `mcsd --help` does not load torch.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "ARDecoder": "decoder", "DecodeConfig": "decoder", "GenerationResult": "decoder",
    "MCSDDecoder": "decoder", "StepTrace": "decoder", "MCSDError": "errors",
    "FEATURE_NAMES": "features", "NODE_FEATURES": "features", "SCHEMA_VERSION": "features",
    "TRAJECTORY_FEATURES": "features", "check_pair": "learned", "load_stopper": "learned",
    "Pair": "pair", "load_pair": "pair", "Stopper": "stoppers", "make_stopper": "stoppers",
    "mcsd_generate": "hf",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"mcsd_runtime.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'mcsd_runtime' has no attribute {name!r}")
