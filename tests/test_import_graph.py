"""The project's layers, bottom to top (docs/layers.md says what lives on each): a module
imports its own layer and those below it, never one above, and no imports close a circle,
counting imports made inside functions (a lazy import is still a dependency); and a module name
that several modules bear is explained in docs/layers.md's "Repeated module names"."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mcsd_runtime", "collect", "replay", "train")

# Bottom to top. Each name is a package (with everything in it) or a module; the package face
# `mcsd_runtime/__init__.py` is `mcsd_runtime.__init__`. A module at mcsd_runtime's root that is
# on no layer fails `test_every_module_is_on_a_layer`: place it deliberately.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("mcsd_runtime.errors", "mcsd_runtime.constants", "mcsd_runtime.paths",
                "mcsd_runtime.progress", "mcsd_runtime.metrics", "mcsd_runtime.transfer",
                "mcsd_runtime.extras", "mcsd_runtime.tree", "mcsd_runtime.lookup")),
    # what a step costs: its forwards' rules and the profile that prices them, read by the
    # decisions that weigh tokens against seconds (decisions.verify_budget) and everything above
    ("prices", ("mcsd_runtime.pricing",)),
    ("backend", ("mcsd_runtime.backend",)),
    ("toy", ("mcsd_runtime.toy",)),
    ("prompts", ("mcsd_runtime.prompts",)),
    # the learned decisions and their contract
    ("decisions", ("mcsd_runtime.decisions",)),
    ("distill", ("mcsd_runtime.distill",)),
    ("models", ("mcsd_runtime.models",)),
    ("decode", ("mcsd_runtime.decode",)),
    ("integrations", ("mcsd_runtime.integrations",)),
    ("benchmarks", ("mcsd_runtime.benchmarks",)),
    ("evaluate", ("mcsd_runtime.evaluate",)),
    # what the toolkit reads from and writes for serving engines (vLLM, TensorRT-LLM, SGLang)
    ("serving", ("mcsd_runtime.serving",)),
    ("commands", ("mcsd_runtime.cli", "mcsd_runtime.gpu_check", "mcsd_runtime.__main__",
                  "mcsd_runtime.__init__")),
    ("collect", ("collect",)),
    ("replay", ("replay",)),
    ("train", ("train",)),
)
LAYER = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}

# The upward imports that stand today, each with why and what ends it. An import that no longer
# runs upward must leave this list (`test_every_exception_still_stands`).
EXCEPTIONS: dict[tuple[str, str], str] = {}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
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


def imports_of(path: Path, modules: dict[str, Path], root: Path = ROOT) -> set[str]:
    """Project modules `path` imports anywhere in its body, functions included, and those its
    lazy `_EXPORTS` import on use (not those under TYPE_CHECKING, which never run).
    `from a import b` counts `a.b` when that is a module, else `a`."""
    name = module_name(path, root)
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


@functools.cache
def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, modules) for name, path in modules.items()}


def layer_of(module: str) -> int | None:
    """The index in LAYERS of `module`: its own entry, else its nearest package's (None when
    it is on no layer)."""
    parts = (module + ".__init__" if module == "mcsd_runtime" else module).split(".")
    for n in range(len(parts), 0, -1):
        if (name := ".".join(parts[:n])) in LAYER and name != "mcsd_runtime":
            return LAYER[name]
    return None


def upward_imports(graph: dict[str, set[str]], layer=layer_of) -> set[tuple[str, str]]:
    """The imports (importer, imported) of `graph` from a lower layer to a higher one."""
    return {(a, b) for a, deps in graph.items() for b in deps if layer(b) > layer(a)}


def test_find_cycle_finds_a_circle_through_a_function_level_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_an_upward_import_inside_a_function_is_found(tmp_path):
    """The rule reads function-local imports: a ground module importing the engine lazily is
    an upward import."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "low.py").write_text("def f():\n    from pkg.high import g\n")
    (tmp_path / "pkg" / "high.py").write_text("from pkg import low\n")
    modules = {"pkg.low": tmp_path / "pkg" / "low.py", "pkg.high": tmp_path / "pkg" / "high.py"}
    graph = {name: imports_of(path, modules, tmp_path) for name, path in modules.items()}
    assert graph == {"pkg.low": {"pkg.high"}, "pkg.high": {"pkg.low"}}
    layers = {"pkg.low": 0, "pkg.high": 1}
    assert upward_imports(graph, layers.get) == {("pkg.low", "pkg.high")}
    assert layer_of("mcsd_runtime") == LAYER["mcsd_runtime.__init__"]
    assert layer_of("mcsd_runtime.decode.engine") == LAYER["mcsd_runtime.decode"]
    assert layer_of("mcsd_runtime.not_placed") is None


