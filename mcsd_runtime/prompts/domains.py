"""Prompt sets by domain, built offline from what every machine with the toolkit has.

A stopper is trained on one kind of prompt and deployed on others. These sets span the
acceptance levels of a code-trained pair, so a stopper can be judged on prompts unlike its
training data:

- `toy-code`, `toy-code-collect`: standard-library code (held-out files; `prompts.py`);
- `toy-doc`, `toy-doc-collect`: the same files' docstrings and comment blocks, cut inside the
  prose so that the continuation is more prose;
- `toy-shift`: a *shifting* workload: code prompts that end where a docstring or a comment block
  starts, so one generation window goes code, prose, code;
- `pkg-code`: Python code of other installed packages (transformers, torch, ...);
- `pkg-prose`: English prose, the long descriptions that installed packages ship in their
  metadata (README text, code blocks and tables left out).

Their prompts are all of kind `text` (continued as they are, never put in a chat template by
`--chat auto`); the instruction sets by category are in `mcsd_runtime.prompts.instruct`.

The `toy-*` sets come from the toy corpus's held-out splits (`eval`, and `collect` for the
`-collect` sets): train on `*-collect`, evaluate on the rest. The `pkg-*` sets depend on the
installed packages and their versions, which a run's prompt ids record.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mcsd_runtime.errors import MCSDError

KINDS = ("text", "instruction")


@dataclass(frozen=True)
class Prompt:
    """One prompt: a stable id, its text, the set it came from, its category (None where the set
    has none) and its kind: `text`, to be continued as it is (code, prose), or `instruction`, a
    user's turn, which a chat model gets inside its chat template (`mcsd_runtime.prompts.chat`
    decides, by `--chat`)."""

    id: str
    text: str
    source: str
    category: str | None = None
    kind: str = "text"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise MCSDError(f"prompt {self.id!r}: kind {self.kind!r}, use one of "
                            f"{', '.join(KINDS)}")


MIN_CHARS, MAX_CHARS = 220, 640  # about 64-200 tokens of the toy tokenizer (~3.2 chars/token)
MAX_PER_FILE = 12


def toy_code_prompts(split: str, source: str | None = None) -> list[Prompt]:
    """Prompts cut from the held-out stdlib files of corpus `split` (`eval` or `collect`)."""
    return list(_toy_code_prompts(split, source or split))


@lru_cache(maxsize=4)
def _toy_code_prompts(split: str, source: str) -> tuple[Prompt, ...]:
    from mcsd_runtime.toy.corpus import read_source, source_files

    prompts = []
    for file in source_files(split):
        for line, text in cut_code(read_source(file), file.rel):
            prompts.append(Prompt(id=f"{file.rel}:{line}", text=text, source=source))
    return tuple(prompts)


def cut_code(source: str, key: str = "") -> list[tuple[int, str]]:
    """Code prompts from one file: each ends just before a statement inside a function body
    (so the continuation is more of that function), at a line end without the newline, and
    starts at a line boundary some 220-640 characters earlier. Prompts do not overlap; the cut
    points and lengths are fixed by a hash of `key` and the line number. Returns (1-based line
    where the continuation starts, text) pairs."""
    tree = _parse(source)
    if tree is None:
        return []
    lines = source.splitlines(keepends=True)
    funcs = sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)),
        key=lambda n: n.lineno,
    )
    out: list[tuple[int, str]] = []
    last_end = 0  # lines before this index are used
    for func in funcs:
        if len(out) >= MAX_PER_FILE:
            break
        stmts = [s for s in func.body if s.lineno > func.lineno]
        if len(stmts) < 2:
            continue
        h = _hash(f"{key}:{func.lineno}")
        cut = stmts[1 + h % (len(stmts) - 1)].lineno - 1  # 0-based index of the next line
        if _decorated_or_blank(lines, cut):
            continue
        text = window(lines, cut, last_end, f"{key}:{func.lineno}")
        if text is None:
            continue
        out.append((cut + 1, text))
        last_end = cut
    return out


def _decorated_or_blank(lines: list[str], cut: int) -> bool:
    return cut >= len(lines) or not lines[cut].strip() or lines[cut].lstrip().startswith("@")


# Packages whose code makes `pkg-code`, in this order (those installed): the runtime's own
# dependencies first, so a runtime-only install still has a set.
CODE_PACKAGES = ("transformers", "torch", "lightning", "pandas", "sklearn", "datasets", "tqdm")
PKG_PER_FILE, PKG_PER_PACKAGE = 2, 60  # pkg-code: files taken in the order of a path hash
PROSE_PER_PACKAGE = 6
OWN_DISTRIBUTION = "mcsd-stoppers"


def _hash(key: str) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


def window(lines: list[str], cut: int, first: int, key: str) -> str | None:
    """The prompt that ends before line index `cut`: whole lines from at most `first` on, some
    MIN_CHARS-MAX_CHARS characters long (the length fixed by a hash of `key`), without the
    final newline; None where no such window fits."""
    want = MIN_CHARS + (_hash(key) >> 8) % (MAX_CHARS - MIN_CHARS)
    start, size = cut, 0
    while start > first and size < want:
        start -= 1
        size += len(lines[start])
    while size > MAX_CHARS and start < cut - 1:
        size -= len(lines[start])
        start += 1
    text = "".join(lines[start:cut]).rstrip("\n")
    if not (MIN_CHARS <= len(text) <= MAX_CHARS) or not text.strip():
        return None
    return text


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _docstrings(tree: ast.Module) -> Iterable[tuple[ast.AST, ast.Expr]]:
    """(owner, docstring expression) of the module, its classes and functions."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                yield node, body[0]


