"""What README.md and docs/*.md point at exists, and every `mcsd` command they show parses.

Paths. A word names a repository path when it starts with one of the repository's top-level
folders (`mcsd_runtime/`, `collect/`, `replay/`, `train/`, `tests/`, `scripts/`, `docs/`,
`data/`, `notebooks/`, `.ci/`) or is one of its top-level files (`Makefile`, `pyproject.toml`,
`README.md`), wherever it stands (prose, inline code, code blocks); a link's target is a path
too. A link's target is read relative to its document, as a renderer reads it; every other path
relative to the repository's root. In a table row whose first cell is such a folder (the
README's map), a file name in inline code in its other cells (`engine.py`) is read under that
folder. `:LINE`, `:LINE-LINE` and `::test` suffixes are cut; a `*` is a glob that must
match something. Skipped: generated outputs (the folders .gitignore lists under data/), and
placeholders: a word holding `<`, `{`, `$`, `...`, or an upper-case word such as PATH or DIR as
one of its parts. A link's `#anchor` must name a heading of its target (GitHub's slugs). A
dotted name in inline code that starts with one of the packages
(`mcsd_runtime.decode.cache.RowCache`) must import.

Commands. In code blocks (fenced, or indented after a blank line) and in inline code, a shell
line is joined across its `\\` continuations, split at `&&`, `||`, `;` and `|`, and each part
whose command word is `mcsd` (`.venv/bin/mcsd`, `$(MCSD)` too), `python -m mcsd_runtime`,
`python -m collect` or `python -m train` is checked: its subcommand (and sub-subcommand: `mcsd
toy build`, `mcsd draft distill`) exists, and every option it shows is one that subcommand's
parser accepts (hidden old spellings included), spelled out in full. The parser is built
in-process from the `mcsd.commands` entry points of pyproject.toml, so a stale installed copy of
the entry points does not hide a new command.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import tomllib
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

from mcsd_runtime.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

TOP_FOLDERS = ("mcsd_runtime", "collect", "replay", "train", "tests", "scripts", "docs", "data",
               "notebooks", ".ci")
TOP_FILES = ("Makefile", "pyproject.toml", "README.md")
# generated outputs (.gitignore): named in the docs as where a run writes, never committed
GENERATED = ("data/runs/", "data/models/", "data/stoppers/", "data/reports/", "data/cache/")

# (document, path or command) pairs known to be wrong in a document this test may not fix yet.
# docs/results-batches.md is edited elsewhere; each entry says what is wrong.
ALLOWED: set[tuple[str, str]] = set()

FENCE = re.compile(r"^\s*(```+|~~~+)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SPAN = re.compile(r"(`+)(.+?)\1")
URL = re.compile(r"[a-z][a-z0-9+.-]*:")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FOLDERS = "|".join(re.escape(f) for f in TOP_FOLDERS)
_FILES = "|".join(re.escape(f) for f in TOP_FILES)
PATH_WORD = re.compile(rf"(?<![\w./-])((?:{_FOLDERS})/[\w./*<>{{}}$()-]*|(?:{_FILES})(?![\w.-]))")
PLACEHOLDER = re.compile(r"[<{$]|\.\.\.|(?:^|[/_.-])[A-Z][A-Z0-9_]+(?:$|[/.-])")


@dataclass
class Doc:
    path: Path
    prose: list[tuple[int, str]]  # (line number, line) outside code blocks
    blocks: list[tuple[int, list[str]]]  # (first line number, lines) of each code block

    @property
    def name(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


def read_doc(path: Path) -> Doc:
    lines = path.read_text(encoding="utf-8").splitlines()
    prose: list[tuple[int, str]] = []
    blocks: list[tuple[int, list[str]]] = []
    fence: str | None = None
    block: list[str] = []
    start = 0
    previous_blank = True
    in_list = False
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                blocks.append((start, block))
                fence = None
            else:
                block.append(line)
        elif m:
            fence, block, start = m.group(1), [], i + 2
        elif (previous_blank and not in_list and line.startswith("    ")
              and line.strip()):  # an indented code block
            start, block = i + 1, []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                block.append(lines[i][4:])
                i += 1
            blocks.append((start, block))
            previous_blank = True
            continue
        else:
            prose.append((i + 1, line))
            stripped = line.strip()
            if re.match(r"([-*+]|\d+[.)])\s", stripped):
                in_list = True
            elif stripped and not line.startswith(" "):
                in_list = False
        previous_blank = not line.strip()
        i += 1
    return Doc(path, prose, blocks)


DOCS_READ = {path: read_doc(path) for path in DOCS}


# --- paths -----------------------------------------------------------------------------------

def clean_path(word: str) -> str:
    word = word.rstrip(".,;:)`'\"")
    word = re.sub(r"::.*$", "", word)  # pytest node ids
    word = re.sub(r":\d[\d,-]*$", "", word)  # line numbers
    return word


def is_placeholder(word: str) -> bool:
    return bool(PLACEHOLDER.search(word))


def path_words(text: str) -> list[str]:
    return [clean_path(m.group(1)) for m in PATH_WORD.finditer(text)]


def exists(rel: str, base: Path = ROOT) -> bool:
    if "*" in rel:
        return any(True for _ in base.glob(rel.rstrip("/")))
    return (base / rel).exists()


def table_row_files(line: str) -> list[str]:
    """In a table row whose first cell is a folder (`| `train/` | ...`), the bare file names
    (`decision.py`, `stop/config.py`) its other cells show, as paths under that folder."""
    cells = line.strip().strip("|").split("|")
    if not line.lstrip().startswith("|") or len(cells) < 2:
        return []
    first = re.fullmatch(r"\s*`([^`*]+/)`\s*", cells[0])
    if not first or not path_words(first.group(1)):
        return []
    return [first.group(1) + m.group(2) for cell in cells[1:] for m in SPAN.finditer(cell)
            if re.fullmatch(r"[\w/]+\.(?:py|sh)", m.group(2)) and not path_words(m.group(2))]


def named_paths(doc: Doc) -> list[tuple[int, str, Path]]:
    """(line, path as written, the folder it is relative to) of every path the doc names."""
    found: list[tuple[int, str, Path]] = []
    for number, line in doc.prose:
        for m in LINK.finditer(line):
            target = m.group(1).split("#", 1)[0]
            if target and not URL.match(target):
                found.append((number, target, doc.path.parent))
        text = LINK.sub(lambda m: m.group(0).split("](", 1)[0], line)  # the link's text only
        found += [(number, w, ROOT) for w in path_words(text)]
        found += [(number, w, ROOT) for w in table_row_files(line)]
    for start, block in doc.blocks:
        for offset, line in enumerate(block):
            found += [(start + offset, w, ROOT) for w in path_words(line)]
    return [(n, w, base) for n, w, base in found
            if w and not is_placeholder(w)
            and not (base == ROOT and w.startswith(GENERATED))]


# --- anchors ---------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation dropped, spaces to
    hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    kept = "".join(ch for ch in text if ch.isalnum() or ch in " -_"
                   or unicodedata.category(ch).startswith("M"))
    return kept.replace(" ", "-")


def anchors(doc: Doc) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in doc.prose:
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def linked_anchors(doc: Doc) -> list[tuple[int, str, Path, str]]:
    found = []
    for number, line in doc.prose:
        for m in LINK.finditer(line):
            target, _, anchor = m.group(1).partition("#")
            if anchor and not URL.match(target):
                found.append((number, m.group(1), (doc.path.parent / target).resolve()
                              if target else doc.path, anchor))
    return found


# --- commands --------------------------------------------------------------------------------

def load_parser() -> argparse.ArgumentParser:
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())
    points = table["project"]["entry-points"]["mcsd.commands"]
    registers = []
    for _, value in sorted(points.items()):  # in build_parser's order
        module, _, attr = value.partition(":")
        registers.append(getattr(importlib.import_module(module), attr))
    return build_parser(registers)


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


PARSER = load_parser()
MCSD_WORD = re.compile(r"(?:^|/)mcsd$|^\$\(?MCSD\)?$|^\$\{MCSD\}$")
MODULES = {"mcsd_runtime": None, "collect": "collect", "train": "train"}
PYTHON_WORD = re.compile(r"(?:^|/)python3?$|^\$\(?PY\)?$")
SHELL_WORDS = {"do", "then", "else", "time", "exec", "!", "{", "(", "nohup"}


def logical_lines(block: list[str]) -> list[tuple[int, str]]:
    """(offset of its first line, the line) of each line joined across `\\` continuations."""
    out: list[tuple[int, str]] = []
    current, first = "", 0
    for offset, line in enumerate(block):
        if not current:
            first = offset
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        out.append((first, current + stripped))
        current = ""
    if current:
        out.append((first, current))
    return out


def split_words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: a fragment, not a command
        return line.split()


def command_words(line: str) -> list[list[str]]:
    """The words after `mcsd` of each `mcsd` command in one shell line."""
    words = split_words(line.strip().removeprefix("$ "))
    parts: list[list[str]] = [[]]
    for word in words:
        if word and set(word) <= set(";&|"):
            parts.append([])
        else:
            parts[-1].append(word)
    found = []
    for part in parts:
        while part and (part[0] in SHELL_WORDS or re.match(r"^\w+=", part[0])):
            part = part[1:]
        if not part:
            continue
        if MCSD_WORD.search(part[0]):
            found.append(part[1:])
        elif (PYTHON_WORD.search(part[0]) and len(part) > 2 and part[1] == "-m"
              and part[2] in MODULES):
            found.append([*filter(None, [MODULES[part[2]]]), *part[3:]])
    return found


def commands(doc: Doc) -> list[tuple[int, list[str]]]:
    """(line, words after `mcsd`) of every `mcsd` command in the doc's code blocks and in its
    inline code."""
    found = []
    for start, block in doc.blocks:
        for offset, line in logical_lines(block):
            found += [(start + offset, words) for words in command_words(line)]
    for number, line in doc.prose:
        for m in SPAN.finditer(line):
            found += [(number, words) for words in command_words(m.group(2))]
    return found


def check_command(words: list[str]) -> list[str]:
    """What is wrong with `mcsd WORDS...`: an unknown subcommand, or options it does not take."""
    parser, path = PARSER, ["mcsd"]
    words = list(words)
    while True:
        choices = subparsers(parser)
        if not choices:
            break
        options = [w for w in words if w.startswith("-")]
        if not words or words[0].startswith("-"):
            if set(options) <= {"-h", "--help"}:
                return []  # `mcsd --help`, `mcsd toy --help`
            return [f"`{' '.join(path)}` needs a subcommand before {options}"]
        word = words.pop(0)
        if word.isupper() or "|" in word or word.startswith(("[", "<")):
            return []  # a placeholder such as COMMAND
        if word not in choices:
            return [f"`{' '.join(path)}` has no subcommand {word!r}"]
        parser, path = choices[word], [*path, word]
    if "-" not in parser.prefix_chars:
        return []  # a removed command that takes every word as a value
    known = set(parser._option_string_actions)
    wrong = []
    for word in words:
        if word == "--":
            break
        if not re.match(r"^--?[A-Za-z]", word):
            continue
        option = word.split("=", 1)[0]
        if option not in known:
            wrong.append(f"`{' '.join(path)}` takes no option {option}")
    return wrong


# --- tests -----------------------------------------------------------------------------------

def allowed(doc: Doc, what: str) -> bool:
    return (doc.name, what) in ALLOWED


def test_every_path_named_exists():
    missing = []
    for doc in DOCS_READ.values():
        for number, word, base in named_paths(doc):
            if not exists(word, base) and not allowed(doc, word):
                missing.append(f"{doc.name}:{number}: {word}")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


DOTTED = re.compile(r"`((?:mcsd_runtime|collect|replay|train)(?:\.\w+)+)")


def resolves(name: str) -> bool:
    """A dotted name (`mcsd_runtime.decode.cache.RowCache`) imports: its longest module prefix,
    then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


