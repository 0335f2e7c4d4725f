"""Recipes of drafts distilled from any target (torch-free).

A recipe fixes everything that determines a draft given its target: which target layers it
keeps, the self-generated data (how many conversations, how long, plus how much plain text),
the reduced-vocabulary head and the training. A built draft is cached by a hash of its recipe,
the target's fingerprint (config, tokenizer, weights) and the code version; its data by a hash
of the fields that shape a generated batch (DATA_FIELDS), so drafts of several recipes share
one generation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace

from mcsd_runtime.errors import MCSDError

# Bump when a code change alters what a recipe builds (DATA_CODE_VERSION: what it generates).
DISTILL_CODE_VERSION = 1
DATA_CODE_VERSION = 1
PRECISIONS = ("auto", "32-true", "bf16-mixed")
# The fields that determine what a generated batch holds: the data folder's key. How many
# batches a recipe reads (conversations, text tokens, prompt limit, seq_len) names its
# streams instead, so a recipe asking for fewer conversations reads a prefix of a larger
# generation and one asking for more generates only the missing batches. The answered prompts
# (`prompts`) name their own stream by their content, so recipes that differ only in prompts
# share the conversations.
DATA_FIELDS = ("query_tokens", "answer_tokens", "query_temperature", "gen_batch", "top_k",
               "seed")


@dataclass(frozen=True)
class DistillRecipe:
    """A draft distilled from a target.

    Draft: the target's embeddings, final norm and `layers` of its layers evenly spaced from
    the first to the last, or exactly `layer_ids`; `vocab` > 0 gives it a head over only the
    `vocab` tokens most frequent in the training data (plus the special tokens), 0 the target's
    full head.
    Data: `conversations` self-generated conversations (a query the target writes when given
    its chat template's user prefix, sampled at `query_temperature` up to `query_tokens`
    tokens, then its greedy answer up to `answer_tokens`; `gen_batch` rows per `generate`),
    plus the instructions of the prompt set `prompts` (at most `prompt_limit`) answered the
    same way, plus `text_tokens` of plain text (stdlib sources); `heldout_*` more of each,
    never trained on, for the card. The target's `top_k` largest log-probabilities are stored
    at every trained position: the training never runs the target.
    Training: `steps` AdamW steps of `batch_size` packed rows of `seq_len` tokens, learning
    rate `lr` (warmup then cosine), loss = cross-entropy to the target's top-k distribution
    plus `ce_weight` times the cross-entropy of the target's greedy token. The embeddings
    (and a full head tied to them) stay the target's unless `train_embeddings`; a reduced
    head always trains.
    Features: with `features`, the draft also reads the target's final state one position
    back through an input projection (`distill.feature`), trained as `distill.feature_train`
    says; the decoder hands it those states.
    """

    name: str
    layers: int
    layer_ids: tuple[int, ...] = ()
    vocab: int = 0
    conversations: int = 0
    heldout_conversations: int = 0
    query_tokens: int = 48
    answer_tokens: int = 160
    query_temperature: float = 1.0
    gen_batch: int = 32
    prompts: str = ""
    prompt_limit: int = 0
    text_tokens: int = 0
    heldout_text_tokens: int = 0
    top_k: int = 32
    steps: int = 100
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    warmup_frac: float = 0.05
    ce_weight: float = 0.2
    train_embeddings: bool = False
    features: bool = False
    seed: int = 0
    precision: str = "auto"

    def __post_init__(self) -> None:
        ints = {"layers": 1, "vocab": 0, "conversations": 0, "heldout_conversations": 0,
                "query_tokens": 1, "answer_tokens": 1, "gen_batch": 1, "prompt_limit": 0,
                "text_tokens": 0, "heldout_text_tokens": 0, "top_k": 1, "steps": 0,
                "batch_size": 1, "seq_len": 8}
        for key, low in ints.items():
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise MCSDError(f"recipe field {key} must be an integer >= {low}, got {value!r}")
        if self.layer_ids and len(self.layer_ids) != self.layers:
            raise MCSDError(f"layer_ids {list(self.layer_ids)} name {len(self.layer_ids)} "
                            f"layers, but layers is {self.layers}")
        if not (0 <= self.lr < 1 and self.ce_weight >= 0 and 0 <= self.warmup_frac < 1):
            raise MCSDError("recipe: lr must lie in [0, 1), ce_weight >= 0, warmup_frac in "
                            "[0, 1)")
        if self.query_temperature <= 0:
            raise MCSDError("recipe: query_temperature must be > 0")
        if self.precision not in PRECISIONS:
            raise MCSDError(f"recipe precision must be one of {', '.join(PRECISIONS)}, got "
                            f"{self.precision!r}")

    def resolved(self) -> DistillRecipe:
        """The recipe with `precision` fixed for this machine: bf16 autocast only where the CPU
        has native bf16 kernels (elsewhere bf16 is several times slower for multi-token work)."""
        if self.precision != "auto":
            return self
        from mcsd_runtime.toy.recipe import _cpu_bf16_ok

        return replace(self, precision="bf16-mixed" if _cpu_bf16_ok() else "32-true")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layer_ids"] = list(self.layer_ids)
        return d

    def data_dict(self) -> dict:
        return {k: getattr(self, k) for k in DATA_FIELDS}

    def hash12(self, target_fingerprint: dict) -> str:
        """A hash of the recipe (resolved), the target's fingerprint and the code version."""
        recipe = self.resolved().to_dict()
        if not recipe["features"]:  # drafts built before the field existed keep their hash
            del recipe["features"]
        return _hash({"recipe": recipe, "target": target_fingerprint,
                      "code": DISTILL_CODE_VERSION, "data_code": DATA_CODE_VERSION})

    def data_hash12(self, target_fingerprint: dict) -> str:
        """A hash of what determines the generated data and the target's fingerprint."""
        # `prompts` is not a data field, but stays in the key as "": existing folders keep theirs
        data = {**self.data_dict(), "prompts": ""}
        return _hash({"data": data, "target": target_fingerprint,
                      "data_code": DATA_CODE_VERSION})


