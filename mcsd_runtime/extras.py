"""Which installed extra a module comes from, so that a command missing one says what to install.

`pip install mcsd-stoppers` installs what decoding with a trained stopper needs; collection,
training, evaluation, the toy pair's build and the notebooks need the `toolkit` extra
(pyproject.toml keeps the two lists).
"""

from __future__ import annotations

from mcsd_runtime.errors import MCSDError

TOOLKIT = "toolkit"
# import names of the toolkit extra's packages
TOOLKIT_MODULES = ("datasets", "lightning", "pandas", "pyarrow", "sklearn", "scipy", "matplotlib")


def missing_extra_message(err: ImportError) -> str | None:
    """What to install when `err` is a toolkit package missing, else None."""
    name = (err.name or "").partition(".")[0]
    if name not in TOOLKIT_MODULES:
        return None
    return (f"{name} is not installed: it comes with the {TOOLKIT} extra; install it with "
            f"pip install 'mcsd-stoppers[{TOOLKIT}]'")


def require_toolkit(command: str, *modules: str) -> None:
    """Refuse `command` up front (MCSDError) when a toolkit package it needs is not installed,
    rather than after its work has run (`modules`: import names; all the extra's when none)."""
    import importlib.util

    missing = [m for m in modules or TOOLKIT_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise MCSDError(f"{command} needs {', '.join(missing)}, which come(s) with the {TOOLKIT} "
                        f"extra; install it with pip install 'mcsd-stoppers[{TOOLKIT}]'")