def test_every_dotted_name_resolves():
    missing = []
    for doc in DOCS_READ.values():
        for number, line in doc.prose:
            for m in DOTTED.finditer(line):
                if not resolves(m.group(1)) and not allowed(doc, m.group(1)):
                    missing.append(f"{doc.name}:{number}: {m.group(1)}")
    assert not missing, "module paths named in the docs that do not import:\n" + "\n".join(missing)


def test_every_link_anchor_is_a_heading():
    heads = {path.resolve(): anchors(doc) for path, doc in DOCS_READ.items()}
    missing = []
    for doc in DOCS_READ.values():
        for number, target, path, anchor in linked_anchors(doc):
            if path.suffix == ".md" and path in heads and anchor not in heads[path] \
                    and not allowed(doc, target):
                missing.append(f"{doc.name}:{number}: {target}")
    assert not missing, "links to headings that do not exist:\n" + "\n".join(missing)


def test_every_command_shown_parses():
    wrong = []
    for doc in DOCS_READ.values():
        for number, words in commands(doc):
            for problem in check_command(words):
                if not allowed(doc, problem):
                    wrong.append(f"{doc.name}:{number}: {problem}")
    assert not wrong, "commands in the docs that `--help` does not accept:\n" + "\n".join(wrong)


@pytest.mark.parametrize("text, expected", [
    ("`mcsd_runtime/decode/engine.py:12-40`", ["mcsd_runtime/decode/engine.py"]),
    ("see `tests/test_x.py::test_y` and `Makefile`", ["tests/test_x.py", "Makefile"]),
    ("`python scripts/gpu_check.py join`", ["scripts/gpu_check.py"]),
    ("`stop/verify_budget.py`, `models/gguf-<name>/`", []),
])
def test_path_words(text, expected):
    assert [w for m in SPAN.finditer(text) for w in path_words(m.group(2))] == expected