def _hash(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()[:12]


PRESETS: dict[str, DistillRecipe] = {
    # For SmolLM2-sized targets (~135M parameters, 30 layers) on a 2-core CPU: builds in
    # about 25 minutes with 2 torch threads, data generation included.
    "default": DistillRecipe(
        name="default", layers=4, vocab=8192, conversations=512, heldout_conversations=64,
        query_tokens=40, answer_tokens=128, gen_batch=32, text_tokens=16_384,
        heldout_text_tokens=4_096, top_k=32, steps=360, batch_size=8, seq_len=256, lr=1e-3,
        warmup_frac=0.05, ce_weight=0.2),
    # A feature draft (one layer, the target's last, reading the target's states) on three
    # times the conversations: about an hour on a 2-core CPU, most of it generation. For
    # SmolLM2 it agrees with the target more than `default` does at half the cost (README).
    "features": DistillRecipe(
        name="features", layers=1, layer_ids=(-1,), features=True, vocab=8192,
        conversations=1536, heldout_conversations=64, query_tokens=40, answer_tokens=128,
        gen_batch=32, text_tokens=16_384, heldout_text_tokens=4_096, top_k=32, steps=720,
        batch_size=8, seq_len=256, lr=3e-3, warmup_frac=0.05, ce_weight=0.2),
    # For tests: seconds on a tiny target.
    "tiny": DistillRecipe(
        name="tiny", layers=1, vocab=0, conversations=8, heldout_conversations=4,
        query_tokens=8, answer_tokens=12, gen_batch=4, text_tokens=2_000,
        heldout_text_tokens=500, top_k=8, steps=12, batch_size=4, seq_len=64, lr=3e-3,
        warmup_frac=0.1, ce_weight=0.2),
}


def get_recipe(name: str = "default", **overrides: object) -> DistillRecipe:
    """The preset `name` with field overrides (None values are ignored)."""
    if name not in PRESETS:
        raise MCSDError(f"unknown distillation recipe {name!r}; use one of "
                        f"{', '.join(PRESETS)}")
    known = {f.name for f in fields(DistillRecipe)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise MCSDError(f"unknown recipe field(s) {', '.join(bad)}; fields: "
                        f"{', '.join(sorted(known))}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    if "layer_ids" in changes:
        changes["layer_ids"] = tuple(changes["layer_ids"])
        changes.setdefault("layers", len(changes["layer_ids"]))
    elif "layers" in changes:
        changes["layer_ids"] = ()
    return replace(PRESETS[name], **changes)
