"""Moved to `collect.overhead` (`python -m collect.overhead`, the cost of recording rows); this
name stays for one release, with a warning: imported, it is the same module object; run, it
runs the new one."""

import sys
import warnings

from collect import overhead

if __name__ == "__main__":
    warnings.warn("python -m collect.bench is now python -m collect.overhead", DeprecationWarning,
                  stacklevel=1)
    sys.exit(overhead.main())
warnings.warn("collect.bench moved to collect.overhead; import it from there", DeprecationWarning,
              stacklevel=2)
sys.modules[__name__] = overhead
