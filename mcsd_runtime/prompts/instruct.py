"""Instruction prompt sets by category, built offline and deterministically, for collecting and
training stoppers on chat traffic (SmolLM2-135M-Instruct and other chat models).

Each is a set of *instructions* (a user's turn: `--chat auto` puts them in the chat template),
one category per set, in two disjoint halves: `inst-NAME` for collection and training, and its
twin `inst-NAME-eval` for evaluation. Standard-library material comes from the toy corpus's
held-out splits (`collect`, `eval`; `mcsd_runtime.toy.corpus`), so the halves share no file;
material from installed packages is halved by a hash of its file path or distribution name, and
an evaluation twin leaves out what also occurs in the collection half (a docstring or function
that two files share).

- `inst-explain` (category `explain`): explain what a stdlib function does, given its source
  (docstring left out, so the answer is not a copy of it);
- `inst-docstring-code` (`code`): write a function from its signature and docstring;
- `inst-summarize` (`summarization`): summarize one to three paragraphs of documentation (stdlib
  docstrings, installed packages' docstrings and long descriptions);
- `inst-rewrite` (`rewrite`): rewrite one such paragraph in plain words (paragraphs not used by
  `inst-summarize`);
- `inst-qa` (`qa`): everyday questions with a sentence of context, from templates and word lists;
- `inst-mix`: all five together, each prompt keeping its category (ids `CATEGORY:...`).

Every prompt is 30-300 tokens of a Llama-style tokenizer (measured when the sets were designed
with SmolLM2-135M-Instruct's vocabulary and merges, on Python 3.11's stdlib: 35-287 tokens,
medians 49-136 by set); the character bounds below keep them so. A set holds at most
MAX_PER_SET prompts. Sets that draw on installed packages depend on which are installed and
their versions, as `pkg-*` do; the ids name the file or distribution each prompt came from.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import textwrap
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

from mcsd_runtime.prompts.domains import (
    CODE_PACKAGES,
    OWN_DISTRIBUTION,
    Prompt,
    _package_files,
    _parse,
    prose_paragraphs,
)

HALVES = ("collect", "eval")
MAX_PER_SET = 240
PER_FILE = 4  # passages (of each task) taken from one document
FUNCS_PER_FILE = 6  # functions taken from one file, per set
PKG_FILES = 16  # files of each installed package whose functions are used, per half
PKG_DOC_FILES = 48  # files of each installed package whose docstrings are used, per half
CODE_CHARS = (160, 760)  # a function's source (inst-explain)
DOC_CHARS = (40, 700)  # a docstring (inst-docstring-code)
SIGNED_CHARS = (120, 760)  # signature and docstring together
PARA_CHARS = (200, 900)  # a paragraph to rewrite
SUMMARY_CHARS = (280, 1100)  # the text to summarize: one to three paragraphs


def _hash(key: str) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


def _pick(options: tuple[str, ...], key: str) -> str:
    return options[_hash(key) % len(options)]


def package_half(key: str) -> str:
    """The half (`collect` or `eval`) of a piece of installed-package material."""
    return HALVES[_hash(f"inst:{key}") % 2]


def _package_half(split: str, per_package: int) -> list[tuple[str, Path]]:
    """(id, path) of the installed CODE_PACKAGES' files of one half: at most `per_package` of
    each package, in the order of a hash of their paths."""
    out = []
    for name in CODE_PACKAGES:
        files = sorted(_package_files(name), key=lambda f: _hash(f[0]))
        out += [(rel, path) for rel, path in files if package_half(rel) == split][:per_package]
    return out


# --- stdlib functions: inst-explain, inst-docstring-code --------------------------------------


def _functions(split: str, packages: bool = False
               ) -> Iterator[tuple[str, str, ast.FunctionDef, list[str]]]:
    """(file id, module name, function node, source lines) of the functions in corpus `split`'s
    stdlib files (path order), then with `packages` in the installed CODE_PACKAGES' files of
    that half (at most PKG_FILES files each, in the order of a hash of their paths); functions
    in line order."""
    from mcsd_runtime.toy.corpus import read_source, source_files

    files = [(f"stdlib/{f.rel}", f.rel, lambda f=f: read_source(f)) for f in source_files(split)]
    if packages:
        files += [(rel, rel, lambda p=path: p.read_text(encoding="utf-8", errors="replace"))
                  for rel, path in _package_half(split, PKG_FILES)]
    for key, rel, read in files:
        try:
            source = read()
        except OSError:
            continue
        tree = _parse(source)
        if tree is None:
            continue
        lines = source.splitlines()
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        funcs = sorted((n for n in ast.walk(tree)
                        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)),
                       key=lambda n: n.lineno)
        for func in funcs:
            yield key, module, func, lines


def _docstring_node(func: ast.AST) -> ast.Expr | None:
    body = getattr(func, "body", [])
    if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        return body[0]
    return None


def _fits(text: str, bounds: tuple[int, int]) -> bool:
    return bounds[0] <= len(text) <= bounds[1]


EXPLAIN = (
    "Explain what this Python function from the standard library module `{module}` does, "
    "step by step.",
    "What does the following function from Python's `{module}` module do? Describe its inputs, "
    "its result and any side effects.",
    "Here is a function from the Python standard library (`{module}`). Explain in plain words "
    "how it works and when someone would call it.",
)


def explain_prompts(split: str) -> list[Prompt]:
    """`inst-explain`: a function's source without its docstring, to explain."""
    out, per_file = [], {}
    for rel, module, func, lines in _functions(split):
        if per_file.get(rel, 0) >= FUNCS_PER_FILE or len(func.body) < 2:
            continue
        doc = _docstring_node(func)
        start, end = func.lineno - 1, func.end_lineno or func.lineno
        keep = [ln for i, ln in enumerate(lines[start:end], start)
                if doc is None or not (doc.lineno - 1 <= i < (doc.end_lineno or doc.lineno))]
        code = textwrap.dedent("\n".join(keep)).strip("\n")
        if not _fits(code, CODE_CHARS) or len(code.splitlines()) < 4:
            continue
        key = f"{rel}:{func.lineno}"
        ask = _pick(EXPLAIN, key).format(module=module)
        out.append(Prompt(id=f"explain:{key}", text=f"{ask}\n\n```python\n{code}\n```",
                          source="", category="explain", kind="instruction"))
        per_file[rel] = per_file.get(rel, 0) + 1
    return out


