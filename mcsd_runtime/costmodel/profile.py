"""Moved to `mcsd_runtime.pricing.profile`; this name stays for one release, with a warning."""

import warnings

from mcsd_runtime.pricing.profile import *  # noqa: F403

warnings.warn("mcsd_runtime.costmodel.profile moved to mcsd_runtime.pricing.profile; import "
              "it from there", DeprecationWarning, stacklevel=2)
