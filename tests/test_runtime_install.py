"""The runtime installs without the training stack: decoding with a trained LightGBM stopper,
through `MCSDDecoder` and through `generate(custom_generate=...)`, imports none of the toolkit
extra's packages, and a command that needs one says which extra to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mcsd_runtime.cli import build_parser, run_parser
from mcsd_runtime.extras import TOOLKIT_MODULES

ROOT = Path(__file__).resolve().parents[1]
ARTIFACT = ROOT / "tests" / "fixtures" / "stoppers-b8df3aa" / "lightgbm"  # trained on make_pair()

# Runs with every toolkit package unimportable (None in sys.modules: `import pandas` raises,
# `importlib.util.find_spec("pandas")` answers None, as when it is not installed).
DECODE = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None
import torch
from conftest import make_pair
from mcsd_runtime import DecodeConfig, MCSDDecoder
from mcsd_runtime.integrations.hf import generate

pair, stopper, prompt = make_pair(), "stopper:{artifact}", [5, 6, 7, 8]
config = DecodeConfig(k_config=(4, 2, 2, 1), max_new_tokens=16)
ids = MCSDDecoder(pair, config, stopper).generate(prompt).token_ids
out = pair.target.generate(torch.tensor([prompt]), custom_generate=generate,
                           draft_model=pair.draft, k_config=(4, 2, 2, 1), stopper=stopper,
                           max_new_tokens=16, do_sample=False)
assert out[0, len(prompt):].tolist() == ids, (out, ids)
assert len(ids) == 16
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in {blocked!r}
                and sys.modules[m] is not None)
print("decoded", len(ids), "loaded", loaded)
"""


def test_decoding_with_a_trained_stopper_needs_no_toolkit_package():
    code = DECODE.format(blocked=TOOLKIT_MODULES, artifact=ARTIFACT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT / "tests", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "decoded 16 loaded []" in run.stdout


def test_a_command_missing_the_toolkit_says_which_extra_to_install(capsys):
    def register(sub):
        p = sub.add_parser("plot")
        p.set_defaults(func=lambda args: __import__("matplotlib_not_here"))

    def needs_pandas(args):
        raise ModuleNotFoundError("No module named 'pandas'", name="pandas")

    def register_pandas(sub):
        sub.add_parser("table").set_defaults(func=needs_pandas)

    parser = build_parser([register, register_pandas])
    assert run_parser(parser, ["table"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("mcsd: error: mcsd table: pandas is not installed: it comes with the "
                           "toolkit extra; install it with pip install 'mcsd-stoppers[toolkit]'")
    try:  # an unrelated missing module is not dressed up as a missing extra
        run_parser(parser, ["plot"])
    except ModuleNotFoundError as err:
        assert err.name == "matplotlib_not_here"
    else:
        raise AssertionError("the ModuleNotFoundError was swallowed")


def test_toolkit_commands_are_refused_before_any_work(monkeypatch, capsys, tmp_path):
    """Without matplotlib, `mcsd eval` stops before loading a pair or decoding a prompt."""
    import importlib.util

    from mcsd_runtime import cli
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    code = cli.main(["eval", "--target", str(tmp_path / "no-such-model"), "--methods", "ar",
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "mcsd eval needs matplotlib" in err and "pip install 'mcsd-stoppers[toolkit]'" in err
    assert not (tmp_path / "out").exists()