def _comment_blocks(lines: list[str], min_lines: int) -> list[tuple[int, int]]:
    """(first, last+1) line indices of runs of at least `min_lines` comment lines."""
    blocks, start = [], None
    for i, line in enumerate([*lines, ""]):
        if line.lstrip().startswith("#") and not line.lstrip().startswith("#!"):
            start = i if start is None else start
            continue
        if start is not None and i - start >= min_lines:
            blocks.append((start, i))
        start = None
    return blocks


def _cuts_to_prompts(lines: list[str], cuts: Iterable[int], key: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    last = 0
    for cut in sorted(set(cuts)):
        if len(out) >= MAX_PER_FILE or cut <= last:
            continue
        text = window(lines, cut, last, f"{key}:{cut}")
        if text is not None:
            out.append((cut + 1, text))
            last = cut
    return out


def cut_prose(source: str, key: str = "") -> list[tuple[int, str]]:
    """Prose prompts from one Python file: each ends inside a docstring (at least 4 lines) or a
    comment block (at least 3 lines), after its first line, so the continuation is more of it.
    Returns (1-based line where the continuation starts, text) pairs."""
    tree = _parse(source)
    if tree is None:
        return []
    lines = source.splitlines(keepends=True)
    cuts = []
    for _, doc in _docstrings(tree):
        first, last = doc.lineno - 1, (doc.end_lineno or doc.lineno) - 1
        if last - first >= 3:
            cuts.append(first + 1 + _hash(f"{key}:{first}") % (last - first - 1))
    for first, end in _comment_blocks(lines, 3):
        cuts.append(first + 1 + _hash(f"{key}:c{first}") % (end - first - 1))
    return _cuts_to_prompts(lines, cuts, key)


def cut_shift(source: str, key: str = "") -> list[tuple[int, str]]:
    """Shifting prompts from one Python file: each ends on code, just before a function's short
    docstring (1-3 lines, with code after it) or a comment block of 2-6 lines inside a function
    followed by code, so one continuation goes from prose back to code."""
    tree = _parse(source)
    if tree is None:
        return []
    lines = source.splitlines(keepends=True)
    cuts = []
    for owner, doc in _docstrings(tree):
        span = (doc.end_lineno or doc.lineno) - doc.lineno + 1
        if isinstance(owner, ast.FunctionDef | ast.AsyncFunctionDef) and span <= 3 \
                and len(owner.body) >= 3:
            cuts.append(doc.lineno - 1)
    funcs = [(n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree)
             if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for first, end in _comment_blocks(lines, 2):
        if end - first <= 6 and end < len(lines) and lines[end].strip() \
                and any(a < first + 1 and end + 1 < b for a, b in funcs):
            cuts.append(first)
    return _cuts_to_prompts(lines, cuts, key)


def _stdlib_prompts(split: str, source: str,
                    cutter: Callable[[str, str], list[tuple[int, str]]]) -> tuple[Prompt, ...]:
    from mcsd_runtime.toy.corpus import read_source, source_files

    return tuple(Prompt(id=f"{file.rel}:{line}", text=text, source=source)
                 for file in source_files(split)
                 for line, text in cutter(read_source(file), file.rel))


@lru_cache(maxsize=16)  # CODE_PACKAGES and more
def _package_files(name: str) -> tuple[tuple[str, Path], ...]:
    """(id prefix, path) of one installed package's .py files (tests left out), or none. Walked
    once per process: every package-drawn prompt set lists the same files."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return ()
    root = Path(next(iter(spec.submodule_search_locations)))
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if {"test", "tests", "testing"} & set(rel.split("/")[:-1]):
            continue
        files.append((f"{name}/{rel}", path))
    return tuple(files)


def package_code_prompts() -> tuple[Prompt, ...]:
    """`pkg-code`: code prompts (as `toy-code` cuts them) from the installed CODE_PACKAGES, at
    most PKG_PER_PACKAGE each, from files taken in the order of a hash of their paths."""
    out = []
    for name in CODE_PACKAGES:
        kept: list[Prompt] = []
        for rel, path in sorted(_package_files(name), key=lambda f: _hash(f[0])):
            if len(kept) >= PKG_PER_PACKAGE:
                break
            try:
                source = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for line, text in cut_code(source, rel)[:PKG_PER_FILE]:
                kept.append(Prompt(id=f"{rel}:{line}", text=text, source="pkg-code"))
        out += sorted(kept[:PKG_PER_PACKAGE], key=lambda p: p.id)
    return tuple(out)


_PROSE_LINE = re.compile(r"^[A-Za-z\"'(]")
_SENTENCE_END = re.compile(r"[.!?](?=\s)")


def prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of running English prose in a README: no code blocks, tables, headings,
    directives, lists, badges or link-heavy lines; whitespace inside a paragraph folded."""
    out, fenced = [], False
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        lines = block.strip("\n").splitlines()
        if any(line.lstrip().startswith(("```", "~~~")) for line in lines):
            fenced = not fenced if sum(ln.lstrip().startswith(("```", "~~~"))
                                       for ln in lines) % 2 else fenced
            continue
        if fenced or not lines or any(line.startswith((" ", "\t")) for line in lines):
            continue
        if not all(_PROSE_LINE.match(line) for line in lines):
            continue
        para = " ".join(line.strip() for line in lines)
        letters = sum(c.isalpha() or c == " " for c in para)
        if len(para) >= 120 and letters / len(para) > 0.85 and para.count("http") <= 1:
            out.append(para)
    return out


def package_prose_prompts() -> tuple[Prompt, ...]:
    """`pkg-prose`: from each installed distribution's long description, prose prompts that end
    at a sentence end inside a paragraph (the previous prose paragraphs before it)."""
    seen, out = set(), []
    dists = sorted(importlib.metadata.distributions(),
                   key=lambda d: (d.metadata.get("Name") or "").lower())
    for dist in dists:
        name = (dist.metadata.get("Name") or "").lower()
        if not name or name in seen or name == OWN_DISTRIBUTION:
            continue
        seen.add(name)
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        paras = prose_paragraphs(body)
        kept = 0
        for i, para in enumerate(paras):
            ends = [m.end() for m in _SENTENCE_END.finditer(para)
                    if 0.3 * len(para) <= m.end() <= len(para) - 40]
            if not ends or kept >= PROSE_PER_PACKAGE:
                continue
            cut = ends[_hash(f"{name}:{i}") % len(ends)]
            text = "\n\n".join([*paras[max(0, i - 2):i], para[:cut]])
            text = text[-MAX_CHARS:]
            text = text[text.find(" ") + 1:] if len(text) == MAX_CHARS else text
            if len(text) >= MIN_CHARS:
                out.append(Prompt(id=f"{name}:{i}", text=text, source="pkg-prose"))
                kept += 1
    return tuple(out)


# name: (what it is, loader)
DOMAIN_SETS: dict[str, tuple[str, Callable[[], tuple[Prompt, ...]]]] = {
    "toy-doc": ("stdlib docstrings and comments, cut inside the prose (held-out eval files)",
                lambda: _stdlib_prompts("eval", "toy-doc", cut_prose)),
    "toy-doc-collect": ("the same from the collection's files (for training mixtures)",
                        lambda: _stdlib_prompts("collect", "toy-doc-collect", cut_prose)),
    "toy-shift": ("stdlib code ending where a docstring or comment starts: code, prose, code "
                  "in one window (held-out eval files)",
                  lambda: _stdlib_prompts("eval", "toy-shift", cut_shift)),
    "pkg-code": (f"Python code of other installed packages ({', '.join(CODE_PACKAGES)})",
                 package_code_prompts),
    "pkg-prose": ("English prose: installed packages' long descriptions (README text)",
                  package_prose_prompts),
}


@lru_cache(maxsize=8)
def domain_prompts(name: str) -> tuple[Prompt, ...]:
    """The prompts of one DOMAIN_SETS set (built once per process)."""
    return DOMAIN_SETS[name][1]()
