"""Prompt sets: the toy pair's held-out code prompts, the paper's benchmarks, and local files.

`load_prompts(spec, limit=None, seed=0)` accepts:

- `toy-code`: code prompts cut from the toy pair's held-out `eval` stdlib files (evaluation);
- `toy-code-collect`: the same cut from the disjoint held-out `collect` files (collection);
- the other offline domains of `mcsd_runtime.prompts.domains` (`toy-doc`, `toy-shift`, `pkg-code`,
  `pkg-prose`, ...): prose, shifting and foreign-code prompts for evaluation across domains;
- `mt-bench`, `alpaca`, `trivia-qa`, `wmt-de`: the benchmarks, from the Hugging Face hub;
- `SET=PATH` (e.g. `mt-bench=question.jsonl`): a local .json/.jsonl/.parquet file in that set's
  own format;
- `PATH`: a local file with a `prompt`, `text`, `instruction` or `question` field per record.

With `limit`, a seeded sample of that many prompts is returned (in their original order).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
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

__all__ = ["KNOWN_SETS", "Prompt", "cut_code", "load_prompts", "toy_code_prompts"]

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
FILE_SUFFIXES = (".json", ".jsonl", ".parquet")
KNOWN_SETS = (*TOY_SETS, *DOMAIN_SETS, *HUB_SETS)


def load_prompts(spec: str, limit: int | None = None, seed: int = 0) -> list[Prompt]:
    """The prompts of `spec` (see the module docstring), at most `limit`, sampled with `seed`."""
    spec = spec.strip()
    if limit is not None and limit < 1:
        raise MCSDError(f"--limit must be a positive number of prompts, got {limit}")
    if spec in TOY_SETS:
        prompts = toy_code_prompts(TOY_SETS[spec], source=spec)
    elif spec in DOMAIN_SETS:
        prompts = list(domain_prompts(spec))
    elif spec in HUB_SETS:
        prompts = _parse_records(spec, _load_hub(spec), origin=f"hub:{HUB_SETS[spec][0]}")
    elif "=" in spec and not Path(spec).exists():
        name, _, path = spec.partition("=")
        name = name.strip()
        if name not in HUB_SETS and name != "generic":
            raise MCSDError(
                f"unknown prompt set {name!r} in {spec!r}; a file can be read in the format of "
                f"{', '.join(HUB_SETS)} or generic, e.g. mt-bench=/path/question.jsonl"
            )
        prompts = _parse_records(name, *read_records_lines(Path(path.strip())),
                                 origin=path.strip())
    elif _looks_like_path(spec):
        prompts = _parse_records("generic", *read_records_lines(Path(spec)), origin=spec)
    else:
        raise MCSDError(
            f"unknown prompt set {spec!r}; use one of {', '.join(KNOWN_SETS)}, a local "
            f"{'/'.join(FILE_SUFFIXES)} file, or SET=FILE (e.g. alpaca=/path/alpaca.json)"
        )
    if not prompts:
        raise MCSDError(f"prompt set {spec!r} gave no prompts")
    if limit is not None and limit < len(prompts):
        keep = sorted(random.Random(seed).sample(range(len(prompts)), limit))
        prompts = [prompts[i] for i in keep]
    return prompts


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


PARSERS: dict[str, tuple[Callable[[Record], str | None], tuple[str, ...]]] = {
    # set: (text of a record, id fields tried in order)
    "mt-bench": (_mt_bench, ("question_id", "prompt_id", "id")),
    "alpaca": (_alpaca, ("id",)),
    "trivia-qa": (_trivia_qa, ("question_id", "id")),
    "wmt-de": (_wmt_de, ("id",)),
    "generic": (_generic, ("id", "question_id", "prompt_id")),
}
EXPECTED = {
    "mt-bench": "a `turns` list (or `prompt`)",
    "alpaca": "`instruction` (and optional `input`)",
    "trivia-qa": "`question`",
    "wmt-de": "`translation.en` (or `en`)",
    "generic": f"one of {', '.join(GENERIC_FIELDS)}",
}


def _parse_records(name: str, records: list[Record], lines: list[int] | None = None, *,
                   origin: str) -> list[Prompt]:
    """Prompts of `records` in set `name`'s format. Hub sets skip a record without a prompt;
    a local file (`lines`: each record's line in it, or None for no lines) refuses it."""
    text_of, id_fields = PARSERS[name]
    source = name if name != "generic" else Path(origin).stem
    strict = not origin.startswith("hub:")
    prompts = []
    for i, rec in enumerate(records):
        text = text_of(rec) if isinstance(rec, dict) else None
        if text is None or not text.strip():
            if strict and (prompts or i + 1 < len(records)):  # one bad record among good ones
                where = f"line {lines[i]}" if lines else f"record {i + 1}"
                raise MCSDError(f"{origin}, {where}: no usable prompt field; a {name} file "
                                f"needs {EXPECTED[name]} in every record")
            continue
        rid = next((rec[f] for f in id_fields if rec.get(f) not in (None, "")), i)
        prompts.append(Prompt(id=str(rid), text=text, source=source))
    if records and not prompts:
        raise MCSDError(f"{origin}: no record has a usable prompt field; a {name} file needs "
                        f"{EXPECTED[name]} per record")
    return prompts


# --- reading ------------------------------------------------------------------------------


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(FILE_SUFFIXES) or "/" in spec or Path(spec).exists()


def read_records(path: Path) -> list[Record]:
    """Records of a .json (a list, or an object holding one list), .jsonl or .parquet file."""
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
    except (OSError, UnicodeDecodeError, ValueError) as err:
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
