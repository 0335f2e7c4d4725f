"""Drafts distilled from any target (`mcsd draft distill`): a draft cut from the target's own
embeddings, final norm and a few of its layers, trained on the target's own chat answers
(self-generated, offline) and some plain text, with an optional reduced-vocabulary head.

- `recipe`: `DistillRecipe` and its presets (`default`, `tiny`), hashed with the target;
- `target`: loading a target folder and its fingerprint;
- `data`: self-generated conversations (Magpie-style queries, greedy answers) and text, with
  the target's top-k distribution at every trained position, cached on disk;
- `layers`: a draft initialised from the target's layers;
- `head`: the reduced-vocabulary head (`attach_reduced_head`, used by `load_pair`);
- `train`: the distillation loop; `metrics`: held-out agreement and latency;
- `cache`: `build_draft`, `default_draft_dir`, the card.

Kept import-free: `mcsd_runtime.models.pair` imports `head` alone.
"""
