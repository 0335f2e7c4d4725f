"""MCSD inside `generate(custom_generate=...)`: the target's own greedy output, its sampling
distribution, the generation config's limits, stopping criteria, streamers and user errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    StoppingCriteriaList,
    StopStringCriteria,
    TextIteratorStreamer,
)
from transformers.generation import GenerateDecoderOnlyOutput

from conftest import make_pair
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.integrations.hf import generate as mcsd_generate

K_CONFIGS = [(1, 1, 1, 1), (4, 2, 2, 1), (8,)]
STOPPERS = ["static", "heuristic", "confidence:0.3"]


def ids_of(prompt: list[int]) -> torch.Tensor:
    return torch.tensor([prompt])


def inputs(prompt: list[int]) -> dict:
    """input_ids with an explicit mask (token 0 is the micro pairs' pad token)."""
    return {"input_ids": ids_of(prompt), "attention_mask": torch.ones(1, len(prompt),
                                                                      dtype=torch.long)}


def reference(model, prompt: list[int], **kw) -> torch.Tensor:
    return model.generate(**inputs(prompt), do_sample=False, **kw)


def mcsd(pair, prompt: list[int], **kw):
    kw = {"k_config": (4, 2, 2, 1), "do_sample": False, "draft_model": pair.draft} | kw
    return pair.target.generate(**inputs(prompt), custom_generate=mcsd_generate, **kw)


def prompts(vocab: int, n: int = 6, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(torch.randint(1, 9, (1,), generator=gen)),),
                          generator=gen).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def refs(pair):
    return [(p, reference(pair.target, p, max_new_tokens=24)) for p in prompts(64)]


@pytest.mark.parametrize("k_config", K_CONFIGS)
@pytest.mark.parametrize("stopper", STOPPERS)
def test_greedy_equals_target_generate(pair, refs, k_config, stopper):
    accepted = 0
    for prompt, ref in refs:
        out = mcsd(pair, prompt, k_config=k_config, stopper=stopper, max_new_tokens=24,
                   return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref)
        accepted += out.mcsd.stats.accepted_tokens
    assert accepted > 0  # drafts were used, not just the target's own token


def test_greedy_on_the_tiny_toy_pair(toy_pair):
    """Models loaded from folders (tokenizers found and compared), float32."""
    tok = toy_pair.tokenizer
    for text in ("def main(argv):\n    ", "import os\n", "class Parser:\n"):
        enc = tok(text, return_tensors="pt")
        ref = toy_pair.target.generate(**enc, max_new_tokens=32, do_sample=False)
        for k in K_CONFIGS:
            out = toy_pair.target.generate(**enc, custom_generate=mcsd_generate,
                                           draft_model=toy_pair.draft, k_config=k,
                                           stopper="heuristic", max_new_tokens=32,
                                           do_sample=False)
            assert torch.equal(out, ref), (text, k)


@pytest.fixture(scope="module")
def lightgbm_stopper():
    """A LightGBM stopper trained on a dense collection of `small_pair` (the stored fixture,
    `tests/fixtures/make_stopper_fixtures.py`)."""
    return Path(__file__).parent / "fixtures" / "stoppers-b8df3aa" / "lightgbm"


def test_greedy_with_a_trained_stopper(lightgbm_stopper):
    from test_train_data import K_CONFIG, small_pair

    pair = small_pair()
    k_config = K_CONFIG  # the tree the stopper was trained on; another one is refused
    with pytest.raises(MCSDError, match="trained on k-config"):
        mcsd(pair, prompts(64, n=1, seed=1)[0], k_config=(1, 1, 1, 1),
             stopper=f"stopper:{lightgbm_stopper}", max_new_tokens=4)
    for prompt in prompts(64, n=4, seed=1):
        ref = reference(pair.target, prompt, max_new_tokens=24)
        out = mcsd(pair, prompt, k_config=k_config, stopper=f"stopper:{lightgbm_stopper}",
                   max_new_tokens=24, return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref)
        steps = out.mcsd.steps
        assert any(s.drafted < len(k_config) for s in steps[:-1])  # it stopped early at times


@pytest.mark.parametrize("max_new", [1, 2, 3, 5])
def test_max_new_tokens_and_max_length(pair, max_new):
    for prompt in prompts(64, n=3):
        ref = reference(pair.target, prompt, max_new_tokens=max_new)
        assert torch.equal(mcsd(pair, prompt, max_new_tokens=max_new), ref)
        by_length = mcsd(pair, prompt, max_length=len(prompt) + max_new)
        assert torch.equal(by_length, ref)


