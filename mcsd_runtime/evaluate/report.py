"""Moved to `mcsd_runtime.evaluate.eval_report`; this name stays for one release, with a
warning. It is the same module object, so patching either patches the one module."""

import sys
import warnings

from mcsd_runtime.evaluate import eval_report

warnings.warn("mcsd_runtime.evaluate.report moved to mcsd_runtime.evaluate.eval_report; import "
              "it from there", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = eval_report
