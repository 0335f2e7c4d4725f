"""Evaluation methods by name (`ar`, `hf`, `hf-static`, `mcsd:4,2,2,1`, `heuristic`,
`stopper:PATH`, `lookup:8:3`, ...):
splitting `--methods`, refusing a name that cannot run, the label each runs under, the tree
the trained stoppers among them were trained on and the prompt format they were trained on, and
what kind of method a name is."""

from __future__ import annotations

import re
from pathlib import Path

from mcsd_runtime.decisions.artifact import ArtifactSpec
from mcsd_runtime.decisions.builtin import (
    BUILTIN,
    UnknownStopperError,
    make_decision,
    parse_stopper_spec,
)
from mcsd_runtime.decode.records import DecodeConfig
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.tree import parse_k_config

# no batches
SINGLE_SEQUENCE = ("hf", "hf-assisted", "hf-static", "hf-generate", "mcsd-target-init")
# `hf-static[:MODE]`: the target's generate() on a static cache, its decode step compiled
# (MODE compile) or not (eager); without MODE, compiled on CUDA only (compiling on a CPU takes
# minutes and is not what a CPU run measures)
HF_STATIC = "hf-static"
HF_STATIC_MODES = ("compile", "eager")
# the target's own generate() without our decoder: references, not schedules
HF_REFERENCES = ("hf", "hf-assisted", HF_STATIC)
LOOKUP = "lookup"  # `lookup[:K[:N]][+STOPPER]`: prompt lookup, then STOPPER (none: the target)
LOOKUP_DEFAULTS = (8, 3)  # K tokens at most, from matches of N..4 tokens
# `lookup-learned:PATH[+STOPPER]`: a copy length from `mcsd train --decision copy`, then STOPPER
LEARNED_LOOKUP = "lookup-learned"
# `width:PATH`, also after '+': the first depth, cut to the width `mcsd train --decision width`
# chooses
WIDTH = "width"


def parse_hf_static(method: str) -> str | None:
    """`hf-static[:MODE]` -> MODE (`auto` without one: compiled on CUDA, eager elsewhere); None
    for another method; MCSDError for a MODE other than compile or eager."""
    kind, colon, arg = method.partition(":")
    if kind != HF_STATIC:
        return None
    if not colon:
        return "auto"
    if arg not in HF_STATIC_MODES:
        raise MCSDError(f"method {method!r}: use hf-static (compiled on CUDA, eager elsewhere), "
                        f"hf-static:compile or hf-static:eager")
    return arg


def is_hf_reference(method: str) -> bool:
    """The target's own generate() (`hf`, `hf-assisted`, `hf-static[:MODE]`)."""
    return method.partition(":")[0] in HF_REFERENCES


def parse_learned_lookup(method: str) -> tuple[Path, str | None] | None:
    """(PATH, STOPPER or None) of `lookup-learned:PATH[+STOPPER]`, else None; MCSDError without
    a PATH or a STOPPER after '+'."""
    head, plus, spec = method.partition("+")
    kind, _, arg = head.partition(":")
    if kind != LEARNED_LOOKUP:
        return None
    if not arg:
        raise MCSDError(f"method {method!r}: name the folder `mcsd train --decision copy` wrote, "
                        f"e.g. "
                        f"lookup-learned:runs/copy")
    if plus and not spec:
        raise MCSDError(f"method {method!r}: name a stopper after '+', e.g. "
                        f"lookup-learned:{arg}+static:1")
    return Path(arg), spec or None


