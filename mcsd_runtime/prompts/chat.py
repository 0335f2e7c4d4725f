"""How a prompt reaches the model: raw, or inside the tokenizer's chat template. One function
decides it (`format_prompt`, with `encode_prompt` for the token ids) for every command.

A prompt (`mcsd_runtime.prompts.domains.Prompt`) is `text` to continue as it is (code, prose) or
an `instruction`, a user's turn. The `chat` setting (`--chat` on collect, eval, bench, profile):

- `auto` (default): an instruction goes inside the tokenizer's chat template, as one user message
  followed by the opened assistant turn (`apply_chat_template([{"role": "user", "content":
  text}], add_generation_prompt=True)`), when the tokenizer has a template; text prompts, and
  every prompt of a tokenizer without a template (the toy pair's), stay raw;
- `on`: every prompt, text ones too, inside the template; a tokenizer without one is refused;
- `off`: every prompt raw.

Templated text is tokenized without the tokenizer's own special tokens, as transformers'
`apply_chat_template(tokenize=True)` does: a template writes those it wants (Llama-2's and
Llama-3's start with `{{ bos_token }}`), so a tokenizer that adds a BOS would otherwise put a
second one in front. (SmolLM2-135M-Instruct's template opens with `<|im_start|>`, its BOS token,
and its tokenizer adds none: the same ids either way.) Raw text is tokenized as the tokenizer
does by default, with its BOS where it adds one.

What a run used is recorded as `prompt_format` (`{"format": "chat" | "text" | "mixed",
"template_hash": ...}`) in a collection's manifest and, from its training data, in a trained
stopper's stopper.json; `check_format` refuses a stopper on prompts formatted otherwise than
those it was trained on, unless asked. A manifest or stopper without the field is `text`: no
collection before the field applied a chat template.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeGuard

from mcsd_runtime.errors import MCSDError

CHAT_MODES = ("auto", "on", "off")
DEFAULT_CHAT = "auto"
KINDS = ("text", "instruction")
TEXT_FORMAT = {"format": "text", "template_hash": None}
CHAT_HELP = ("how prompts reach the model: auto (default) wraps instruction prompts (benchmarks, "
             "inst-* sets) in the tokenizer's chat template when it has one and leaves text "
             "prompts (code, prose) raw; on wraps every prompt and needs a template; off wraps "
             "none")


def add_chat_arg(parser: Any) -> None:
    """`--chat {auto,on,off}`, the one prompt-format option of every decoding command."""
    parser.add_argument("--chat", default=DEFAULT_CHAT, choices=CHAT_MODES, help=CHAT_HELP)


def chat_template(tokenizer: Any) -> str | None:
    """The tokenizer's chat template (None if it has none, or for no tokenizer)."""
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default")
    return template if isinstance(template, str) and template.strip() else None


def template_hash(tokenizer: Any) -> str | None:
    """A short hash of the tokenizer's chat template (None without one)."""
    template = chat_template(tokenizer)
    return hashlib.sha256(template.encode()).hexdigest()[:16] if template else None


def check_chat(chat: str) -> None:
    if chat not in CHAT_MODES:
        raise MCSDError(f"--chat {chat!r}: use one of {', '.join(CHAT_MODES)}")


def _kind(prompt: Any) -> str:
    return getattr(prompt, "kind", "text")


def _text(prompt: Any) -> Any:
    """A Prompt's text (a str, or token ids), or the prompt itself given as a str or ids."""
    return getattr(prompt, "text", prompt)


def uses_template(prompt: Any, tokenizer: Any, chat: str = DEFAULT_CHAT) -> bool:
    """Whether `prompt` (a Prompt, or a str: a text prompt) goes inside the chat template under
    `chat`; MCSDError for `on` with a tokenizer without a template. A prompt given as token ids
    is never wrapped."""
    check_chat(chat)
    if chat == "off" or not isinstance(_text(prompt), str):
        return False
    if chat_template(tokenizer) is None:
        if chat == "on":
            raise MCSDError("--chat on needs a tokenizer with a chat template, and this pair's "
                            "has none; use --chat auto or off (raw prompts), or a chat model")
        return False
    return chat == "on" or _kind(prompt) == "instruction"


def apply_template(messages: Sequence[Mapping[str, str]], tokenizer: Any) -> str:
    """`messages` ([{"role": "user", "content": ...}, ...]) in the tokenizer's chat template,
    the assistant's turn opened; MCSDError if it has none or the template refuses them."""
    check_messages(messages)
    if chat_template(tokenizer) is None:
        raise MCSDError("chat messages need a tokenizer with a chat template, and this pair's "
                        "has none: pass the prompt as text or token ids")
    try:
        text = tokenizer.apply_chat_template([dict(m) for m in messages],
                                             add_generation_prompt=True, tokenize=False)
    except Exception as err:  # noqa: BLE001 - jinja raises its own errors from inside templates
        raise MCSDError(f"the tokenizer's chat template refused these messages: "
                        f"{type(err).__name__}: {err}") from None
    if not isinstance(text, str):
        raise MCSDError("the tokenizer's apply_chat_template did not return text")
    return text


def format_prompt(prompt: Any, tokenizer: Any, chat: str = DEFAULT_CHAT) -> str:
    """The text given to the model for `prompt` (a Prompt, or a str: a text prompt) under
    `chat` (see the module docstring)."""
    text = _text(prompt)
    if uses_template(prompt, tokenizer, chat):
        return apply_template([{"role": "user", "content": text}], tokenizer)
    return text