WRITE = (
    "Write the body of this Python function so that it does what its docstring says. Reply "
    "with the complete function.",
    "Implement the following function. Keep the signature and the docstring as they are.",
    "Complete this Python function according to its docstring, then explain your "
    "implementation in two sentences.",
)


def docstring_code_prompts(split: str) -> list[Prompt]:
    """`inst-docstring-code`: a function's signature and docstring, to implement."""
    out, per_file = [], {}
    for rel, _, func, lines in _functions(split, packages=True):
        doc = _docstring_node(func)
        if per_file.get(rel, 0) >= FUNCS_PER_FILE or doc is None or len(func.body) < 2:
            continue
        text = ast.get_docstring(func) or ""
        if not _fits(text, DOC_CHARS) or func.name.startswith("__"):
            continue
        head = "\n".join(lines[func.lineno - 1:doc.end_lineno or doc.lineno])
        head = textwrap.dedent(head).strip("\n")
        if not _fits(head, SIGNED_CHARS) or not head.lstrip().startswith(("def ", "async def ")):
            continue
        key = f"{rel}:{func.lineno}"
        out.append(Prompt(id=f"code:{key}",
                          text=f"{_pick(WRITE, key)}\n\n```python\n{head}\n```",
                          source="", category="code", kind="instruction"))
        per_file[rel] = per_file.get(rel, 0) + 1
    return out


# --- documentation paragraphs: inst-summarize, inst-rewrite ------------------------------------


