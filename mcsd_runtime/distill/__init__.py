"""Drafts distilled from any target (`mcsd draft distill`): a draft cut from the target's own
embeddings, final norm and a few of its layers, trained on the target's own chat answers
(self-generated, offline) and some plain text, with an optional reduced-vocabulary head and
an optional input of the target's own states (a feature draft).

- `recipe`: `DistillRecipe` and its presets (`default`, `features`, `tiny`), hashed with the
  target;
- `target`: loading a target folder and its fingerprint;
- `data`: self-generated conversations (Magpie-style queries, greedy answers) and text, with
  the target's top-k distribution at every trained position, cached on disk;
- `layers`: a draft initialised from the target's layers;
- `head`: the reduced-vocabulary head (`attach_reduced_head`, used by `load_pair`);
- `feature`: the feature draft (`FeatureDraft`, `attach_feature_input`, used by `load_pair`);
  `feature_train`: its training on the target's states, and its held-out agreement;
- `train`: the distillation loop; `agreement`: held-out agreement;
- `cache`: `build_draft`, `default_draft_dir`, the card.

Kept import-free: `mcsd_runtime.models.pair` imports `head` and `feature` alone.
"""
