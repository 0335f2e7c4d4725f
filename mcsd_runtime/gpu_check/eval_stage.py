"""An evaluation of the GPU check that keeps what it measured when it is stopped.

`python -m mcsd_runtime.gpu_check.eval_stage --records F.jsonl eval ARGS...` runs `mcsd eval
ARGS...` with one more observer of its interleaved loop (`evaluate.loop.RECORD_OBSERVERS`): each
method's record of each prompt is appended to `F.jsonl` as soon as it is decoded (method,
prompt, sample, new tokens, seconds, tokens/s, acceptance), so a stage stopped at its allowance
leaves every method's result so far; `figures.evaluation` reads them when `mcsd eval` did not
get to write its tables. `F.jsonl` starts empty at every run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KEYS = ("method", "prompt_id", "sample", "batch_id", "new_tokens", "wall_time", "prefill_time",
        "acceptance_rate", "target_calls")


def line(record) -> str:
    """One record as a JSON line: `KEYS` and its tokens/s."""
    row = {k: getattr(record, k, None) for k in KEYS}
    return json.dumps({**row, "tokens_per_s": record.tokens_per_s}) + "\n"


class Appender:
    """Appends each record it is told about to `path` (flushed at once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")

    def __call__(self, record) -> None:
        with self.path.open("a") as f:
            f.write(line(record))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mcsd_runtime.gpu_check.eval_stage",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=Path, required=True, help="JSONL file, appended as it goes")
    p.add_argument("command", nargs=argparse.REMAINDER, help="eval and its arguments")
    args = p.parse_args(argv)
    if not args.command or args.command[0] != "eval":
        p.error("give the mcsd command to run: eval ARGS...")
    from mcsd_runtime.cli import main as mcsd
    from mcsd_runtime.evaluate.loop import RECORD_OBSERVERS

    RECORD_OBSERVERS.append(Appender(args.records))
    return mcsd(args.command)


if __name__ == "__main__":
    raise SystemExit(main())