def _docstring_paragraphs(source: str) -> list[list[str]]:
    """The prose paragraphs of each docstring in a Python file (one list per docstring)."""
    tree = _parse(source)
    if tree is None:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            paras = prose_paragraphs(doc) if doc else []
            if paras:
                out.append(paras)
    return out


def _documents(split: str) -> Iterator[tuple[str, list[list[str]]]]:
    """(document id, its docstrings' or description's paragraphs) of one half: stdlib files of
    the corpus split, then installed packages' files and distributions' long descriptions whose
    hash falls in that half."""
    from mcsd_runtime.toy.corpus import read_source, source_files

    for file in source_files(split):
        yield f"stdlib/{file.rel}", _docstring_paragraphs(read_source(file))
    for rel, path in _package_half(split, PKG_DOC_FILES):
        try:
            source = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        yield rel, _docstring_paragraphs(source)
    seen = set()
    for dist in sorted(importlib.metadata.distributions(),
                       key=lambda d: (d.metadata.get("Name") or "").lower()):
        name = (dist.metadata.get("Name") or "").lower()
        if not name or name in seen or name == OWN_DISTRIBUTION or package_half(name) != split:
            continue
        seen.add(name)
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        yield f"dist/{name}", [prose_paragraphs(body)]


@lru_cache(maxsize=2)
def _passages(split: str) -> tuple[tuple[str, str, str], ...]:
    """(task, id, text) of one half's documentation passages. Each paragraph goes to one task,
    by a hash of where it is: `rewrite` takes it alone, `summarize` joins it with up to two
    following paragraphs of the same task; no paragraph is used twice, and a document gives
    at most PER_FILE passages to each task."""
    out = []
    for doc_id, docs in _documents(split):
        taken = {"summarize": 0, "rewrite": 0}
        for d, paras in enumerate(docs):
            keys = [f"{doc_id}:{d}:{i}" for i in range(len(paras))]
            tasks = [("summarize", "rewrite")[_hash(k) % 2] for k in keys]
            i = 0
            while i < len(paras):
                task, n, text = tasks[i], 1, None
                if taken[task] < PER_FILE and task == "rewrite" and _fits(paras[i], PARA_CHARS):
                    text = paras[i]
                elif taken[task] < PER_FILE and task == "summarize":
                    for n in (1, 2, 3):
                        run = paras[i:i + n]
                        if len(run) < n or tasks[i + n - 1] != task:
                            break
                        if _fits("\n\n".join(run), SUMMARY_CHARS):
                            text = "\n\n".join(run)
                            break
                if text is None:
                    i += 1
                    continue
                out.append((task, keys[i], text))
                taken[task] += 1
                i += n
    return tuple(out)


SUMMARIZE = (
    "Summarize the following text in two or three sentences.",
    "Give a short summary of this passage from a piece of software documentation.",
    "Read the text below and write a one-paragraph summary of its main points.",
)
REWRITE = (
    "Rewrite the following paragraph in plain, simple English for a beginner, keeping its "
    "meaning.",
    "Rephrase this paragraph so that someone new to programming can follow it.",
    "Make the following paragraph shorter and easier to read without losing any facts.",
)


def summarize_prompts(split: str) -> list[Prompt]:
    """`inst-summarize`: documentation passages to summarize."""
    return [Prompt(id=f"summarization:{key}", text=f"{_pick(SUMMARIZE, key)}\n\n{text}",
                   source="", category="summarization", kind="instruction")
            for task, key, text in _passages(split) if task == "summarize"]


def rewrite_prompts(split: str) -> list[Prompt]:
    """`inst-rewrite`: documentation paragraphs to rewrite simply."""
    return [Prompt(id=f"rewrite:{key}", text=f"{_pick(REWRITE, key)}\n\n{text}",
                   source="", category="rewrite", kind="instruction")
            for task, key, text in _passages(split) if task == "rewrite"]


# --- everyday questions: inst-qa --------------------------------------------------------------

