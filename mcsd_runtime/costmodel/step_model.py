"""Moved to `mcsd_runtime.pricing.step_model`; this name stays for one release, with a warning."""

import warnings

from mcsd_runtime.pricing.step_model import *  # noqa: F403

warnings.warn("mcsd_runtime.costmodel.step_model moved to mcsd_runtime.pricing.step_model; import "
              "it from there", DeprecationWarning, stacklevel=2)
