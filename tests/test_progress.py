"""The shared progress helper: plain lines when not on a terminal, a tqdm bar on one."""

from __future__ import annotations

import io

from mcsd_runtime.progress import format_seconds, progress


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_lines_every_interval_with_counts_rate_and_time_left():
    clock, out = FakeClock(), io.StringIO()  # a StringIO is not a terminal
    bar = progress(total=100, desc="training", unit="step", file=out, min_interval=10,
                   clock=clock)
    for _ in range(9):
        clock.t += 3
        bar.set_postfix(loss=4.21875, lr=0.002)
        bar.update()
    lines = out.getvalue().splitlines()
    assert lines == [  # at 12 s (4 steps) and 24 s (8 steps): at most one line per 10 s
        "training: 4/100 steps (4%), 3.00 s/step, elapsed 12s, left ~4m48s, loss 4.219, lr 0.002",
        "training: 8/100 steps (8%), 3.00 s/step, elapsed 24s, left ~4m36s, loss 4.219, lr 0.002",
    ]
    bar.update(91)
    bar.close()
    bar.close()  # closing twice prints once
    last = out.getvalue().splitlines()[2:]
    assert len(last) == 1
    assert last[0].startswith("training: 100/100 steps (100%), 3.70 steps/s, elapsed 27s, done")


def test_iterating_closes_and_reports_a_stop_short_of_the_total():
    clock, out = FakeClock(), io.StringIO()
    items = []
    for x in progress(range(50), desc="eval", unit="prompt", file=out, min_interval=0,
                      clock=clock):
        clock.t += 2
        items.append(x)
        if x == 2:
            break
    lines = out.getvalue().splitlines()
    assert items == [0, 1, 2]
    # min_interval=0: a line per update (2 done before the break), then the closing line
    assert [ln.split(",")[0] for ln in lines] == ["eval: 1/50 prompts (2%)",
                                                  "eval: 2/50 prompts (4%)",
                                                  "eval: 2/50 prompts (4%)"]
    assert "left ~1m36s" in lines[1] and lines[2].endswith("stopped")


def test_unknown_total_disabled_and_terminal():
    clock, out = FakeClock(), io.StringIO()
    bar = progress(desc="collect", unit="row", file=out, min_interval=0, clock=clock)
    clock.t += 90
    bar.update(45)
    bar.close()
    assert out.getvalue() == "collect: 45 rows, 2.00 s/row, elapsed 1m30s\n"

    quiet = io.StringIO()
    bar = progress(total=3, desc="x", file=quiet, disable=True, min_interval=0)
    bar.update(3)
    bar.close()
    assert quiet.getvalue() == "" and bar.n == 3

    term = io.StringIO()
    with progress(total=3, desc="bar", unit="step", file=term, tty=True) as bar:
        bar.update(3)
        bar.set_postfix_str("ok")
    text = term.getvalue()
    assert "3/3" in text and "\r" in text and "left ~" not in text  # a tqdm bar, not lines


def test_format_seconds():
    assert [format_seconds(s) for s in (0, 42.4, 247, 3720, 90000)] == [
        "0s", "42s", "4m07s", "1h02m", "25h00m"]
