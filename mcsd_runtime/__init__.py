"""mcsd_runtime: a lossless multi-candidate speculative decoder with pluggable early-stop policies.

    pair = load_pair("meta-llama/Llama-2-7b-chat-hf", "JackFram/llama-68m")
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(4, 2, 2, 1)), stopper="confidence:0.4")
    print(dec.generate("Hello").text)

Names are imported on first use, so that `mcsd --help` does not load torch.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time `__getattr__` imports on use
    from mcsd_runtime.decode.decoder import ARDecoder as ARDecoder
    from mcsd_runtime.decode.decoder import DecodeConfig as DecodeConfig
    from mcsd_runtime.decode.decoder import GenerationResult as GenerationResult
    from mcsd_runtime.decode.decoder import MCSDDecoder as MCSDDecoder
    from mcsd_runtime.decode.decoder import StepTrace as StepTrace
    from mcsd_runtime.errors import MCSDError as MCSDError
    from mcsd_runtime.integrations.hf import mcsd_generate as mcsd_generate
    from mcsd_runtime.models.pair import Pair as Pair
    from mcsd_runtime.models.pair import load_pair as load_pair
    from mcsd_runtime.stop.builtin import Stopper as Stopper
    from mcsd_runtime.stop.builtin import make_stopper as make_stopper
    from mcsd_runtime.stop.decision import load_decision as load_decision
    from mcsd_runtime.stop.features import FEATURE_NAMES as FEATURE_NAMES
    from mcsd_runtime.stop.features import NODE_FEATURES as NODE_FEATURES
    from mcsd_runtime.stop.features import SCHEMA_VERSION as SCHEMA_VERSION
    from mcsd_runtime.stop.features import TRAJECTORY_FEATURES as TRAJECTORY_FEATURES
    from mcsd_runtime.stop.learned import check_pair as check_pair
    from mcsd_runtime.stop.learned import load_stopper as load_stopper

_EXPORTS = {
    "ARDecoder": "decode.decoder", "DecodeConfig": "decode.decoder",
    "GenerationResult": "decode.decoder", "MCSDDecoder": "decode.decoder",
    "StepTrace": "decode.decoder", "MCSDError": "errors",
    "FEATURE_NAMES": "stop.features", "NODE_FEATURES": "stop.features",
    "SCHEMA_VERSION": "stop.features", "TRAJECTORY_FEATURES": "stop.features",
    "check_pair": "stop.learned", "load_stopper": "stop.learned",
    "Pair": "models.pair", "load_pair": "models.pair", "Stopper": "stop.builtin",
    "make_stopper": "stop.builtin", "mcsd_generate": "integrations.hf",
    "load_decision": "stop.decision",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"mcsd_runtime.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'mcsd_runtime' has no attribute {name!r}")