# topic: (details, one of which follows the context; slot word lists; [(context with slots,
# questions that follow from it)])
QA_TOPICS: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, ...]],
                           list[tuple[str, tuple[str, ...]]]]] = {
    "travel": (
        ("None of us speaks the local language.",
         "We would rather avoid crowded tourist spots.",
         "We land late in the evening on the first day.",
         "One of us gets tired quickly when walking a lot."),
        {"days": ("three", "five", "seven", "ten"),
         "city": ("Lisbon", "Kyoto", "Montreal", "Cape Town", "Edinburgh", "Mexico City",
                  "Hanoi", "Vienna"),
         "season": ("spring", "summer", "autumn", "winter"),
         "company": ("two small children", "my elderly parents", "a group of friends",
                     "my partner"),
         "budget": ("800", "1,500", "3,000")},
        [("I am planning a {days}-day trip to {city} in {season} with {company}.",
          ("What should I pack, and what can I leave at home?",
           "How could we split the days between sightseeing and rest?",
           "Which mistakes do first-time visitors there usually make?",
           "How far ahead should I book transport and a place to stay?")),
         ("We are visiting {city} for the first time this {season} and have a budget of about "
          "{budget} dollars for {days} days, not counting flights.",
          ("How can we make the money last without missing the best things?",
           "Is it better to stay in one neighbourhood or to move around?",
           "What should we know about getting around the city cheaply?"))]),
    "cooking": (
        ("I am not a confident cook and would like to avoid anything fiddly.",
         "My oven is small, but I have two hobs and a microwave.",
         "I would like to spend as little as possible on extra shopping."),
        {"n": ("four", "six", "eight"),
         "diet": ("is vegetarian", "cannot eat gluten", "is allergic to nuts",
                  "does not eat dairy"),
         "a": ("chicken thighs", "a block of tofu", "two zucchinis", "a bag of spinach",
               "leftover salmon", "a can of chickpeas"),
         "b": ("mushrooms", "bell peppers", "half a cabbage", "sweet potatoes", "eggs"),
         "minutes": ("thirty", "forty-five", "ninety")},
        [("I am cooking dinner for {n} people tonight and one of the guests {diet}.",
          ("What main dish could I make that everyone can eat?",
           "Which parts of the meal can I prepare in the morning without losing quality?",
           "What simple dessert would work for the whole table?")),
         ("I have {a}, {b} and some rice at home, and about {minutes} minutes before dinner.",
          ("What could I cook with just these, and in what order should I do things?",
           "How do I season this so it does not taste bland?",
           "How should I store the leftovers, and for how long are they safe?"))]),
    "plants": (
        ("The room is heated and the air is quite dry in winter.",
         "I have had the plant for about a year and it did well until recently.",
         "I am a beginner and do not know much about soil or fertiliser."),
        {"plant": ("monstera", "basil plant", "fiddle-leaf fig", "snake plant", "tomato plant",
                   "orchid"),
         "symptom": ("yellow leaves", "brown, crispy leaf edges", "drooping stems",
                     "small white spots on the leaves"),
         "weeks": ("two", "three", "six"),
         "freq": ("every day", "twice a week", "once a week"),
         "light": ("a north-facing window", "a bright balcony", "almost no direct sun")},
        [("My {plant} has had {symptom} for the past {weeks} weeks, although I water it {freq}.",
          ("What could be causing this, and how can I fix it?",
           "Should I repot it, and if so, how?",
           "How can I tell whether I am watering too much or too little?")),
         ("I just moved into a flat with {light} and would like to grow a {plant} there.",
          ("Will it do well in that spot, and what would help it?",
           "What soil, pot and fertiliser should I buy to start?"))]),
    "fitness": (
        ("I have a slightly sore knee now and then, nothing serious.",
         "I get bored easily when a routine repeats itself.",
         "I would rather not buy expensive equipment."),
        {"age": ("thirty-five", "forty-eight", "sixty", "twenty-two"),
         "sport": ("running", "swimming", "cycling", "strength training", "yoga"),
         "minutes": ("twenty", "thirty", "forty-five"),
         "goal": ("run a 10 km race", "climb stairs without getting out of breath",
                  "get stronger without a gym", "improve my posture")},
        [("I am {age} years old, I have not exercised for years, and I would like to {goal}.",
          ("How should I start so that I do not get injured or give up?",
           "What would a realistic plan for the first two months look like?",
           "How can I tell whether I am making progress?")),
         ("I can spare about {minutes} minutes a day for {sport}, usually in the evening.",
          ("How should I structure a week of sessions?",
           "What should I eat before and after a session?",
           "Is it a problem to train on consecutive days?"))]),
    "money": (
        ("My income is fairly steady, but my expenses vary from month to month.",
         "I have never really tracked where my money goes.",
         "I share a flat and split the bills with one other person."),
        {"income": ("2,400", "3,100", "4,500"),
         "thing": ("a used car", "a new laptop", "a wedding", "a move to another city",
                   "a month of travel"),
         "months": ("six", "twelve", "eighteen"),
         "debt": ("a credit card balance", "a student loan", "a small personal loan")},
        [("I take home about {income} dollars a month and want to save for {thing} within "
          "{months} months.",
          ("How should I set up a budget that I will actually follow?",
           "Which everyday costs are usually the easiest to cut?",
           "Where should I keep the savings in the meantime?")),
         ("Besides rent and bills, I am paying off {debt} and I have no savings yet.",
          ("Should I pay off the debt first or build an emergency fund?",
           "How big should an emergency fund be for someone like me?"))]),
    "learning": (
        ("I tried once before and gave up after a few weeks.",
         "I learn best when I can see my progress.",
         "I can only practise in short sessions on weekdays."),
        {"subject": ("Spanish", "the piano", "statistics", "drawing", "chess", "touch typing"),
         "hours": ("three", "five", "eight"),
         "level": ("a complete beginner", "rusty after a long break",
                   "stuck at an intermediate level")},
        [("I want to learn {subject} in my free time and I am {level}; I have about {hours} "
          "hours a week.",
          ("How should I organise my practice to keep improving?",
           "Which habits help most when learning something alone?",
           "How do I stay motivated once the first excitement is gone?",
           "What should I be able to do after three months if things go well?"))]),
    "work": (
        ("I have been in this job for less than a year.",
         "I get along well with most of my colleagues.",
         "I find it hard to speak up in meetings."),
        {"role": ("a junior accountant", "a nurse", "a software developer", "a teacher",
                  "a shop manager"),
         "problem": ("too many meetings", "a colleague who takes credit for my work",
                     "unclear priorities from my manager", "constant interruptions"),
         "event": ("a job interview", "my first performance review",
                   "a presentation to senior management")},
        [("I work as {role} and I am struggling with {problem}.",
          ("How could I raise this with my manager without sounding negative?",
           "What can I change on my own side this week?",
           "How do other people in similar jobs usually handle this?")),
         ("I work as {role} and have {event} next week.",
          ("How should I prepare, day by day?",
           "Which questions should I expect, and how should I answer them?"))]),
    "pets": (
        ("We live in a flat with a small balcony and no garden.",
         "Neither of us has had an animal before.",
         "Our neighbours are friendly but sensitive to noise."),
        {"pet": ("a puppy", "an older cat", "a rescue dog", "two guinea pigs", "a parrot"),
         "issue": ("chews on the furniture", "does not eat much", "is afraid of visitors",
                   "wakes us up every night"),
         "months": ("two", "four", "eight")},
        [("We adopted {pet} {months} months ago and it {issue}.",
          ("What might be behind this behaviour?",
           "How can we help it settle without punishing it?",
           "When should we ask a vet or a trainer for help?")),
         ("We are thinking about adopting {pet}, but both of us work full time.",
          ("Is that fair to the animal, and what would we need to arrange?",
           "What does a typical week of care involve?"))]),
    "home": (
        ("I have a basic toolbox but little experience with repairs.",
         "My landlord is slow to answer messages.",
         "I would like to avoid making things worse."),
        {"problem": ("a dripping kitchen tap", "a door that will not close properly",
                     "mould in the bathroom corner", "a radiator that stays cold at the top",
                     "a squeaky floorboard"),
         "house": ("a rented flat", "an old terraced house", "a small apartment"),
         "room": ("the living room", "a home office", "a child's bedroom")},
        [("I live in {house} and there is {problem}.",
          ("Can I fix it myself, and which tools would I need?",
           "What is probably causing it?",
           "When is it better to call a professional?")),
         ("I want to repaint {room} in {house} over one weekend.",
          ("What should I buy, and how do I prepare the walls?",
           "In what order should I do the work so it is dry by Monday?"))]),
    "tech": (
        ("I am comfortable with basic settings but not with anything technical.",
         "I do not want to lose any photos or messages.",
         "I would rather not pay for extra software."),
        {"device": ("laptop", "phone", "home router", "tablet", "desktop computer"),
         "symptom": ("has become very slow", "keeps losing the Wi-Fi connection",
                     "runs out of battery by midday", "shows a full storage warning"),
         "years": ("two", "four", "six"),
         "who": ("my father", "my grandmother", "a neighbour who rarely uses computers")},
        [("My {device} is {years} years old and {symptom}.",
          ("What should I check first, before thinking about replacing it?",
           "Which settings usually make the biggest difference?",
           "How do I back up my data safely before trying fixes?")),
         ("I am helping {who} set up a new {device}.",
          ("Which security settings matter most for them?",
           "How can I make it simpler to use every day?"))]),
    "sleep": (
        ("I often wake up once or twice during the night.",
         "I feel tired in the early afternoon most days.",
         "I share the bedroom with a partner who goes to bed later."),
        {"hours": ("five", "six", "seven"),
         "habit": ("look at my phone in bed", "drink coffee in the afternoon",
                   "work late into the evening", "exercise just before bed"),
         "shift": ("night shifts", "early morning shifts", "a long commute")},
        [("I usually sleep about {hours} hours a night and I {habit}.",
          ("Could that habit be affecting my sleep, and how?",
           "What evening routine would help me fall asleep faster?",
           "How long does it take for a new routine to make a difference?")),
         ("Because of {shift}, my sleep times change every week.",
          ("How can I rest well despite the changing schedule?",
           "What should I eat and drink around the shifts?"))]),
    "events": (
        ("This is the first time I organise something like this.",
         "Some guests have small children, and a few are vegetarian.",
         "I want it to feel relaxed rather than formal."),
        {"event": ("a birthday party for a seven-year-old", "a small garden wedding",
                   "a farewell party for a colleague", "a family reunion"),
         "guests": ("fifteen", "thirty", "sixty"),
         "weeks": ("two", "five", "ten"),
         "place": ("a small flat", "a rented hall", "a park")},
        [("I am organising {event} for about {guests} guests in {place}, {weeks} weeks from "
          "now.",
          ("What should I take care of first, and what can wait?",
           "How much food and drink should I plan for?",
           "What could go wrong on the day, and how do I prepare for it?",
           "How can I keep the cost down without it feeling cheap?"))]),
}
QA_STYLES = (
    "Please answer in a short paragraph.",
    "Give me three concrete suggestions.",
    "Explain your reasoning briefly.",
    "Keep the answer under 150 words.",
    "A step-by-step answer would help.",
    "Please mention anything I should avoid.",
)
QA_FILLINGS = 5  # slot fillings per (context, question)


