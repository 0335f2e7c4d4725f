"""The shared progress helper: plain lines when not on a terminal, a tqdm bar on one, and a
heartbeat that keeps a stage talking while its units take long (short intervals here)."""

from __future__ import annotations

import contextlib
import gc
import io
import threading
import time

import numpy as np
import pytest

from mcsd_runtime import progress as progress_module
from mcsd_runtime.progress import format_seconds, progress, working


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_lines_every_interval_with_counts_rate_and_time_left():
    clock, out = FakeClock(), io.StringIO()  # a StringIO is not a terminal
    bar = progress(total=100, desc="training", unit="step", file=out, min_interval=10,
                   clock=clock, heartbeat=False, estimate=300)
    for _ in range(9):
        clock.t += 3
        bar.set_postfix(loss=4.21875, lr=0.002)
        bar.update()
    lines = out.getvalue().splitlines()
    assert lines == [  # at 12 s (4 steps) and 24 s (8 steps): at most one line per 10 s
        "training: 100 steps, started, about 5m00s",
        "training: 4/100 steps (4%), 3.00 s/step, elapsed 12s, left ~4m48s, loss 4.219, lr 0.002",
        "training: 8/100 steps (8%), 3.00 s/step, elapsed 24s, left ~4m36s, loss 4.219, lr 0.002",
    ]
    bar.update(91)
    bar.close()
    bar.close()  # closing twice prints once
    last = out.getvalue().splitlines()[3:]
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
    assert [ln.split(",")[0] for ln in lines] == ["eval: 50 prompts",
                                                  "eval: 1/50 prompts (2%)",
                                                  "eval: 2/50 prompts (4%)",
                                                  "eval: 2/50 prompts (4%)"]
    assert "left ~1m36s" in lines[2] and lines[3].endswith("stopped")


def test_unknown_total_disabled_and_terminal():
    clock, out = FakeClock(), io.StringIO()
    bar = progress(desc="collect", unit="row", file=out, min_interval=0, clock=clock)
    clock.t += 90
    bar.update(45)
    bar.close()
    assert out.getvalue() == ("collect: started\n"
                              "collect: 45 rows, 2.00 s/row, elapsed 1m30s\n")

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


def _wait_for(cond, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)


def test_a_stage_talks_while_its_first_unit_runs():
    out = io.StringIO()
    bar = progress(total=4, desc="generating data", unit="seq", file=out, min_interval=0.1)
    assert out.getvalue() == "generating data: 4 seqs, started\n"  # at once
    _wait_for(lambda: out.getvalue().count("\n") >= 3)  # no unit done: heartbeats
    beats = out.getvalue().splitlines()[1:]
    assert len(beats) >= 2
    assert all(b.startswith("generating data: 0/4 seqs (0%), elapsed ") for b in beats)
    bar.update(4)
    bar.close()
    n = len(out.getvalue().splitlines())
    assert "done" in out.getvalue().splitlines()[-1]
    time.sleep(0.3)
    assert len(out.getvalue().splitlines()) == n  # closed: no more beats


def test_the_heartbeat_waits_for_a_quiet_interval():
    clock, out = FakeClock(), io.StringIO()
    bar = progress(total=9, desc="x", file=out, min_interval=10, clock=clock, heartbeat=False)
    bar._beat()  # a beat 0 s after the start line: nothing due
    clock.t += 9
    bar._beat()
    assert out.getvalue().count("\n") == 1
    clock.t += 1
    bar._beat()  # 10 s quiet: a line
    clock.t += 5
    bar._beat()
    assert out.getvalue().splitlines()[1:] == ["x: 0/9 its (0%), elapsed 10s"]
    bar.close()


def test_a_terminal_bar_is_redrawn_while_nothing_is_done(monkeypatch):
    monkeypatch.setattr(progress_module, "TERMINAL_REFRESH", 0.05)
    term = io.StringIO()
    with progress(total=3, desc="bar", file=term, tty=True):
        drawn = term.getvalue().count("\r")
        _wait_for(lambda: term.getvalue().count("\r") >= drawn + 3)
        assert term.getvalue().count("\r") >= drawn + 3


def test_a_dropped_stage_stops_beating():
    out = io.StringIO()
    bar = progress(total=3, desc="lost", file=out, min_interval=0.05)
    thread = bar._heart._thread
    del bar
    gc.collect()
    thread.join(timeout=2)
    assert not thread.is_alive()


def test_working_says_it_started_is_working_and_is_done():
    out = io.StringIO()
    with working("measuring the draft", estimate=150, file=out, min_interval=0.1):
        _wait_for(lambda: out.getvalue().count("\n") >= 3)
    lines = out.getvalue().splitlines()
    assert lines[0] == "measuring the draft: started, about 2m30s"
    assert all(ln.startswith("measuring the draft: working, elapsed ") for ln in lines[1:-1])
    assert lines[-1].startswith("measuring the draft: done, elapsed ")

    quick = io.StringIO()
    with working("loading", file=quick):
        pass
    assert quick.getvalue() == "loading: started\n"  # no heartbeat printed: no end line

    failed = io.StringIO()
    with pytest.raises(KeyError), working("install", file=failed, min_interval=0.05):
        _wait_for(lambda: failed.getvalue().count("\n") >= 2)
        raise KeyError("x")
    assert failed.getvalue().splitlines()[-1].startswith("install: stopped, elapsed ")


class TimedLog(io.StringIO):
    """A log file (not a terminal) that notes when each line arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        self.times += [time.monotonic()] * text.count("\n")
        return super().write(text)


def _heartbeats() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "progress-heartbeat"}


@pytest.mark.parametrize("fails", [False, True])
def test_a_long_call_beats_each_interval_into_a_log_and_leaves_no_thread(fails):
    """A stage whose one call sleeps through several intervals: its start line at once, then a
    line within each interval (the heartbeat checks CHECKS times per interval), then its end
    line; on an exception too, after which no heartbeat thread is left running."""
    interval, before, log = 0.3, _heartbeats(), TimedLog()
    start = time.monotonic()
    with pytest.raises(KeyError) if fails else contextlib.nullcontext(), working(
            "fitting LightGBM on 1000 rows", file=log, min_interval=interval):
        time.sleep(5 * interval)
        if fails:
            raise KeyError("boom")
    lines = log.getvalue().splitlines()
    assert lines[0] == "fitting LightGBM on 1000 rows: started"
    assert all(ln.startswith("fitting LightGBM on 1000 rows: working, elapsed ")
               for ln in lines[1:-1]) and len(lines) >= 4
    assert lines[-1].startswith(f"fitting LightGBM on 1000 rows: "
                                f"{'stopped' if fails else 'done'}, elapsed ")
    gaps = np.diff([start, *log.times[:-1]])
    assert gaps.max() < interval * (1 + 1 / progress_module.CHECKS) + 0.4, gaps  # load: slack
    assert _heartbeats() <= before
