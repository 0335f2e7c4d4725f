"""mcsd_runtime: a lossless multi-candidate speculative decoder with pluggable early-stop policies.

    pair = load_pair("meta-llama/Llama-2-7b-chat-hf", "JackFram/llama-68m")
    dec = MCSDDecoder(pair, DecodeConfig(k_config=(4, 2, 2, 1)), stopper="confidence:0.4")
    print(dec.generate("Hello").text)
"""

from mcsd_runtime.decoder import ARDecoder, DecodeConfig, GenerationResult, MCSDDecoder, StepTrace
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.features import FEATURE_NAMES, NODE_FEATURES, SCHEMA_VERSION, TRAJECTORY_FEATURES
from mcsd_runtime.learned import check_pair, load_stopper
from mcsd_runtime.pair import Pair, load_pair
from mcsd_runtime.stoppers import Stopper, make_stopper

__all__ = ["ARDecoder", "DecodeConfig", "FEATURE_NAMES", "GenerationResult", "MCSDDecoder",
           "MCSDError", "NODE_FEATURES", "Pair", "SCHEMA_VERSION", "StepTrace", "Stopper",
           "TRAJECTORY_FEATURES", "check_pair", "load_pair", "load_stopper", "make_stopper"]