def _fill(template: str, slots: dict[str, tuple[str, ...]], key: str) -> str:
    names = [n for n in slots if "{" + n + "}" in template]
    return template.format(**{n: _pick(slots[n], f"{key}:{n}") for n in names})


@lru_cache(maxsize=1)
def _questions() -> tuple[tuple[str, str, str], ...]:
    """(half, id, text) of every everyday question: each (topic, context, question) filled
    QA_FILLINGS ways, duplicates dropped, halved by a hash of the text."""
    out, seen = [], set()
    for topic, (details, slots, pairs) in QA_TOPICS.items():
        for c, (context, questions) in enumerate(pairs):
            for q, question in enumerate(questions):
                for f in range(QA_FILLINGS):
                    key = f"{topic}:{c}:{q}:{f}"
                    text = " ".join((_fill(context, slots, key), _pick(details, f"{key}:d"),
                                     question, _pick(QA_STYLES, f"{key}:style")))
                    if text in seen:
                        continue
                    seen.add(text)
                    out.append((HALVES[_hash(text) % 2], f"qa:{key}", text))
    return tuple(out)


def qa_prompts(split: str) -> list[Prompt]:
    """`inst-qa`: everyday questions, each with a sentence of context."""
    return [Prompt(id=pid, text=text, source="", category="qa", kind="instruction")
            for half, pid, text in _questions() if half == split]


