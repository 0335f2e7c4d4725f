"""Chat formatting (mcsd_runtime.prompts.chat): auto/on/off, one BOS, chat messages into
`generate`, the prompt format recorded by collections and stopper artifacts, and the refusal of
a stopper on prompts formatted otherwise than it was trained on."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from tokenizers import processors
from transformers import AutoTokenizer

from mcsd_runtime import cli
from mcsd_runtime.decisions.artifact import ArtifactSpec
from mcsd_runtime.decode.decoder import DecodeConfig, MCSDDecoder
from mcsd_runtime.errors import MCSDError
from mcsd_runtime.models.pair import Pair
from mcsd_runtime.prompts.chat import (
    check_format,
    combine_formats,
    encode_prompt,
    format_prompt,
    prompt_format,
    template_hash,
)
from mcsd_runtime.prompts.domains import Prompt

# Llama-2/3 style: the template writes the BOS itself (and the toy tokenizer adds one too).
LLAMA_STYLE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n"
               "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")
# SmolLM2 style: no bos_token in the template, and a tokenizer that adds none.
SMOL_STYLE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
FIXTURE = Path(__file__).parent / "fixtures" / "stoppers-b8df3aa" / "lightgbm"
INSTRUCTION = Prompt("q1", "Explain what a KV cache stores.", "test", "qa", "instruction")
TEXT = Prompt("c1", "def add(a, b):\n    return", "test")


def toy_tokenizer(toy_tiny: Path, template: str | None, bos: bool = True):
    tok = AutoTokenizer.from_pretrained(toy_tiny / "target")
    if not bos:
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="$A", pair="$A $B", special_tokens=[])
    tok.chat_template = template
    return tok


def test_auto_on_off(toy_tiny):
    tok = toy_tokenizer(toy_tiny, LLAMA_STYLE)
    chat = "<|bos|>[user] Explain what a KV cache stores.\n[assistant] "
    assert format_prompt(INSTRUCTION, tok, "auto") == chat
    assert format_prompt(TEXT, tok, "auto") == TEXT.text  # text stays raw
    assert format_prompt(TEXT, tok, "on").startswith("<|bos|>[user] def add")
    assert format_prompt(INSTRUCTION, tok, "off") == INSTRUCTION.text
    plain = toy_tokenizer(toy_tiny, None)  # no template: auto leaves everything raw
    assert format_prompt(INSTRUCTION, plain, "auto") == INSTRUCTION.text
    with pytest.raises(MCSDError, match="--chat on needs a tokenizer with a chat template"):
        format_prompt(INSTRUCTION, plain, "on")
    with pytest.raises(MCSDError, match="--chat 'yes'"):
        format_prompt(INSTRUCTION, tok, "yes")


def test_templated_prompts_get_one_bos(toy_tiny):
    tok = toy_tokenizer(toy_tiny, LLAMA_STYLE)
    bos = tok.bos_token_id
    ids = encode_prompt(INSTRUCTION, tok, "auto")
    assert ids[0] == bos and bos not in ids[1:]  # the template's, not a second one
    assert tok(format_prompt(INSTRUCTION, tok))["input_ids"][:2] == [bos, bos]  # the trap
    assert ids == tok.apply_chat_template([{"role": "user", "content": INSTRUCTION.text}],
                                          add_generation_prompt=True, tokenize=True)["input_ids"]
    raw = encode_prompt(TEXT, tok, "auto")  # raw text: the tokenizer's own BOS, once
    assert raw == tok(TEXT.text)["input_ids"] and raw[0] == bos and bos not in raw[1:]
    smol = toy_tokenizer(toy_tiny, SMOL_STYLE, bos=False)
    assert bos not in encode_prompt(INSTRUCTION, smol)  # SmolLM2: neither adds one
    assert encode_prompt([5, 6, 7], tok, "on") == [5, 6, 7]  # token ids pass as they are


def test_generate_takes_chat_messages(toy_pair, toy_tiny):
    messages = [{"role": "user", "content": INSTRUCTION.text}]
    config = DecodeConfig(k_config=(2, 1), max_new_tokens=6)
    for template, bos in ((SMOL_STYLE, False), (LLAMA_STYLE, True)):
        tok = toy_tokenizer(toy_tiny, template, bos=bos)
        dec = MCSDDecoder(Pair(toy_pair.target, toy_pair.draft, tok), config, "static")
        text = format_prompt(INSTRUCTION, tok, "on")
        assert dec.encode(messages) == encode_prompt(INSTRUCTION, tok)  # one BOS at most
        out = dec.generate(messages)
        assert out.token_ids == dec.generate(encode_prompt(INSTRUCTION, tok)).token_ids
        if not bos:  # the tokenizer adds nothing: the templated text is the same prompt
            assert out.token_ids == dec.generate(text).token_ids
        batch = dec.generate_batch([messages, TEXT.text], batch_size=2).results
        assert batch[0].token_ids == out.token_ids
        assert batch[1].token_ids == dec.generate(TEXT.text).token_ids  # str: unchanged
    plain = MCSDDecoder(toy_pair, config, "static")
    with pytest.raises(MCSDError, match="chat template"):
        plain.generate(messages)
    with pytest.raises(MCSDError, match="'role' and a 'content'"):
        dec.generate([{"role": "user"}])


def test_recorded_formats(toy_tiny):
    tok = toy_tokenizer(toy_tiny, SMOL_STYLE, bos=False)
    h = template_hash(tok)
    assert prompt_format([INSTRUCTION], tok) == {"format": "chat", "template_hash": h}
    assert prompt_format([TEXT], tok) == {"format": "text", "template_hash": None}
    assert prompt_format([INSTRUCTION, TEXT], tok)["format"] == "mixed"
    assert prompt_format([INSTRUCTION], tok, "off")["format"] == "text"
    assert combine_formats([None, {"format": "chat", "template_hash": h}])["format"] == "mixed"
    assert combine_formats([None, None]) == {"format": "text", "template_hash": None}
    chat = {"format": "chat", "template_hash": h}
    with pytest.raises(MCSDError) as err:
        check_format(None, chat, "stopper:old")  # an old artifact was trained on text
    assert "formatted as text" in str(err.value) and "--chat off" in str(err.value)
    assert "--allow-format-mismatch" in str(err.value)
    assert check_format(None, {"format": "text"}, "stopper:old") is None
    assert check_format({"format": "mixed"}, chat, "s") is None  # trained on both kinds
    assert "warning" in check_format(chat, None, "s", allow=True)
    with pytest.raises(MCSDError, match="another chat template"):
        check_format(chat, {"format": "chat", "template_hash": "0" * 16}, "s")


def test_artifact_keeps_the_format_and_reads_old_ones_as_text(tmp_path):
    spec = ArtifactSpec.read(FIXTURE)
    assert spec.prompt_format is None and "prompt_format" not in spec.to_json()
    chat = {"format": "chat", "template_hash": "abc"}
    replace(spec, prompt_format=chat).write(tmp_path)
    assert ArtifactSpec.read(tmp_path).prompt_format == chat
    with pytest.raises(MCSDError, match="prompt_format"):
        replace(spec, prompt_format={"format": "html"})


@pytest.fixture(scope="module")
def chat_pair_dirs(toy_tiny, tmp_path_factory) -> tuple[Path, Path]:
    """The tiny toy pair's folders with a SmolLM2-style chat template on the tokenizer."""
    root = tmp_path_factory.mktemp("chat-toy")
    for part in ("target", "draft"):
        shutil.copytree(toy_tiny / part, root / part)
        tok = toy_tokenizer(toy_tiny, SMOL_STYLE, bos=False)
        tok.save_pretrained(root / part)
    return root / "target", root / "draft"


