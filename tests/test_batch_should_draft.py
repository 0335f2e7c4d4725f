"""In a batch, each row's stopper decides whether to draft at all (`should_draft`) from that
row's own trajectory: the rows' steps are those of each prompt decoded alone."""

from __future__ import annotations

import pytest
from test_decoder_greedy import prompts, reference

from mcsd_runtime.decisions.builtin import StopperBase
from mcsd_runtime.decisions.features import TRAJECTORY_FEATURES
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder

TOKENS = TRAJECTORY_FEATURES.index("tokens_generated")
MAX_NEW = 20
K_CONFIG = (2, 2, 1)


def drafts_at(tokens_generated: int) -> bool:
    """The rule: draft at an even count of committed tokens, skip at an odd one."""
    return tokens_generated % 2 == 0


class EvenCount(StopperBase):
    """Drafts (to the full depth) only when the row's own count of new tokens is even."""

    def should_draft(self, start) -> bool:
        return drafts_at(int(start.trajectory()[TOKENS]))

    def should_continue(self, frontier) -> bool:
        return True


def steps_of(result) -> list[tuple[int, int, int, int]]:
    return [(s.drafted, s.accepted, s.committed, s.target_cache) for s in result.steps]


@pytest.fixture(scope="module")
def batch(pair):
    ps = prompts(pair.vocab_size, n=8, seed=7)
    dec = MCSDDecoder(pair, DecodeConfig(k_config=K_CONFIG, max_new_tokens=MAX_NEW),
                      stopper=EvenCount())
    return ps, dec, dec.generate_batch(ps, batch_size=4)


def test_each_row_drafts_or_skips_by_its_own_count(batch):
    ps, _, out = batch
    skipped = 0
    for res in out:
        before = 0  # the row's new tokens before each of its steps
        for s in res.steps:
            cap = min(len(K_CONFIG), MAX_NEW - before - 1)
            if cap > 0 and drafts_at(before):
                assert s.drafted == cap
            else:
                assert s.drafted == 0 and s.committed == 1
                skipped += cap > 0
            before += s.committed
        assert before == MAX_NEW
    assert skipped  # the rule did skip steps ...
    parities = [{sum(s.committed for s in r.steps[:j]) % 2 for r in out[:4]}
                for j in range(1, 4)]  # the first four rows start together
    assert {0, 1} in parities  # ... and rows of one batch step disagreed on it


def test_rows_equal_their_prompts_decoded_alone(pair, batch):
    ps, dec, out = batch
    for prompt, res in zip(ps, out, strict=True):
        alone = dec.generate(prompt)
        assert steps_of(res) == steps_of(alone)
        assert res.token_ids == alone.token_ids == reference(pair, prompt, MAX_NEW)