def parse_lookup(method: str) -> tuple[int | None, int, str | None] | None:
    """`lookup[:K[:N]][+STOPPER]` -> (K or None for the default, N, STOPPER or None); None for
    a method that is not prompt lookup. MCSDError for bad numbers."""
    head, plus, spec = method.partition("+")
    kind, _, arg = head.partition(":")
    if kind != LOOKUP:
        return None
    if plus and not spec:
        raise MCSDError(f"method {method!r}: name a stopper after '+', e.g. lookup:8:3+heuristic")
    parts = arg.split(":") if arg else []
    if len(parts) > 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise MCSDError(f"method {method!r}: use lookup[:K[:N]][+STOPPER], K (tokens copied at "
                        f"most) and N (the shortest match) positive integers, e.g. lookup:8:3")
    k = int(parts[0]) if parts else None
    n = int(parts[1]) if len(parts) > 1 else LOOKUP_DEFAULTS[1]
    if n > 4:
        raise MCSDError(f"method {method!r}: matches are of N..4 tokens; use N <= 4")
    return k, n, spec or None


def lookup_tree(k: int | None, spec: str | None,
                k_config: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """The copy length (default 8) and the tree a lookup method decodes on: alone, a chain of
    K; composed with a stopper, `k_config`."""
    k = k or LOOKUP_DEFAULTS[0]
    return k, (1,) * k if spec is None else k_config


def split_methods(spec: str) -> list[str]:
    """`ar,mcsd:4,2,2,1,heuristic` -> `["ar", "mcsd:4,2,2,1", "heuristic"]` (a depth may be
    capped: `mcsd:4,1/1,1`)."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if (re.fullmatch(r"\d+(/\d+)?", part) and out
                and out[-1].startswith(("mcsd:", "mcsd-target-init:"))):
            out[-1] += f",{part}"
        else:
            out.append(part)
    if not out:
        raise MCSDError("no methods given: e.g. --methods ar,mcsd:4,2,2,1,heuristic")
    return out


def check_method(name: str) -> None:
    """Refuse a method that cannot run before any pair is loaded: an unknown name, a bad
    k-config, or a stopper spec that loading would refuse (`StopperSpec.check`: a built-in with
    bad parameters, a trained stopper folder whose `stopper.json` is bad)."""
    kind, _, arg = name.partition(":")
    if name in ("ar", "hf", "hf-assisted") or parse_hf_static(name) is not None:
        return
    if (look := parse_lookup(name)) is not None:
        if look[2] is not None:
            check_method(look[2])
        return
    if kind == WIDTH:
        from mcsd_runtime.decisions.width import WidthPolicy, parse_width

        WidthPolicy.load(parse_width(name))
        return
    if (learned := parse_learned_lookup(name)) is not None:
        from mcsd_runtime.decisions.copy_length import read_spec

        spec = read_spec(learned[0])
        if learned[1] is not None:
            if spec.get("draft_costs") is None:
                raise MCSDError(f"method {name!r}: {learned[0]} was trained to copy or let the "
                                f"target decode alone, not to copy or draft: retrain it with "
                                f"`mcsd train --decision copy --k-config K_CONFIG`, or drop "
                                f"'+{learned[1]}'")
            check_method(learned[1])
        return
    try:
        if kind in ("mcsd", "mcsd-target-init"):
            if arg:
                parse_k_config(arg)
            return
        parse_stopper_spec(arg if kind == "hf-generate" else name).check()
    except UnknownStopperError:
        raise MCSDError(
            f"unknown method {name!r}: use ar, hf, hf-static[:compile|eager], mcsd[:K], "
            f"mcsd-target-init[:K], hf-assisted, lookup[:K[:N]], lookup-learned:PATH, width:PATH, "
            f"hf-generate:STOPPER, a stopper spec ({', '.join(BUILTIN)}) or stopper:PATH"
        ) from None
    except MCSDError as err:
        raise MCSDError(f"method {name!r}: {err}") from None


def check_batch_methods(methods: list[str], batch_size: int) -> None:
    """Refuse, at batch sizes above 1, the methods that decode one sequence at a time."""
    single = [m for m in methods if m.split(":", 1)[0] in SINGLE_SEQUENCE]
    if batch_size > 1 and single:
        raise MCSDError(f"--batch-size {batch_size}: {', '.join(single)} decode one sequence at "
                        f"a time (transformers' generate, or the lossy target-initialized "
                        f"mode); drop them from --methods or use --batch-size 1")


def stopper_folder(method: str) -> Path | None:
    """The trained stopper folder a method runs (`stopper:PATH`, a bare folder, or either
    inside `hf-generate:`), else None."""
    kind, _, arg = method.partition(":")
    if (look := parse_lookup(method)) is not None:
        return stopper_folder(look[2]) if look[2] else None
    if (learned := parse_learned_lookup(method)) is not None:
        return stopper_folder(learned[1]) if learned[1] else None
    try:
        return parse_stopper_spec(arg if kind == "hf-generate" else method).folder
    except UnknownStopperError:  # ar, hf, mcsd:K, ...
        return None


def stopper_trees(methods: list[str]) -> dict[str, tuple[int, ...]]:
    """The k-config each trained stopper among `methods` records (those that record one)."""
    trees = {}
    for m in methods:
        folder = stopper_folder(m)
        if folder is not None and (k := ArtifactSpec.read(folder).k_config):
            trees[m] = k
    return trees


def check_prompt_formats(methods: list[str], domains: dict[str, list], tokenizer, chat: str,
                         allow: bool = False, log=print) -> dict[str, dict]:
    """Each domain's prompt format (name -> `mcsd_runtime.prompts.chat.prompt_format` of its
    prompts under `chat` with `tokenizer`), after refusing (MCSDError) a trained stopper among
    `methods` that was trained on prompts formatted otherwise (a stopper recording no format
    was trained on text); with `allow`, `log` gets a warning instead. Run before decoding."""
    from mcsd_runtime.prompts.chat import check_format, prompt_format

    formats = {}
    for name, prompts in domains.items():
        formats[name] = prompt_format(prompts, tokenizer, chat)
        for m in methods:
            folder = stopper_folder(m)
            if folder is None:
                continue
            who = short_name(m) + (f" on {name}" if len(domains) > 1 else "")
            warning = check_format(ArtifactSpec.read(folder).prompt_format, formats[name], who,
                                   allow)
            if warning:
                log(warning)
    return formats


def tree_for(methods: list[str], k_config: str | None,
             default: tuple[int, ...]) -> tuple[tuple[int, ...], str]:
    """The tree to decode with and why: `k_config` when given, else the one tree the trained
    stoppers among `methods` were trained on, else `default`."""
    if k_config is not None:
        return parse_k_config(k_config), "--k-config"
    trees = stopper_trees(methods)
    if len(set(trees.values())) > 1:
        listed = "; ".join(f"{m}: {parse_k_config(k)}" for m, k in trees.items())
        raise MCSDError(f"the trained stoppers were trained on different trees ({listed}); "
                        f"pass --k-config and keep only the stoppers trained on it")
    if trees:
        method, k = next(iter(trees.items()))
        return k, f"the tree {short_name(method)} was trained on"
    return parse_k_config(default), "the default"


def explicit_label(method: str, k_config: tuple[int, ...]) -> str:
    """The name a method runs under with its defaults spelt out (`mcsd` -> `mcsd:4,2,2,1`,
    `confidence` -> `confidence:0.4`, `static` -> `static:4`), after checking a built-in
    stopper against the tree (`static:9` on a 4-deep tree is refused)."""
    import inspect
    import itertools

    kind, _, arg = method.partition(":")
    if (look := parse_lookup(method)) is not None:
        k, n, spec = look
        k, tree = lookup_tree(k, spec, k_config)
        try:  # composed, the chain is copied into the tree STOPPER drafts on
            DecodeConfig(k_config=tree, lookup=k, lookup_min_ngram=n)
        except MCSDError as err:
            raise MCSDError(f"method {method!r}: {err}") from None
        return f"{LOOKUP}:{k}:{n}" + (f"+{explicit_label(spec, k_config)}" if spec else "")
    if (learned := parse_learned_lookup(method)) is not None and learned[1]:
        return f"{method.partition('+')[0]}+{explicit_label(learned[1], k_config)}"
    if kind in ("mcsd", "mcsd-target-init") and not arg:
        return f"{kind}:{parse_k_config(k_config)}"
    if kind == "hf-generate":
        return f"{kind}:{explicit_label(arg, k_config)}"
    if kind not in BUILTIN:
        return method
    try:
        stopper = make_decision(method, k_config)
    except MCSDError as err:
        raise MCSDError(f"method {method!r}: {err}") from None
    if kind == "static":
        return f"static:{stopper.depth or len(k_config)}"
    if kind == "survival":  # a budget: its power spelt out, its profile as given
        return f"survival:{stopper.estimate.power:g}@{method.partition('@')[2]}"
    if kind == "survival-online":
        return f"survival-online:{stopper.estimate.lr:g}@{method.partition('@')[2]}"
    if kind == "survival-sts":  # its table and profile as given
        return method
    values = [getattr(stopper, p) for p in inspect.signature(type(stopper)).parameters]
    values = list(itertools.takewhile(lambda v: v is not None, values))
    return ":".join([kind, *(f"{v:g}" for v in values)])


def explicit_methods(methods: list[str], k_config: tuple[int, ...]) -> list[str]:
    """`explicit_label` of every method, refusing two that name the same run."""
    labels = [explicit_label(m, k_config) for m in methods]
    for label in set(labels):
        same = [m for m, lab in zip(methods, labels, strict=True) if lab == label]
        if len(same) > 1:
            raise MCSDError(f"--methods lists {' and '.join(map(repr, same))}, which run the same "
                            f"thing ({label}); keep one")
    return labels


def short_name(method: str) -> str:
    """`stopper:/long/path/lightgbm` -> `stopper:lightgbm`, for plot labels."""
    if (look := parse_lookup(method)) is not None and look[2]:
        return f"{method.partition('+')[0]}+{short_name(look[2])}"
    if (learned := parse_learned_lookup(method)) is not None and learned[1]:
        return f"{short_name(method.partition('+')[0])}+{short_name(learned[1])}"
    kind, _, arg = method.partition(":")
    if kind in ("survival", "survival-online", "survival-sts") and "@" in arg:
        power, _, path = arg.partition("@")
        power = Path(power).name if kind == "survival-sts" else power  # the table's name
        return f"{kind}:{power}@{Path(path).name}"
    return (f"{kind}:{Path(arg).name}" if kind in ("stopper", "budget", LEARNED_LOOKUP, WIDTH)
            else method)


def is_static(method: str) -> bool:
    """A static schedule: `mcsd[:K]` (draft-initialised), the `static[:D]` stopper, or prompt
    lookup with a fixed copy length alone or beside one (`lookup:K:N`, `lookup:K:N+static:D`)."""
    kind = method.split(":", 1)[0]
    if (look := parse_lookup(method)) is not None:
        return look[2] is None or is_static(look[2])
    return kind in ("mcsd", "static")


def decoder_twin(method: str, methods: list[str]) -> str | None:
    """`hf-generate:S`'s twin: the method that runs stopper S through MCSDDecoder directly."""
    kind, _, spec = method.partition(":")
    if kind != "hf-generate":
        return None
    for name in (spec, "mcsd" if spec == "static" else None):
        if name in methods:
            return name
    return None


DRAFTLESS = ("ar", "hf", HF_STATIC)  # methods that never run a draft forward


def needs_draft(methods: list[str]) -> bool:
    """Whether any of `methods` runs the draft (AR, the target's generate() and prompt lookup
    alone do not)."""
    for m in methods:
        kind = m.partition(":")[0]
        if kind in DRAFTLESS or (kind == LOOKUP and "+" not in m):
            continue
        return True
    return False