def tokenize(text: str, tokenizer: Any, templated: bool) -> list[int]:
    """Token ids of `text`: templated text without the tokenizer's own special tokens (the
    template wrote those it wants), raw text as the tokenizer encodes it by default."""
    if tokenizer is None:
        raise MCSDError("this pair has no tokenizer: pass the prompt as token ids")
    if templated:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])


def encode_prompt(prompt: Any, tokenizer: Any, chat: str = DEFAULT_CHAT) -> list[int]:
    """The token ids given to the model for `prompt` under `chat` (`format_prompt`, tokenized
    without a second BOS where the template was applied); a prompt whose text is token ids
    already gives them as they are."""
    if not isinstance(_text(prompt), str):
        return [int(i) for i in _text(prompt)]
    if tokenizer is None:
        raise MCSDError("this pair has no tokenizer; pass a pair loaded from model folders")
    templated = uses_template(prompt, tokenizer, chat)
    return tokenize(format_prompt(prompt, tokenizer, chat), tokenizer, templated)


def is_messages(prompt: Any) -> TypeGuard[Sequence[Mapping[str, str]]]:
    """Whether `prompt` is a list of chat messages (mappings) rather than a text or token ids."""
    return (isinstance(prompt, list | tuple) and len(prompt) > 0
            and all(isinstance(m, Mapping) for m in prompt))


def check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    if not is_messages(messages):
        raise MCSDError("chat messages must be a non-empty list of {'role': ..., 'content': ...}")
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise MCSDError(f"chat message {i} needs a 'role' and a 'content' string, got "
                            f"{dict(m)!r}")


def encode_messages(messages: Sequence[Mapping[str, str]], tokenizer: Any) -> list[int]:
    """Token ids of chat `messages` in the tokenizer's template, the assistant's turn opened."""
    return tokenize(apply_template(messages, tokenizer), tokenizer, templated=True)


# --- the recorded format ---------------------------------------------------------------------


def prompt_format(prompts: Iterable[Any], tokenizer: Any, chat: str = DEFAULT_CHAT) -> dict:
    """What `chat` makes of `prompts` with this tokenizer: `{"format": "chat"` (every prompt
    templated), `"text"` (none) or `"mixed", "template_hash": ...}` (the hash where any prompt
    was templated, else None)."""
    used = {uses_template(p, tokenizer, chat) for p in prompts}
    fmt = "mixed" if len(used) > 1 else ("chat" if used == {True} else "text")
    return {"format": fmt, "template_hash": template_hash(tokenizer) if True in used else None}


def recorded_format(value: Any) -> dict:
    """A recorded `prompt_format` as a dict; a record without one (None, older files) is text."""
    if not value:
        return dict(TEXT_FORMAT)
    if not isinstance(value, Mapping) or value.get("format") not in ("chat", "text", "mixed"):
        raise MCSDError(f"prompt_format {value!r} is not a recorded prompt format (format chat, "
                        f"text or mixed)")
    return {"format": value["format"], "template_hash": value.get("template_hash")}


def _kinds(fmt: Mapping[str, Any]) -> set[str]:
    return {"chat", "text"} if fmt["format"] == "mixed" else {fmt["format"]}


def combine_formats(formats: Iterable[Any]) -> dict:
    """The format of several runs' prompts together (a training set of several collections)."""
    fmts = [recorded_format(f) for f in formats]
    kinds = set().union(*(_kinds(f) for f in fmts)) if fmts else {"text"}
    hashes = {f["template_hash"] for f in fmts if f["template_hash"]}
    if len(hashes) > 1:
        raise MCSDError("the runs' prompts were formatted with different chat templates; train "
                        "one stopper per template")
    fmt = "mixed" if len(kinds) > 1 else kinds.pop()
    return {"format": fmt, "template_hash": next(iter(hashes), None)}


def chat_mode_of(fmt: Any) -> str:
    """The `--chat` setting that reproduces a recorded format on the same prompts and tokenizer
    (chat: on, text: off, mixed: auto)."""
    return {"chat": "on", "text": "off", "mixed": "auto"}[recorded_format(fmt)["format"]]


DESCRIBE = {"chat": "chat (inside the tokenizer's chat template)",
            "text": "text (raw, no chat template)",
            "mixed": "mixed (instructions in the chat template, text raw)"}


def format_mismatch(trained: Any, used: Any) -> str | None:
    """Why prompts formatted as `used` are not what a stopper trained on `trained` saw (None if
    they are): another format (a mixed training set covers both), or another chat template."""
    trained, used = recorded_format(trained), recorded_format(used)
    if not _kinds(used) <= _kinds(trained):
        return (f"it was trained on prompts formatted as {DESCRIBE[trained['format']]}, but "
                f"these are formatted as {DESCRIBE[used['format']]}")
    a, b = trained["template_hash"], used["template_hash"]
    if a and b and a != b:
        return (f"it was trained on prompts in another chat template (hash {a}, these {b})")
    return None


def check_format(trained: Any, used: Any, who: str, allow: bool = False) -> str | None:
    """MCSDError when `who` (a trained stopper) was trained on prompts formatted otherwise than
    `used`, naming both and the fix; with `allow`, the message to print instead (None: no
    mismatch)."""
    why = format_mismatch(trained, used)
    if why is None:
        return None
    fix = {"chat": "--chat on", "text": "--chat off", "mixed": "--chat auto"}[
        recorded_format(trained)["format"]]
    message = (f"{who}: {why}. Format the prompts as it was trained ({fix}), or pass "
               f"--allow-format-mismatch to run it anyway")
    if not allow:
        raise MCSDError(message)
    return f"warning (--allow-format-mismatch): {message.split('. Format')[0]}"
