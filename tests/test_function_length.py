"""No function outside the tests is over MAX_LINES lines, counted from its `def` to its last
line (decorators aside, docstring included): a longer one is split at a natural seam (an
option group, a stage) into named functions."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mcsd_runtime", "collect", "train", "replay", "scripts")  # not tests/, not .venv
MAX_LINES = 60


def long_functions(root: Path, max_lines: int = MAX_LINES) -> list[str]:
    """`FILE:LINE NAME LENGTH` of every function (methods and nested functions too) over
    `max_lines` lines in the .py files under `root`'s PACKAGES."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if any(part.startswith(".") for part in rel.parts):  # a virtual environment, say
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > max_lines:
                        found.append(f"{rel.as_posix()}:{node.lineno} {node.name} {length}")
    return found


def test_no_function_is_over_the_limit() -> None:
    found = long_functions(ROOT)
    assert not found, (f"{len(found)} function(s) over {MAX_LINES} lines; split each at a "
                       f"natural seam (an option group, a stage):\n" + "\n".join(found))


def test_a_function_one_line_over_is_listed(tmp_path: Path) -> None:
    lines = [f"x{i} = {i}\n" for i in range(MAX_LINES - 1)]
    fits = "def fits():\n" + "".join("    " + line for line in lines)  # MAX_LINES lines
    method = ("class C:\n    async def long(self):\n"  # MAX_LINES + 1 lines
              + "".join("        " + line for line in lines) + "        return x0\n")
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "mod.py").write_text(f"{fits}\n\n{method}")
    (tmp_path / "tests").mkdir()  # never checked
    (tmp_path / "tests" / "test_mod.py").write_text(method)
    assert long_functions(tmp_path) == [f"train/mod.py:{MAX_LINES + 4} long {MAX_LINES + 1}"]
