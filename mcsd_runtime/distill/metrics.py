"""Moved to `mcsd_runtime.distill.agreement`; this name stays for one release, with a warning.
It is the same module object, so patching either patches the one module."""

import sys
import warnings

from mcsd_runtime.distill import agreement

warnings.warn("mcsd_runtime.distill.metrics moved to mcsd_runtime.distill.agreement; import it "
              "from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = agreement
