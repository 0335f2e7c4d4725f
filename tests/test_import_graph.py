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


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (never run)."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for stmt in node.body for n in ast.walk(stmt)}


def _lazy_exports(tree: ast.AST) -> dict[str, str]:
    """A package's `_EXPORTS = {name: module}`: what its `__getattr__` imports on use."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values,
                                                     strict=True)}
    return {}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `path` imports anywhere in its body, functions included, and those its
    lazy `_EXPORTS` import on use (not those under TYPE_CHECKING, which never run).
    `from a import b` counts `a.b` when that is a module, else `a`."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree)
    out = {m if m in modules else f"{name}.{m}" for m in _lazy_exports(tree).values()}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
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
    assert {"mcsd_runtime.stop.builtin", "train.models", "collect.run"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_runtime_imports_neither_collect_nor_train():
    for name, deps in import_graph().items():
        if name.startswith("mcsd_runtime"):
            assert not {d for d in deps if d.split(".")[0] in ("collect", "train")}, name


def test_lazy_exports_are_visible_to_type_checkers():
    """Each name a package exports through `__getattr__` is also imported under TYPE_CHECKING,
    from the module that `__getattr__` imports it from."""
    import collect
    import mcsd_runtime
    import mcsd_runtime.toy

    for package, prefix in ((mcsd_runtime, "mcsd_runtime."), (collect, ""),
                            (mcsd_runtime.toy, "")):
        tree = ast.parse(Path(package.__file__).read_text())
        seen = {}
        for node in ast.walk(tree):
            if (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                    and node.test.id == "TYPE_CHECKING"):
                for imp in node.body:
                    seen |= {a.name: imp.module for a in imp.names}
        want = {name: prefix + module for name, module in package._EXPORTS.items()}
        assert seen == want, package.__name__
        for name in package.__all__:
            assert getattr(package, name) is not None
