"""The project's modules import each other without a circle, counting imports made inside
functions (a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mcsd_runtime", "collect", "train")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `path` imports anywhere in its body, functions included. `from a import b`
    counts `a.b` when that is a module, else `a`; a package's own `__init__` is not counted for
    its submodules (Python runs it, but it imports none of them here)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in modules:
                    out.add(sub)
                elif base in modules:
                    out.add(base)
    out.discard(name)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (a list of modules, the first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, modules) for name, path in modules.items()}


def test_find_cycle_finds_a_circle_through_a_function_level_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_circles():
    graph = import_graph()
    assert {"mcsd_runtime.stoppers", "train.models", "collect.run"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_runtime_imports_neither_collect_nor_train():
    for name, deps in import_graph().items():
        if name.startswith("mcsd_runtime"):
            assert not {d for d in deps if d.split(".")[0] in ("collect", "train")}, name