def test_eos_one_or_several(pair):
    prompt = [5, 9, 13]
    free = reference(pair.target, prompt, max_new_tokens=24)[0, 3:].tolist()
    first, second = free[4], free[9]
    cut = min(free.index(first), free.index(second)) + 1
    for eos, length in ((first, free.index(first) + 1), ([first, second], cut)):
        ref = reference(pair.target, prompt, max_new_tokens=24, eos_token_id=eos)
        out = mcsd(pair, prompt, max_new_tokens=24, eos_token_id=eos)
        assert torch.equal(out, ref) and out.shape[1] == 3 + length


def test_return_dict(pair):
    out = mcsd(pair, [1, 2, 3], max_new_tokens=10, return_dict_in_generate=True)
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, reference(pair.target, [1, 2, 3], max_new_tokens=10))
    assert out.mcsd.stats.new_tokens == 10 and out.mcsd.stats.tau >= 1


def test_stop_strings_cut_the_output_like_generate(toy_pair):
    tok = toy_pair.tokenizer
    enc = tok("import os\n", return_tensors="pt")
    stop = "\n" * 5  # the tiny pair writes newlines after this prompt
    ref = toy_pair.target.generate(**enc, max_new_tokens=40, do_sample=False, stop_strings=[stop],
                                   tokenizer=tok)
    criteria = StoppingCriteriaList([StopStringCriteria(tok, [stop])])
    out = toy_pair.target.generate(**enc, custom_generate=mcsd_generate,
                                   draft_model=toy_pair.draft, k_config=(4, 2, 2, 1),
                                   max_new_tokens=40, do_sample=False, stopping_criteria=criteria)
    assert torch.equal(out, ref)
    assert ref.shape[1] < enc.input_ids.shape[1] + 40  # the stop string did stop it
    assert tok.decode(out[0]).endswith(stop)  # with the prompt's newline (an overhang)


def test_max_time_stops_after_the_first_token(pair):
    out = mcsd(pair, [1, 2, 3], max_new_tokens=20, max_time=0.0)
    assert torch.equal(out, reference(pair.target, [1, 2, 3], max_new_tokens=1))


class Recording:
    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.view(-1).tolist())

    def end(self) -> None:
        self.ended += 1


def test_streamer_receives_prompt_then_exactly_the_output(pair):
    rec = Recording()
    prompt = [3, 1, 4, 1, 5]
    out = mcsd(pair, prompt, max_new_tokens=20, streamer=rec,
               stopping_criteria=StoppingCriteriaList([StopAfter(len(prompt) + 7)]))
    assert rec.puts[0] == prompt and rec.ended == 1
    assert sum(rec.puts[1:], []) == out[0, len(prompt):].tolist()
    assert out.shape[1] == len(prompt) + 7  # cut inside a multi-token step


