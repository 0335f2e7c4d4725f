"""A model's and a tokenizer's fingerprints: short hashes of what they compute and how they
split text, stable across folders, dtypes and transformers versions."""

from __future__ import annotations

import hashlib
import json

from transformers import PreTrainedModel


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tokenizer_hash(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    specials = {k: getattr(tokenizer, k, None) for k in ("bos_token_id", "eos_token_id")}
    return _sha(json.dumps([vocab, specials]))


# Config fields that say how a model was saved or is run, not what it computes: the
# fingerprint leaves them out, so a pair keeps its fingerprint across transformers versions,
# folders and dtypes.
VOLATILE_CONFIG = frozenset({"transformers_version", "_name_or_path", "dtype", "torch_dtype",
                             "use_cache", "output_attentions", "output_hidden_states",
                             "return_dict"})


def config_hash(model: PreTrainedModel) -> str:
    config = json.loads(model.config.to_json_string(use_diff=False))
    return _sha(json.dumps({k: v for k, v in config.items() if k not in VOLATILE_CONFIG},
                           sort_keys=True))
