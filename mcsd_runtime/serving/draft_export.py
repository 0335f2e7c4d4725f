"""A distilled draft as a model vLLM's `draft_model` speculation loads.

A distilled draft (`mcsd_runtime.distill`) keeps the target's full vocabulary in its embedding
but scores only N kept tokens (`draft_vocab.safetensors`, `distill.head`): our decoder gives
every other token the lowest finite logit, so it is never drafted. vLLM knows nothing of that
file, and LlamaForCausalLM has no output bias to mask with. `export_for_vllm` writes the draft
with an untied full-vocabulary `lm_head.weight` (`tie_word_embeddings: false`) whose kept rows
are the reduced head's and whose other rows are zero, the tokenizer and template files beside.

What the zero rows mean: a token outside the kept set gets logit exactly 0, so it can win the
draft's argmax only where every kept logit is <= 0, and at temperature 1 the non-kept tokens
share probability (V - N)/Z instead of 0. `head_agreement` measures both on real text
(`measure_export()`: held-out prompts and the draft's own greedy continuations). On the
SmolLM2-135M-Instruct draft (default recipe, 8192 of 49152 tokens kept), over 16
`inst-mix-eval` prompts with 32 continued tokens each (2485 positions), the export's argmax
differs from the reduced-head draft's at 3 positions (0.12%, each where every kept logit is
negative), while at T=1 the 40960 zero logits take 14% of the probability mass on average (at
one position 99.999%): this draft's logits are small. vLLM drafts the argmax by default
(`draft_sample_method="greedy"`), so there only the 0.12% counts; its `probabilistic` drafting
would propose a non-kept token, one the target seldom writes, at about one position in seven.
Whatever the draft proposes, vLLM's verification keeps outputs exact: only acceptance is at
stake.

An export is cached: `export.json`, written last, records the source's fingerprint (a SHA-256
over every file of the source folder), and an export whose fingerprint matches is reused. It is
written into a temporary sibling and renamed into place, so an interrupted export leaves no
folder that looks complete. A draft without a reduced head is its own export.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch

from mcsd_runtime.distill.feature import FC_FILE
from mcsd_runtime.distill.head import HEAD_FILE, ReducedHead, load_reduced_head
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.paths import build_folder, file_sha256, models_dir

CARD = "export.json"
CARD_FORMAT = "mcsd-vllm-draft"
VERSION = 1  # in the fingerprint: a change of the export's layout re-exports every draft
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
REWRITTEN = {CONFIG, WEIGHTS, HEAD_FILE, CARD}  # what an export writes rather than copies
REMEDY = "choose a writable folder (or set MCSD_CACHE)"


def source_fingerprint(folder: Path) -> str:
    """A SHA-256 over the names and contents of every file in `folder` (and VERSION)."""
    h = hashlib.sha256(f"{CARD_FORMAT}/{VERSION}".encode())
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(f"\n{path.name}:{file_sha256(path)}".encode())
    return h.hexdigest()


def default_export_dir(draft_folder: str | Path) -> Path:
    """Where the export of `draft_folder` is cached: `<cache>/models/vllm-<parent>-<hash8>`."""
    src = Path(draft_folder).expanduser().resolve()
    tag = hashlib.sha256(str(src).encode()).hexdigest()[:8]
    return models_dir() / f"vllm-{src.parent.name}-{src.name}-{tag}"


def export_for_vllm(draft_folder: str | Path, out_folder: str | Path) -> Path:
    """The folder vLLM loads as the draft of `draft_folder` (see the module docstring): the
    export at `out_folder`, written unless a current one is there, or `draft_folder` itself when
    it has no reduced head."""
    src = Path(draft_folder).expanduser().resolve()
    _check_source(src)
    head = load_reduced_head(src)
    if head is None:
        return src
    out = Path(out_folder).expanduser()
    fp = source_fingerprint(src)
    if not is_current(out, fp):
        build_folder(out, f"the vLLM export of {src}", REMEDY,
                     lambda staging: write_export(src, head, fp, staging))
    return out


def is_current(out: Path, fingerprint: str) -> bool:
    """Whether `out` holds a complete export of the source with `fingerprint`."""
    try:
        card = json.loads((out / CARD).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return (isinstance(card, dict) and card.get("format") == CARD_FORMAT
            and card.get("fingerprint") == fingerprint
            and all((out / name).is_file() for name in (CONFIG, WEIGHTS)))


def _check_source(src: Path) -> None:
    if not (src / CONFIG).is_file():
        raise MCSDError(f"no draft model at {src} (no {CONFIG}): pass the folder of a draft "
                        f"written by save_pretrained, e.g. a distilled draft's draft/ folder")
    if (src / FC_FILE).is_file():
        raise MCSDError(f"the draft at {src} reads the target's hidden states (a features "
                        f"recipe): vLLM's draft_model runs a standalone draft; use the default "
                        f"recipe's draft")
    if not (src / WEIGHTS).is_file():
        raise MCSDError(f"no {WEIGHTS} in {src}: the export reads a draft saved as one "
                        f"safetensors file (save_pretrained of a small model)")


def write_export(src: Path, head: ReducedHead, fingerprint: str, out: Path) -> None:
    """Write the export of `src` (with its reduced `head`) into the empty folder `out`, the
    card last."""
    from safetensors.torch import load_file, save_file

    config = json.loads((src / CONFIG).read_text())
    tensors = load_file(str(src / WEIGHTS))
    tensors["lm_head.weight"] = full_head(head, config, tensors)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / CONFIG).write_text(json.dumps(config | {"tie_word_embeddings": False}, indent=2))
    for path in sorted(src.iterdir()):
        if path.is_file() and path.name not in REWRITTEN:
            shutil.copy2(path, out / path.name)
    card = {"format": CARD_FORMAT, "version": VERSION, "source": str(src),
            "fingerprint": fingerprint, "kept_tokens": int(head.ids.numel()),
            "vocab_size": head.vocab_size}
    (out / CARD).write_text(json.dumps(card, indent=2))


def full_head(head: ReducedHead, config: dict, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The [vocab, d] output weight of `head`: its rows at its ids, zero elsewhere, in the
    dtype of the draft's weights."""
    vocab, width = config.get("vocab_size"), config.get("hidden_size")
    if (head.vocab_size, head.rows.shape[1]) != (vocab, width):
        raise MCSDError(f"the reduced head is for {head.vocab_size} tokens of width "
                        f"{head.rows.shape[1]}, the draft's config says {vocab} of width "
                        f"{width}: rebuild the draft")
    dtype = next((t.dtype for t in tensors.values() if t.is_floating_point()), torch.float32)
    weight = torch.zeros(vocab, width, dtype=dtype)
    weight[head.ids] = head.rows.detach().to(dtype)
    return weight


