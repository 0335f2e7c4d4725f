"""Bad input: a ValueError (MCSDError) whose message says what to change."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from conftest import make_pair, tiny_llama
from mcsd_runtime import MCSDError
from mcsd_runtime.decisions.builtin import make_stopper
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
from mcsd_runtime.models.pair import Pair, check_same_vocab


def test_mismatched_model_vocab():
    with pytest.raises(ValueError, match="vocabularies differ in size"):
        Pair(tiny_llama(64, 1, 32, 0), tiny_llama(65, 1, 32, 0))


def _tok(vocab: dict[str, int], eos: str = "b") -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="a"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="a", eos_token=eos)


def test_mismatched_tokenizers():
    with pytest.raises(ValueError, match="differ in size"):
        check_same_vocab(_tok({"a": 0, "b": 1}), _tok({"a": 0, "b": 1, "c": 2}))
    with pytest.raises(ValueError, match="token-to-id map"):
        check_same_vocab(_tok({"a": 0, "b": 1}), _tok({"a": 1, "b": 0}))
    with pytest.raises(ValueError, match="eos_token_id"):
        check_same_vocab(_tok({"a": 0, "b": 1}), _tok({"a": 0, "b": 1}, eos="a"))


def test_empty_prompt(pair):
    with pytest.raises(ValueError, match="empty prompt"):
        MCSDDecoder(pair, DecodeConfig()).generate([])


def test_prompt_beyond_positions():
    small = make_pair(max_positions=32)
    with pytest.raises(ValueError, match="beyond the models' 32 positions"):
        MCSDDecoder(small, DecodeConfig(max_new_tokens=30)).generate([1, 2, 3])


@pytest.mark.parametrize("k_config", ["4,x", (0, 2), (4, -1), "2.5"])
def test_bad_k_config(k_config):
    with pytest.raises(ValueError, match="k-config"):
        DecodeConfig(k_config=k_config)


def test_too_many_candidates(pair):
    with pytest.raises(ValueError, match="more candidates than the vocabulary"):
        MCSDDecoder(pair, DecodeConfig(k_config=(100,)))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"temperature": -0.5}, "temperature must be >= 0"),
    ({"verify": "magic"}, "unknown verifier"),
    ({"init": "oracle"}, "unknown init"),
    ({"max_new_tokens": 0}, "max_new_tokens must be a positive"),
    ({"init": "target", "k_config": ()}, "needs a non-empty k-config"),
])
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecodeConfig(**kwargs)


@pytest.mark.parametrize("spec", ["sometimes", "confidence:x", "static:1:2", "/no/such/dir"])
def test_unknown_stopper_spec(spec):
    with pytest.raises(MCSDError, match="stopper"):
        make_stopper(spec)


def test_missing_model_folder():
    from mcsd_runtime.models.pair import load_pair

    with pytest.raises(MCSDError, match="no model folder at /no/such/model"):
        load_pair("/no/such/model", "/no/such/draft")


def test_an_object_without_the_stopper_contract_is_refused(pair):
    """A stopper object must have every `Stopper` member; the error names what is missing."""

    class Partial:
        def should_continue(self, frontier) -> bool:
            return True

    with pytest.raises(MCSDError, match="lacks reset, should_draft, update, check_tree, "
                                        "needs_hidden.*StopperBase"):
        MCSDDecoder(pair, DecodeConfig(k_config=(2, 1)), stopper=Partial())


def test_config_fingerprint_ignores_how_a_model_was_saved_not_what_it_computes():
    """A pair keeps its fingerprint across transformers versions, folders and dtypes (a stopper
    collected under one version loads under another); an architecture change alters it."""
    from mcsd_runtime.backend.fingerprint import config_hash

    model = tiny_llama(64, 2, 32, seed=0)
    before = config_hash(model)
    model.config.transformers_version = "0.0.1"
    model.config._name_or_path = "/somewhere/else"
    model.config.use_cache = False
    assert config_hash(model) == before
    model.config.num_hidden_layers = 3
    assert config_hash(model) != before
