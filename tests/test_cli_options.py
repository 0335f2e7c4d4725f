"""One command line: every option's name, counted per command; the folded near-duplicates stay
folded (their old spellings, CHANGELOG.md lists them, are gone).

`python tests/test_cli_options.py` prints the inventory: the options of every command and the
`add_argument` calls in the source that define them."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import pytest

from mcsd_runtime.cli import build_parser, main
from mcsd_runtime.constants import GRAPHS

ROOT = Path(__file__).resolve().parent.parent
# issue 53 counted 164 `add_argument` calls over the commands and `python -m` scripts; folding
# near-duplicates and defining shared options once (mcsd_runtime.cli.args) took 20% off at least
DEFINITIONS_BEFORE = 164
# commands added since, with the options only they define (shared ones come from cli.args):
# ragged-bench --shape --counts --dtype; replay-batches --runs --cost-profile --batch-size
# --holdout --families --draft-scale --affine; export ARTIFACT --engine --category
# --max-batch-size, with train's --max-k (--decision schedule); the serving engine's options of
# collect (--from-vllm-log --force --vllm-method), eval (--concurrency), profile
# (--draft-lengths) and --engine, defined once in cli.args; the GPU check's stage scripts
# (eval_stage --records and its command, the preflight's --packages and --found, and two of
# scripts/gpu_check.py's); train --decision sts's --from-shards (DSpark's captured shards),
# --gamma (the engine's draft length) and --offsets (our budget's per-position offsets), which no
# option of cli.args means
NEW_COMMANDS = {"ragged-bench": 3, "replay-batches": 7, "export": 5, "serving": 6,
                "gpu-check stages": 6, "train --decision sts": 3}
DEFINITIONS_CEILING = int(DEFINITIONS_BEFORE * 0.8) + sum(NEW_COMMANDS.values())
# visible options per command today: a new option raises its command's figure here on purpose,
# after checking mcsd_runtime.cli.args for an option of the same meaning (and docs/cli.md)
CEILINGS = {
    "attention-bench": 10, "bench": 23, "collect": 33, "draft distill": 20, "draft show": 2,
    "drift": 15, "eval": 32, "profile": 21, "prompts": 5, "toy build": 5, "toy draft": 5,
    "toy info": 4, "train": 44, "step-breakdown": 19, "replay": 5, "ragged-bench": 8,
    "replay-batches": 8, "export": 5,
}
# old spelling -> (its new one, the commands it lived in): none of them may show in --help again
FOLDED = {
    "--ignore-eos": ("--eos", {"eval", "bench", "collect"}),
    "--stop-at-eos": ("--eos", {"train"}),
    "--profile": ("--cost-profile", {"train"}),
    "--k": ("--k-config", {"train"}),
    "--beside-draft": ("--k-config", {"train"}),
    "--data": ("--runs", {"train"}),
    "--from-runs": ("--runs", {"eval"}),
    "--check": ("--check-prompts", {"train"}),
    "--collections": ("--runs", {"replay"}),
    "--batch-sizes": ("--batch-size", {"profile"}),
    "--overhead-prompts": ("--prompts", {"profile"}),
    "--overhead-limit": ("--limit", {"profile"}),
    "--overhead-tokens": ("--max-new-tokens", {"profile"}),
    "--repeats": ("--rounds", {"profile"}),
    "--reps": ("--rounds", {"attention-bench"}),
    "--contexts": ("--context", {"attention-bench"}),
    "--prompt-limit": ("--limit", {"draft distill"}),
    "--preset": ("--recipe", {"toy build", "toy info"}),
}


def visible_options(parser: argparse.ArgumentParser) -> list[str]:
    """The options --help shows (hidden ones and the help option left out)."""
    return [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions
            if a.help is not argparse.SUPPRESS
            and not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction))
            and "--help" not in a.option_strings]


def commands(parser: argparse.ArgumentParser | None = None, prefix: str = "") -> dict:
    """Every command and subcommand of `mcsd` -> its parser."""
    parser = parser or build_parser()
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                sub = action.choices[choice.dest]
                name = f"{prefix} {choice.dest}".strip()
                nested = commands(sub, name)
                out |= nested or {name: sub}
    return out


def definitions(roots=("mcsd_runtime", "collect", "replay", "train")) -> dict[str, int]:
    """Source file -> its `add_argument` calls that define a visible option (not a hidden
    one, not a help option)."""
    counts = {}
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            n = 0
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "add_argument"):
                    continue
                kw = {k.arg: k.value for k in node.keywords}
                names = [a.value for a in node.args if isinstance(a, ast.Constant)]
                hidden = (isinstance(kw.get("help"), ast.Attribute)
                          and kw["help"].attr == "SUPPRESS")
                if not (hidden or "--help" in names):
                    n += 1
            if n:
                counts[str(path.relative_to(ROOT))] = n
    return counts


def test_options_per_command_stay_within_their_count():
    counts = {name: len(visible_options(p)) for name, p in commands().items()}
    assert set(counts) == set(CEILINGS), "a command came or went: update CEILINGS"
    over = {name: (n, CEILINGS[name]) for name, n in counts.items() if n > CEILINGS[name]}
    assert not over, f"more options than counted (now, counted): {over}"


def test_option_definitions_are_a_fifth_fewer():
    total = sum(definitions().values())
    assert total <= DEFINITIONS_CEILING, definitions()


def test_no_command_shows_a_folded_name_again():
    for name, parser in commands().items():
        shown = set(visible_options(parser))
        for old, (new, lived) in FOLDED.items():
            if name in lived:
                assert old not in shown, f"{name} shows {old} again: it is {new}"
                assert new in shown, f"{name} lost {new}"
    # a few names mean one thing everywhere: each is defined once, in mcsd_runtime.cli.args
    every = {o for p in commands().values() for o in visible_options(p)}
    assert not {"--profile", "--ignore-eos", "--stop-at-eos", "--from-runs", "--beside-draft",
                "--batch-sizes", "--reps", "--contexts", "--overhead-limit"} & every


OUT = ["--out", "o"]
TRAIN_COPY = ["--prompts", "p", "--out", "o"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--decision", "copy", "--runs", "r", *TRAIN_COPY, "--cost-profile", "c"],
     "--runs is an option of --decision stop, budget, schedule and sts, not of --decision "
     "copy"),
    (["--runs", "r", "--max-copy", "4", *OUT], "--max-copy is an option of --decision copy"),
    (["--decision", "width", "--temperature", "0.5", *TRAIN_COPY, "--cost-profile", "c"],
     "--temperature is an option of --decision copy, not of --decision width"),
    (["--decision", "copy", "--prompts", "p", *OUT], "--decision copy needs --cost-profile"),
    (["--decision", "width", "--cost-profile", "c", *OUT], "--decision width needs --prompts"),
])
def test_train_refuses_an_option_its_decision_does_not_take(argv, message, capsys):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_train_help_follows_the_decision(capsys):
    for decision, text in (("copy", "Training a learned prompt-lookup copy length"),
                           ("width", "A learned width: how many of the draft's"),
                           ("stop", "Prompts are split train/validation/test")):
        with pytest.raises(SystemExit):
            main(["train", "--decision", decision, "--help"])
        assert text in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = capsys.readouterr().out
    assert "--decision copy and width" in shown and "stop   (default)" in shown


def test_every_command_that_builds_a_decode_config_takes_graphs_and_eos():
    from mcsd_runtime.cli.args import decode_config_from_args

    every = commands()
    for name in ("eval", "bench", "collect", "profile", "drift"):
        graphs = next(a for a in every[name]._actions if "--graphs" in a.option_strings)
        assert tuple(graphs.choices) == GRAPHS and graphs.default == "auto"
    for name in ("eval", "bench", "collect"):
        args = build_parser().parse_args([name, "--graphs", "off", "--eos", "ignore"])
        config = decode_config_from_args(args)
        assert config.graphs == "off" and config.eos_token_ids == ()
        config = decode_config_from_args(build_parser().parse_args([name]))
        assert config.graphs == "auto" and config.eos_token_ids is None


def test_every_command_explains_itself(capsys):
    for name, parser in commands().items():
        assert parser.description, name
        for action in parser._actions:
            assert action.help, f"{name} {action.option_strings or action.dest}"


if __name__ == "__main__":
    for name, parser in sorted(commands().items()):
        shown = visible_options(parser)
        print(f"{len(shown):4} mcsd {name}: {' '.join(shown)}")
    print(f"{sum(len(visible_options(p)) for p in commands().values()):4} options over "
          f"{len(commands())} commands")
    counts = definitions()
    for path, n in counts.items():
        print(f"{n:4} add_argument calls in {path}")
    print(f"{sum(counts.values()):4} add_argument calls (issue 53 counted {DEFINITIONS_BEFORE})")
    sys.exit(0)