def test_every_module_is_on_a_layer():
    assert not [m for m in import_graph() if layer_of(m) is None], "place them in LAYERS"


def test_no_import_runs_up_a_layer():
    def where(m: str) -> str:
        return f"{m} (layer {layer_of(m)}, {LAYERS[layer_of(m)][0]})"

    new = sorted(upward_imports(import_graph()) - set(EXCEPTIONS))
    assert not new, "\n".join(f"{where(a)} imports {where(b)}, above it" for a, b in new)


def test_every_exception_still_stands():
    assert all(reason.strip() for reason in EXCEPTIONS.values())
    gone = sorted(set(EXCEPTIONS) - upward_imports(import_graph()))
    assert not gone, f"no longer upward imports: remove them from EXCEPTIONS: {gone}"


def test_no_import_circles():
    graph = import_graph()
    assert {"mcsd_runtime.decisions.builtin", "train.stop.models", "collect.run"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


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


# --- repeated module names ---------------------------------------------------------------------

LAYERS_DOC = ROOT / "docs" / "layers.md"
NOT_NAMES = ("__init__.py", "__main__.py")  # every package has them


def repeated_modules(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module file name that more than one module of PACKAGES bears: the modules' paths."""
    seen: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for p in (root / pkg).rglob("*.py"):
            if p.name not in NOT_NAMES:
                seen.setdefault(p.name, set()).add(p.relative_to(root).as_posix())
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


def listed_repeats(markdown: str) -> dict[str, set[str]]:
    """The table under "## Repeated module names": each row's name (its first cell) and the
    module paths its second cell names."""
    section = markdown.split("## Repeated module names", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines()
            if line.startswith("| `")]
    return {cells[0].strip().strip("`"): set(re.findall(r"`([\w/]+\.py)`", cells[1]))
            for cells in rows}


def unexplained_repeats(repeats: dict[str, set[str]], listed: dict[str, set[str]]) -> list[str]:
    """What the table fails to say: a repeated name it lacks or whose modules it gives wrong,
    and a row whose name no longer repeats."""
    wrong = [f"{name}: {sorted(paths)}, listed {sorted(listed.get(name, ()))}"
             for name, paths in sorted(repeats.items()) if listed.get(name) != paths]
    stale = [f"{name}: listed, but no longer repeated"
             for name in sorted(set(listed) - set(repeats))]
    return wrong + stale


def test_a_planted_repeat_is_unexplained(tmp_path):
    """A `report.py` planted in two packages fails while the table does not name it; a row whose
    repeat is gone fails too."""
    for rel in ("mcsd_runtime/evaluate/eval_report.py", "collect/report.py", "train/report.py",
                "replay/width.py", "mcsd_runtime/decisions/width.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    table = ("## Repeated module names\n\n| name | modules | why |\n|---|---|---|\n"
             "| `width.py` | `mcsd_runtime/decisions/width.py`, `replay/width.py` | why |\n")
    repeats = repeated_modules(tmp_path)
    assert repeats == {"report.py": {"collect/report.py", "train/report.py"},
                       "width.py": {"mcsd_runtime/decisions/width.py", "replay/width.py"}}
    assert [m.split(":")[0] for m in unexplained_repeats(repeats, listed_repeats(table))] == [
        "report.py"]
    (tmp_path / "mcsd_runtime/decisions/width.py").unlink()
    assert [m.split(":")[0] for m in unexplained_repeats(repeated_modules(tmp_path),
                                                         listed_repeats(table))] == [
        "report.py", "width.py"]


def test_every_repeated_module_name_is_explained_in_the_layers_doc():
    """docs/layers.md lists each repeated module name with every module bearing it, and why the
    folder makes each one's role plain."""
    listed = listed_repeats(LAYERS_DOC.read_text())
    assert all(listed.values()), "a row names no modules"
    missing = unexplained_repeats(repeated_modules(), listed)
    assert not missing, ("explain these in docs/layers.md's \"Repeated module names\" table, or "
                         "rename them:\n" + "\n".join(missing))
