"""Methods that draft nothing load no draft: `mcsd eval --methods ar` on a pair whose distilled
draft is not built decodes with the target alone instead of distilling one first."""

from __future__ import annotations

import pytest

from mcsd_runtime.evaluate.methods import needs_draft
from mcsd_runtime.models.pair import NO_DRAFT, load_target


@pytest.mark.parametrize(("methods", "needed"), [
    (["ar"], False), (["ar", "hf", "hf-static:eager", "lookup:8:3", "lookup"], False),
    (["ar", "static:2"], True), (["lookup:8:3+static:1"], True), (["stopper:x"], True),
    (["mcsd:4,2"], True), (["hf-assisted"], True),
])
def test_which_methods_need_a_draft(methods, needed):
    assert needs_draft(methods) is needed


def test_the_target_alone_stands_in_for_its_draft(toy_tiny):
    pair = load_target(str(toy_tiny / "target"), device="cpu", dtype="float32")
    assert pair.draft is pair.target and pair.draft_name == NO_DRAFT
    assert pair.tokenizer is not None and pair.vocab_size == pair.target.config.vocab_size
