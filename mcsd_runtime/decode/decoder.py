"""The multi-candidate speculative decoder's public face: `MCSDDecoder.generate` decodes one
prompt, `generate_batch` many, both through the one step engine (`mcsd_runtime.decode.engine`):
draft a tree depth by depth (asking the stopper after each depth), verify it with one target
forward, commit the accepted path, cut both caches.

`init="target"` (the paper's target-initialized candidates) is NOT lossless: the first layer of
the tree is the target's own top candidates and the root with the longest accepted continuation
wins, which can differ from the target's choice. Results carry `lossless=False`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import cast

import torch

from mcsd_runtime.decisions.builtin import Planner, Stopper, make_decision, make_stopper
from mcsd_runtime.decisions.copy_length import CopyLength
from mcsd_runtime.decisions.width import WidthPolicy
from mcsd_runtime.decode.engine import BatchResult, CommitHook, Engine
from mcsd_runtime.decode.graphs import make_forwards
from mcsd_runtime.decode.records import (
    DecodeConfig,
    DecodeStats,
    GenerationResult,
    Recorder,
    StepRecord,
    StepTrace,
    causal_bias,
)
from mcsd_runtime.decode.step_state import DraftFrontier, DraftLayer
from mcsd_runtime.decode.target_init import TargetInitEngine
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.pair import Pair
from mcsd_runtime.prompts.chat import encode_messages, is_messages
from mcsd_runtime.tree import KConfig, Tree, TreeTensors

# What `generate` decodes: a text, token ids, or chat messages ([{"role": ..., "content": ...}]).
PromptInput = str | Sequence[int] | Sequence[Mapping[str, str]]

__all__ = ["ARDecoder", "BatchResult", "DecodeConfig", "DecodeStats", "DraftFrontier", "DraftLayer",
           "GenerationResult", "MCSDDecoder", "Recorder", "StepRecord", "StepTrace",
           "causal_bias"]


class MCSDDecoder:
    """Greedy or sampled multi-candidate speculative decoding of one sequence or a batch."""

    def __init__(self, pair: Pair, config: DecodeConfig | None = None,
                 stopper: Stopper | str | None = None, recorder: Recorder | None = None,
                 copy_length: CopyLength | None = None, width: WidthPolicy | None = None,
                 planner: Planner | str | None = None) -> None:
        """`stopper`: each row's early-stop policy (a `Stopper` or a spec such as `static:4`;
        default: the whole tree). `planner`: instead of stoppers, one decision that plans every
        row's step across the batch (a verification budget, `Planner`, or its spec such as
        `survival:1@PROFILE`). `copy_length`: a learned prompt-lookup copy length
        (`mcsd_runtime.decisions.copy_length`) choosing how much of each match to verify; needs
        `config.lookup` at least its `max_copy`. `width`: a learned width
        (`mcsd_runtime.decisions.width`) choosing how many of the first depth's candidates a step
        drafted to depth 1 verifies; needs the tree's first depth to draft its k."""
        self.pair = pair
        self.config = config or DecodeConfig()
        self.stopper = make_stopper(stopper, self.config.k_config)
        self.planner = None if planner is None else _planner(planner, self.config.k_config)
        if self.planner is not None and stopper is not None:
            raise MCSDError("give a decoder a stopper or a planner, not both: a planner decides "
                            "every row's step itself")
        self.recorder = recorder
        self.tree = Tree(self.config.k_config)
        self.tt = TreeTensors.build(self.tree, pair.device, pair.dtype)
        # the tree a copied chain is verified on when the draft's first depths are not a chain
        self.chain, k = None, self.config.lookup
        if k and self.tree.sizes[:k] != (1,) * k:
            self.chain = TreeTensors.build(Tree(KConfig((1,) * k)), pair.device, pair.dtype)
        if self.tree.depth and max(self.config.k_config) > pair.vocab_size:
            raise MCSDError(f"k-config {self.config.k_config} asks for more candidates than the "
                            f"vocabulary has ({pair.vocab_size})")
        if self.config.lookup and recorder is not None:
            raise MCSDError("a recorder logs drafted trees, and prompt lookup drafts none: "
                            "collect with lookup off")
        self.copy_length = copy_length
        if copy_length is not None and self.config.lookup < copy_length.max_copy:
            raise MCSDError(f"a learned copy length copies up to {copy_length.max_copy} tokens: "
                            f"decode with lookup >= {copy_length.max_copy} (got "
                            f"{self.config.lookup})")
        self.width, self.widths = width, {}
        if width is not None:
            if self.config.init != "draft" or not self.tree.depth or (
                    self.config.k_config[0] != width.k):
                raise MCSDError(f"a learned width chooses among the {width.k} candidates of a "
                                f"tree's first depth: decode with init='draft' on a k-config "
                                f"whose first depth drafts {width.k} (got "
                                f"{self.config.k_config}, init={self.config.init!r})")
            self.widths = {w: TreeTensors.build(Tree(KConfig((w,))), pair.device, pair.dtype)
                           for w in range(1, width.k)}
        decides = self.planner if self.planner is not None else self.stopper
        self.needs_hidden = decides.needs_hidden or (recorder is not None
                                                     and recorder.needs_hidden)
        self._causal = causal_bias(max(self.tree.num_nodes + 1, 8), pair.dtype, pair.device)
        self.sync_forwards = pair.device.type != "cpu" and self.config.profile
        self.forwards = make_forwards(self.config.graphs, pair.device)
        eos = self.config.eos_token_ids
        self.eos = set(pair.eos_token_ids if eos is None else eos)

    # ----------------------------------------------------------------- public API
    def encode(self, prompt: PromptInput) -> list[int]:
        """Token ids of a prompt, checked: a text as the tokenizer encodes it (its BOS where it
        adds one), token ids as given, or chat messages (`[{"role": "user", "content": ...}]`)
        in the tokenizer's chat template with the assistant's turn opened
        (`mcsd_runtime.prompts.chat.encode_messages`: no second BOS)."""
        if isinstance(prompt, str):
            if self.pair.tokenizer is None:
                raise MCSDError("this pair has no tokenizer: pass the prompt as token ids")
            ids = self.pair.tokenizer(prompt)["input_ids"]
        elif is_messages(prompt):
            if self.pair.tokenizer is None:
                raise MCSDError("this pair has no tokenizer: pass the prompt as token ids")
            ids = encode_messages(prompt, self.pair.tokenizer)
        else:  # not chat messages: token ids
            ids = [int(i) for i in cast("Sequence[int]", prompt)]
        if not ids:
            raise MCSDError("empty prompt: pass at least one token")
        if any(i < 0 or i >= self.pair.vocab_size for i in ids):
            raise MCSDError(f"prompt token ids must lie in [0, {self.pair.vocab_size})")
        need = len(ids) + self.config.max_new_tokens
        if need > self.pair.max_positions:
            raise MCSDError(
                f"prompt ({len(ids)} tokens) plus max_new_tokens ({self.config.max_new_tokens}) "
                f"is {need}, beyond the models' {self.pair.max_positions} positions; shorten the "
                f"prompt or lower max_new_tokens")
        return ids

    @torch.inference_mode()
    def generate(self, prompt: PromptInput, seed: int | None = None,
                 on_commit: CommitHook | None = None) -> GenerationResult:
        """Decode one prompt (a batch of one): a text, token ids or chat messages (`encode`).
        `on_commit(tokens)`, if given, sees each step's committed tokens; returning a count
        keeps only that many of them and ends the generation (stopping criteria, streaming)."""
        ids = self.encode(prompt)
        seed = self.config.seed if seed is None else seed
        return self.engine(1, on_commit).run([ids], [seed]).results[0]

    @torch.inference_mode()
    def generate_batch(self, prompts: Sequence[PromptInput], batch_size: int = 8,
                       seeds: Sequence[int] | None = None,
                       on_result: Callable[[int, GenerationResult], None] | None = None,
                       ) -> BatchResult:
        """Decode many prompts (each a text, token ids or chat messages: `encode`), up to
        `batch_size` of them per forward: one `GenerationResult` per prompt, in order, plus the
        batch's statistics. Greedy rows equal `generate` of the same prompt. Sampled rows draw
        with their own generator (`seeds[i]`, default the config's seed) and follow the target's
        distribution; they equal `generate` with the same seed where their trees do (row mode,
        or a static stopper; see `mcsd_runtime.decode.engine`). `on_result(i, result)`, if
        given, sees each prompt's result as soon as its row finishes (streaming, progress).
        Recorders see each step's trace with `trace.row = i`. `batch_size=1` decodes one prompt
        after the other."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise MCSDError(f"batch_size must be a positive integer, got {batch_size!r}")
        ids = [self.encode(p) for p in prompts]
        if not ids:
            raise MCSDError("no prompts to decode")
        seeds = [self.config.seed] * len(ids) if seeds is None else [int(s) for s in seeds]
        if len(seeds) != len(ids):
            raise MCSDError(f"{len(seeds)} seeds for {len(ids)} prompts: give one per prompt")
        return self.engine(batch_size).run(ids, seeds, on_result)

    def engine(self, batch_size: int, on_commit: CommitHook | None = None) -> Engine:
        """The step engine of one `generate` / `generate_batch` call: the lossless one, or
        target-initialized candidates' own (`init="target"`)."""
        cls = TargetInitEngine if self.config.init == "target" else Engine
        return cls(self, batch_size, on_commit)

    # ----------------------------------------------------------------- shared by the engine
    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The sampling distribution of logits: softmax at the config's temperature (1 when
        greedy), in float32."""
        t = self.config.temperature or 1.0
        return torch.softmax(logits.float() / t, dim=-1)

    def causal_block(self, n: int) -> torch.Tensor:
        """Additive [n, n] causal mask (a view of a prebuilt one when n is small)."""
        if n <= self._causal.shape[0]:
            return self._causal[:n, :n]
        return causal_bias(n, self.pair.dtype, self.pair.device)  # a long prompt's prefill


def _planner(spec: Planner | str, k_config: tuple[int, ...]) -> Planner:
    """The planner a spec names (checked against the tree); a stopper's spec is refused."""
    planner = make_decision(spec, k_config)
    if not isinstance(planner, Planner):
        raise MCSDError(f"{spec!r} is a stopper, which decides each row's depth: give it as "
                        f"stopper=..., not as the planner")
    return planner


class ARDecoder(MCSDDecoder):
    """Autoregressive decoding of the target alone, through the same loop and statistics."""

    def __init__(self, pair: Pair, config: DecodeConfig | None = None) -> None:
        config = config or DecodeConfig()
        super().__init__(pair, replace(config, k_config=KConfig(()), init="draft"))