def _stopper(folder: Path, prompt_format: dict | None) -> str:
    folder.mkdir(parents=True)
    spec = replace(ArtifactSpec.read(FIXTURE), pair_fingerprint=None, k_config=(2, 1),
                   prompt_format=prompt_format)
    spec.write(folder)
    shutil.copy(FIXTURE / "model.txt", folder / "model.txt")
    return f"stopper:{folder}"


def test_collect_records_the_format_and_a_stopper_trained_on_chat_is_refused_on_text(
        chat_pair_dirs, tmp_path, capsys):
    """collect's manifest records chat; a stopper with that format is refused by eval and
    bench on the same prompts sent raw (--chat off), runs with --allow-format-mismatch, and an
    old artifact (no field: text) runs on raw prompts without a word."""
    from collect.cli import register as collect_register
    from mcsd_runtime.cli.bench import register as bench_register
    from mcsd_runtime.cli.eval import register as eval_register

    target, draft = map(str, chat_pair_dirs)
    pair = ["--target", target, "--draft", draft, "--device", "cpu", "--k-config", "2,1",
            "--max-new-tokens", "4"]
    parser = cli.build_parser([collect_register, eval_register, bench_register])
    prompts = ["--prompts", "inst-qa", "--limit", "2"]
    assert cli.run_parser(parser, ["collect", *pair, *prompts, "--out", str(tmp_path / "c"),
                                   "--no-progress", "--dtype", "fp32"]) == 0
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    fmt = manifest["prompt_format"]
    assert fmt["format"] == "chat" and fmt["template_hash"] and manifest["chat"] == "auto"
    # resuming with the prompts sent raw is another collection
    code = cli.run_parser(parser, ["collect", *pair, *prompts, "--out", str(tmp_path / "c"),
                                   "--no-progress", "--dtype", "fp32", "--chat", "off"])
    assert code == 2 and "different prompt_format" in capsys.readouterr().err

    chat_stopper = _stopper(tmp_path / "chat-stopper", fmt)
    old_stopper = _stopper(tmp_path / "old-stopper", None)
    run = ["eval", *pair, *prompts, "--methods", f"ar,{chat_stopper}"]
    code = cli.run_parser(parser, [*run, "--chat", "off", "--out", str(tmp_path / "e1")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "trained on prompts formatted as chat" in err and "formatted as text" in err
    assert "--chat on" in err and "--allow-format-mismatch" in err
    assert not (tmp_path / "e1" / "summary.json").exists()
    code = cli.run_parser(parser, ["bench", *pair, *prompts, "--stopper", chat_stopper,
                                   "--chat", "off"])
    assert code == 2 and "trained on prompts formatted as chat" in capsys.readouterr().err
    assert cli.run_parser(parser, [*run, "--chat", "off", "--allow-format-mismatch",
                                   "--out", str(tmp_path / "e2")]) == 0
    assert "warning (--allow-format-mismatch)" in capsys.readouterr().out
    assert cli.run_parser(parser, [*run, "--out", str(tmp_path / "e3")]) == 0  # auto: chat
    settings = json.loads((tmp_path / "e3" / "summary.json").read_text())["settings"]
    assert settings["prompt_format"] == fmt and settings["chat"] == "auto"
    old = ["eval", *pair, "--prompts", "toy-code", "--limit", "1", "--methods",
           f"ar,{old_stopper}", "--out", str(tmp_path / "e4")]
    assert cli.run_parser(parser, old) == 0
    assert "warning" not in capsys.readouterr().out