def default_draft(target: str, build: bool = True) -> Path:
    """The folder of the draft that `target`'s pair brings (`models.pair.pair_names`): a toy
    pair's own draft, or a named model's distilled draft (built first if `build`)."""
    from mcsd_runtime.backend.named import is_named
    from mcsd_runtime.models.pair import pair_names
    from mcsd_runtime.toy import is_toy_spec

    if not (is_toy_spec(str(target)) or is_named(str(target))):
        raise MCSDError(f"target {target!r} brings no default draft for draft:K (only the toy "
                        f"pairs, e.g. toy:tiny, and named models such as smollm2 do): pass "
                        f"such a --target, or use the methods that need no draft (ar, ngram:K, "
                        f"table:PATH, proposer:PATH)")
    return Path(pair_names(str(target), None, build=build)[1])


def draft_source(folder: str | Path) -> Path:
    """The draft an export was written from (its card's source), or `folder` itself where it
    is no export: the proposer class drafts with the reduced head, not the export's."""
    folder = Path(folder)
    try:
        card = json.loads((folder / CARD).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return folder
    source = card.get("source") if isinstance(card, dict) else None
    return Path(source) if source and Path(source).is_dir() else folder


def vllm_draft(target: str, build: bool = True) -> Path:
    """`target`'s default draft as vLLM loads it, exported (or reused) in the cache."""
    draft = default_draft(target, build=build)
    return export_for_vllm(draft, default_export_dir(draft))


@torch.no_grad()
def head_agreement(reduced, exported, kept: torch.Tensor,
                   sequences: list[list[int]]) -> dict:
    """Over every position of `sequences`: how often the argmax of `exported` (the vLLM export)
    differs from that of `reduced` (the draft with its reduced head), where every kept logit is
    <= 0, and the probability `exported` gives non-kept tokens at temperature 1 (mean, max)."""
    other = torch.ones(exported.config.vocab_size, dtype=torch.bool)
    other[kept] = False
    n = differ = nonpositive = 0
    masses = []
    for ids in sequences:
        x = torch.tensor([ids])
        a, b = reduced(x).logits[0].float(), exported(x).logits[0].float()
        n += len(ids)
        differ += int((a.argmax(-1) != b.argmax(-1)).sum())
        nonpositive += int((b[:, kept].max(-1).values <= 0).sum())
        masses.append(b.softmax(-1)[:, other].sum(-1))
    mass = torch.cat(masses)
    return {"positions": n, "argmax_differs": differ, "argmax_differs_rate": differ / n,
            "kept_logits_all_nonpositive": nonpositive, "nonkept_mass_mean": float(mass.mean()),
            "nonkept_mass_max": float(mass.max())}


def measure_export(target: str = "smollm2", prompts: str = "inst-mix-eval", limit: int = 16,
                   new_tokens: int = 32) -> dict:
    """`head_agreement` of `target`'s default draft and its export on `limit` prompts of
    `prompts` (chat-formatted as `mcsd eval` does), each followed by the reduced draft's own
    greedy continuation of `new_tokens` tokens: the contexts a draft drafts in."""
    from mcsd_runtime.models.pair import load_target
    from mcsd_runtime.prompts.chat import encode_prompt
    from mcsd_runtime.prompts.sets import load_prompts

    draft = default_draft(target, build=False)
    export = vllm_draft(target, build=False)
    reduced = load_target(draft, device="cpu", dtype="float32")
    exported = load_target(export, device="cpu", dtype="float32").target
    sequences = []
    for p in load_prompts(prompts, limit=limit):
        ids = torch.tensor([encode_prompt(p, reduced.tokenizer)])
        out = reduced.target.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                                      attention_mask=torch.ones_like(ids))
        sequences.append(out[0].tolist())
    kept = load_reduced_head(draft).ids
    return {"draft": str(draft), "export": str(export), "prompts": prompts,
            "n_prompts": len(sequences), "new_tokens": new_tokens,
            "kept_tokens": int(kept.numel())} | head_agreement(reduced.target, exported, kept,
                                                              sequences)