# --- the sets ----------------------------------------------------------------------------------

BUILDERS: dict[str, tuple[str, Callable[[str], list[Prompt]]]] = {
    "explain": ("explain what a stdlib function does, given its source", explain_prompts),
    "docstring-code": ("write a function from its signature and docstring",
                       docstring_code_prompts),
    "summarize": ("summarize one to three paragraphs of documentation (stdlib and installed "
                  "packages)", summarize_prompts),
    "rewrite": ("rewrite a paragraph of documentation in plain words", rewrite_prompts),
    "qa": ("everyday questions with a sentence of context, from templates and word lists",
           qa_prompts),
}


def _limited(prompts: list[Prompt]) -> list[Prompt]:
    """At most MAX_PER_SET prompts, those first in the order of a hash of their ids (kept in
    their original order)."""
    if len(prompts) <= MAX_PER_SET:
        return prompts
    keep = set(sorted(range(len(prompts)), key=lambda i: _hash(prompts[i].id))[:MAX_PER_SET])
    return [p for i, p in enumerate(prompts) if i in keep]


@lru_cache(maxsize=16)
def instruction_prompts(name: str, split: str) -> tuple[Prompt, ...]:
    """The prompts of `inst-NAME` (split `collect`) or its twin `inst-NAME-eval` (`eval`);
    NAME `mix` is every category together."""
    from dataclasses import replace

    suffix = "" if split == "collect" else "-eval"
    if name == "mix":
        prompts = [p for n in BUILDERS for p in instruction_prompts(n, split)]
    else:
        prompts = BUILDERS[name][1](split)
        if split == "eval":  # a docstring or function two files share stays on one side
            taken = set().union(*map(_pieces, BUILDERS[name][1]("collect")))
            if name in ("summarize", "rewrite"):
                taken |= {para for _, _, text in _passages("collect")
                          for para in text.split("\n\n")}
            prompts = [p for p in prompts if not _pieces(p) & taken]
        prompts = _limited(prompts)
    return tuple(replace(p, source=f"inst-{name}{suffix}") for p in prompts)


def _pieces(prompt: Prompt) -> set[str]:
    """What a prompt is made of, besides its instruction: its material (code, a question) or,
    for documentation passages, each paragraph."""
    material = prompt.text.split("\n\n", 1)[-1] if prompt.category != "qa" else prompt.text
    if prompt.category in ("summarization", "rewrite"):
        return set(material.split("\n\n"))
    return {material}


def instruction_sets() -> dict[str, tuple[str, Callable[[], tuple[Prompt, ...]]]]:
    """name -> (what it holds, loader) of every instruction set and its evaluation twin."""
    sets = {}
    for name, (what, _) in [*BUILDERS.items(), ("mix", ("every category above together", None))]:
        sets[f"inst-{name}"] = (f"{what} (collection)",
                                lambda n=name: instruction_prompts(n, "collect"))
        sets[f"inst-{name}-eval"] = (f"the same, held out (evaluation twin of inst-{name})",
                                     lambda n=name: instruction_prompts(n, "eval"))
    return sets
