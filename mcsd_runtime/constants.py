"""Names every layer shares, in one torch-free place (CLIs import it without loading torch)."""

from __future__ import annotations

INITS = ("draft", "target")  # the tree's first layer: from the draft (lossless) or the target
VERIFIERS = ("mcss", "mcss-replacement", "naive")  # see mcsd_runtime.decode.speculative_sampling
GRAPHS = ("auto", "on", "off")  # captured forwards: see mcsd_runtime.decode.graphs
BATCH_LAYOUTS = ("padded", "ragged")  # a batch's forwards: see mcsd_runtime.decode.ragged
STOPPER_KINDS = ("lightgbm", "mlp", "mlp-hidden")  # learned stopper models (`stopper.json` kind)
DEFAULT_K_CONFIG = (4, 2, 2, 1)  # children per depth of the CLIs' default tree