@pytest.mark.parametrize("word, placeholder", [
    ("data/runs/PATH", True), ("scripts/$X.sh", True), ("docs/<page>.md", True),
    ("train/DIR/x.py", True), ("docs/cli.md", False), ("mcsd_runtime/decode/cache.py", False),
])
def test_placeholders(word, placeholder):
    assert is_placeholder(word) == placeholder


def test_table_rows_name_files_under_their_folder():
    assert table_row_files("| `train/` | the pipeline (`decision.py`), `stop/config.py` |") == \
        ["train/decision.py", "train/stop/config.py"]
    assert table_row_files("| 3 | `toy/` | `build.py` |") == []
    assert table_row_files("| `mcsd_runtime/*.py` | `tree.py` |") == []


def test_a_wrong_command_is_caught():
    assert check_command(["eval", "--target", "toy", "--no-such-option", "1"])
    assert check_command(["toy", "nope"])
    assert check_command(["no-such-command"])
    assert not check_command(["toy", "build", "--recipe", "tiny"])
    assert not check_command(["draft", "distill", "--target", "smollm2", "--features"])
    assert not check_command(["COMMAND", "--help"])


def test_dotted_names():
    assert resolves("mcsd_runtime.decode.cache.RowCache")
    assert not resolves("mcsd_runtime.decode.cache.NoSuchCache")
    assert not resolves("mcsd_runtime.no_such_module")


def test_continuations_and_chains_are_read():
    doc = Doc(ROOT / "README.md", [], [(1, [
        "$ .venv/bin/mcsd eval --target toy \\",
        "    --bogus 1 && mcsd toy build --recipe tiny; make test",
        "for t in 0 1; do $(MCSD) collect --out x --nope || exit 1; done",
    ])])
    problems = [p for _, words in commands(doc) for p in check_command(words)]
    assert problems == ["`mcsd eval` takes no option --bogus",
                        "`mcsd collect` takes no option --nope"]


def test_slugs():
    assert slug("Fixed-shape forwards and CUDA graphs (`graphs`)") == \
        "fixed-shape-forwards-and-cuda-graphs-graphs"
    assert slug("Where a step's time goes (H200)") == "where-a-steps-time-goes-h200"
    assert slug("`make demo`: the pipeline on the toy pair") == \
        "make-demo-the-pipeline-on-the-toy-pair"