class StopAfter:
    """A user criterion: stop once the sequence has `n` tokens."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, input_ids, scores, **kw) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.n, dtype=torch.bool)


def test_text_iterator_streamer(toy_pair):
    tok = toy_pair.tokenizer
    enc = tok("def main():\n    ", return_tensors="pt")
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    out = toy_pair.target.generate(**enc, custom_generate=mcsd_generate,
                                   draft_model=toy_pair.draft, k_config=(2, 1, 1),
                                   max_new_tokens=30, do_sample=False, streamer=streamer)
    assert "".join(streamer) == tok.decode(out[0, enc.input_ids.shape[1]:])


# ------------------------------------------------------------------ sampling
# 300 draws: enough to catch a sampler that ignores the temperature (1.0 for 0.7; p about 4e-10
# at these seeds) or draws from p squared (p about 3e-17; checked on these very draws in
# test_sampling_more.py); the verifiers themselves are tested with more draws in
# test_decoder_sampling.py.
VOCAB, PROMPT, N_SAMPLES, TEMPERATURE = 6, [1, 4, 2], 300, 0.7


@pytest.fixture(scope="module")
def micro():
    return make_pair(vocab=VOCAB, seed=3, noise=0.5, init_range=0.5)


def exact_joint(pair) -> torch.Tensor:
    """p(x1, x2) of the target at TEMPERATURE, by enumeration."""
    with torch.no_grad():
        first = torch.softmax(pair.target(ids_of(PROMPT)).logits[0, -1] / TEMPERATURE, -1)
        ctx = torch.tensor([PROMPT + [x] for x in range(VOCAB)])
        second = torch.softmax(pair.target(ctx).logits[:, -1] / TEMPERATURE, -1)
    return (first[:, None] * second).flatten()


def test_sampling_follows_the_target_at_its_temperature(micro):
    counts = torch.zeros(VOCAB * VOCAB)
    for seed in range(N_SAMPLES):
        torch.manual_seed(seed)
        out = mcsd(micro, PROMPT, k_config=(3, 2), do_sample=True, temperature=TEMPERATURE,
                   top_k=0, max_new_tokens=2)
        x1, x2 = out[0, len(PROMPT):].tolist()
        counts[x1 * VOCAB + x2] += 1
    expected = exact_joint(micro) * N_SAMPLES
    keep = expected >= 5  # pool the rare cells so the chi-square approximation holds
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
    assert chisquare(obs.numpy(), exp.numpy()).pvalue > 1e-3


def test_sampling_is_seeded_by_torch_manual_seed(micro):
    def draw(seed: int) -> list[int]:
        torch.manual_seed(seed)
        return mcsd(micro, PROMPT, do_sample=True, top_k=0, max_new_tokens=8)[0].tolist()

    assert draw(5) == draw(5)
    assert len({tuple(draw(s)) for s in range(8)}) > 1


# ------------------------------------------------------------------ user errors
@pytest.mark.parametrize(("kw", "message"), [
    ({"draft_model": None}, "pass the draft model"),
    ({"do_sample": True}, "top_k=0"),
    ({"do_sample": True, "top_k": 0, "top_p": 0.9}, "top_p=1.0"),
    ({"repetition_penalty": 1.3}, "RepetitionPenaltyLogitsProcessor"),
    ({"num_beams": 2}, "num_beams=1"),
    ({"stopper": "warp-drive"}, "unknown stopper 'warp-drive'"),
    ({"k_config": (0, 2)}, "k-config"),
    ({"return_dict_in_generate": True, "output_scores": True}, "output_scores"),
])
def test_bad_arguments(pair, kw, message):
    with pytest.raises(ValueError, match=message):
        mcsd(pair, [1, 2, 3], max_new_tokens=4, **kw)


def test_batches_and_padding_are_refused(pair):
    kw = {"custom_generate": mcsd_generate, "draft_model": pair.draft, "max_new_tokens": 4}
    with pytest.raises(MCSDError, match="one sequence at a time"):
        pair.target.generate(torch.tensor([[1, 2, 3], [4, 5, 6]]), **kw)
    with pytest.raises(MCSDError, match="without padding"):
        pair.target.generate(torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[0, 1, 1]]),
                             **kw)


def test_mismatched_vocabularies_are_refused(pair, toy_tiny, tmp_path):
    small = make_pair(vocab=32)
    with pytest.raises(MCSDError, match="vocabularies differ in size"):
        mcsd(pair, [1, 2, 3], draft_model=small.draft, max_new_tokens=4)
    # Same model vocabulary size, but the draft folder's tokenizer has an extra token.
    draft = AutoModelForCausalLM.from_pretrained(toy_tiny / "draft")
    tok = AutoTokenizer.from_pretrained(toy_tiny / "draft")
    tok.add_tokens(["<extra-token>"])
    draft.save_pretrained(tmp_path / "draft")
    tok.save_pretrained(tmp_path / "draft")
    target = AutoModelForCausalLM.from_pretrained(toy_tiny / "target")
    other = AutoModelForCausalLM.from_pretrained(tmp_path / "draft")
    with pytest.raises(MCSDError, match="vocabularies differ"):
        target.generate(torch.tensor([[1, 2, 3]]), custom_generate=mcsd_generate,
                        draft_model=other, max_new_tokens=4)


def test_stopper_for_another_pair_is_refused(pair, lightgbm_stopper):
    other = make_pair(max_positions=128)  # another config, so another fingerprint
    with pytest.raises(MCSDError, match="trained for the pair"):
        mcsd(other, [1, 2, 3], stopper=f"stopper:{lightgbm_stopper}", max_new_tokens=4)
