"""Moved to `mcsd_runtime.decisions`; this name stays for one release, with a warning.

`mcsd_runtime.stop` and every module it held (`mcsd_runtime.stop.builtin`, ...) still import:
each old name is the very module object of its new one (`stop.decision` is
`decisions.manifest`, `stop.device` is `decisions.device_scoring`, the rest keep their names),
so patching either patches the one module, and objects pickled under the old names load. Each
old name warns once, with a DeprecationWarning naming the new one, when it is first imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

OLD, NEW = __name__, "mcsd_runtime.decisions"
# every module of the old package, by its old name: its name under `mcsd_runtime.decisions`
MOVED = {name: name for name in (
    "aggregation", "artifact", "budget", "builtin", "contract", "copy_length", "expected_rate",
    "features", "forest", "learned", "lightgbm_native", "online", "skip", "verify_budget",
    "width")} | {"decision": "manifest", "device": "device_scoring"}


def new_name(old: str) -> str | None:
    """The module that `old` (`mcsd_runtime.stop.X`) names now, or None where it named none."""
    package, _, leaf = old.rpartition(".")
    return f"{NEW}.{MOVED[leaf]}" if package == OLD and leaf in MOVED else None


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `mcsd_runtime.stop.X` and loads it as the module `mcsd_runtime.decisions.Y`."""

    alias_of = OLD

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}  # by old name, while loading

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if new_name(fullname) else None

    def create_module(self, spec) -> ModuleType:
        new = new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__  # the import system sets the alias's on it next
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the module keeps its own spec (its name for reloads), not the alias's
        module.__spec__ = self._specs.pop(module.__spec__.name)


def __getattr__(name: str) -> ModuleType:
    if name in MOVED:
        return importlib.import_module(f"{OLD}.{name}")
    raise AttributeError(f"module {OLD!r} has no attribute {name!r}")


if not any(getattr(finder, "alias_of", None) == OLD for finder in sys.meta_path):
    sys.meta_path.insert(0, _Aliases())
warnings.warn(f"{OLD} moved to {NEW}; import it from there", DeprecationWarning, stacklevel=2)
