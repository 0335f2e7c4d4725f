"""mcsd_runtime: a lossless multi-candidate speculative decoder with pluggable early-stop policies.

    pair = load_pair("meta-llama/Llama-2-7b-chat-hf", "JackFram/llama-68m")
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(4, 2, 2, 1)), stopper="confidence:0.4")
    print(dec.generate("Hello").text)

Names are imported on first use, so that `mcsd --help` does not load torch.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time `__getattr__` imports on use
    from mcsd_runtime.decisions.builtin import Stopper as Stopper
    from mcsd_runtime.decisions.builtin import make_stopper as make_stopper
    from mcsd_runtime.decisions.features import FEATURE_NAMES as FEATURE_NAMES
    from mcsd_runtime.decisions.features import NODE_FEATURES as NODE_FEATURES
    from mcsd_runtime.decisions.features import SCHEMA_VERSION as SCHEMA_VERSION
    from mcsd_runtime.decisions.features import TRAJECTORY_FEATURES as TRAJECTORY_FEATURES
    from mcsd_runtime.decisions.learned import check_pair as check_pair
    from mcsd_runtime.decisions.learned import load_stopper as load_stopper
    from mcsd_runtime.decisions.manifest import load_decision as load_decision
    from mcsd_runtime.decode.decoder import ARDecoder as ARDecoder
    from mcsd_runtime.decode.decoder import DecodeConfig as DecodeConfig
    from mcsd_runtime.decode.decoder import GenerationResult as GenerationResult
    from mcsd_runtime.decode.decoder import MCSDDecoder as MCSDDecoder
    from mcsd_runtime.decode.decoder import StepTrace as StepTrace
    from mcsd_runtime.errors import MCSDError as MCSDError
    from mcsd_runtime.integrations.hf import mcsd_generate as mcsd_generate
    from mcsd_runtime.models.pair import Pair as Pair
    from mcsd_runtime.models.pair import load_pair as load_pair

_EXPORTS = {
    "ARDecoder": "decode.decoder", "DecodeConfig": "decode.decoder",
    "GenerationResult": "decode.decoder", "MCSDDecoder": "decode.decoder",
    "StepTrace": "decode.decoder", "MCSDError": "errors",
    "FEATURE_NAMES": "decisions.features", "NODE_FEATURES": "decisions.features",
    "SCHEMA_VERSION": "decisions.features", "TRAJECTORY_FEATURES": "decisions.features",
    "check_pair": "decisions.learned", "load_stopper": "decisions.learned",
    "Pair": "models.pair", "load_pair": "models.pair", "Stopper": "decisions.builtin",
    "make_stopper": "decisions.builtin", "mcsd_generate": "integrations.hf",
    "load_decision": "decisions.manifest",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"mcsd_runtime.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'mcsd_runtime' has no attribute {name!r}")
