"""Moved to `mcsd_runtime.decode.speculative_sampling`; this name stays for one release, with a
warning. It is the same module object, so patching either patches the one module."""

import sys
import warnings

from mcsd_runtime.decode import speculative_sampling

warnings.warn("mcsd_runtime.decode.verify moved to mcsd_runtime.decode.speculative_sampling; "
              "import it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = speculative_sampling
