"""Progress of long stages: a tqdm bar on a terminal, plain dated lines in a log.

    bar = progress(total=640, desc="training", unit="step")
    for ...:
        bar.set_postfix(loss=4.21)
        bar.update()
    bar.close()

    for prompt in progress(prompts, desc="eval", unit="prompt"):  # closes itself at the end
        ...

`progress` accepts the subset of tqdm's interface the toolkit uses (iterable or `total`, `desc`,
`unit`, `disable`, `file`, `update`, `set_postfix_str`, `set_postfix`, `close`, use as a context
manager), so it replaces a `tqdm(...)` call as is. On a terminal it draws a tqdm bar. When the
stream is not a terminal (a log file, a pipe, CI) a bar is useless: tqdm would write every
redraw with carriage returns onto one line and Lightning draws its bar only at the end. There,
instead, it prints a line at most every `min_interval` seconds (30 by default, checked at each
update) and one when it closes ("done", or "stopped" short of the total):

    eval: 12/32 prompts (38%), 0.41 prompts/s, elapsed 29s, left ~49s, 1290 tokens

A stage says it is alive even while its first unit runs. In a log it prints a first line when
it starts (what, how many, an estimate when the caller has one), and a heartbeat thread prints
the progress line whenever `min_interval` seconds passed without one, so a stage whose units take
minutes still prints a line every `min_interval` seconds (elapsed time, units done). On a
terminal the heartbeat redraws the bar every second, so its elapsed time moves:

    generating data: 4200 seqs, started
    generating data: 0/4200 seqs (0%), elapsed 30s
    generating data: 40/4200 seqs (1%), 1.40 s/seq, elapsed 56s, left ~1h37m

`working(desc)` does the same for a stage without units (loading, measuring, installing):

    with working("measuring the draft on held-out sequences"):
        ...

`lightning_progress(desc)` is a Lightning callback that reports a Trainer's optimizer steps the
same way, with the logged metrics (losses) as the postfix.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cache
from typing import IO, Any

DEFAULT_INTERVAL = 30.0  # seconds between two lines when the output is not a terminal
CHECKS = 4  # the heartbeat looks this many times per interval whether a line is due
TERMINAL_REFRESH = 1.0  # seconds between two redraws of a bar by the heartbeat


class Heartbeat:
    """Calls `beat(owner)` every `every` seconds on a daemon thread until `stop()`, or until
    `owner` is gone (it is held weakly: a stage that is never closed stops beating once
    dropped) or `beat` raises (a closed stream)."""

    def __init__(self, owner: object, beat: Callable[[Any], None], every: float) -> None:
        self._stopped = threading.Event()
        ref, stopped = weakref.ref(owner), self._stopped

        def loop() -> None:
            while not stopped.wait(every):
                obj = ref()
                if obj is None:
                    return
                try:
                    beat(obj)
                except Exception:  # noqa: BLE001 - a heartbeat never takes the stage down
                    return
                del obj

        self._thread = threading.Thread(target=loop, name="progress-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No more beats (waits for one that is printing to finish)."""
        self._stopped.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)


def progress(iterable: Iterable | None = None, total: int | None = None, desc: str = "",
             unit: str = "it", **kwargs: Any) -> Progress:
    """A `Progress` (see the module's doc); keyword arguments as `Progress`."""
    return Progress(iterable, total=total, desc=desc, unit=unit, **kwargs)


class Progress:
    """Counts done units of a stage of `total` and shows it: a tqdm bar on a terminal, else a
    plain line every `min_interval` seconds and at `close` (done/total, rate, elapsed, estimated
    time left, the postfix).

    `file` defaults to sys.stderr; `tty` overrides the terminal check of `file`; `clock` is the
    time source (seconds; tests pass a fake one); `disable` shows nothing (counting goes on).
    `estimate`: the caller's guess of the stage's seconds, shown in the first line; `heartbeat`
    off: lines only at updates (no thread; tests with a fake clock).
    """

    def __init__(self, iterable: Iterable | None = None, total: int | None = None,
                 desc: str = "", unit: str = "it", *, file: IO[str] | None = None,
                 disable: bool = False, min_interval: float = DEFAULT_INTERVAL,
                 tty: bool | None = None, clock: Callable[[], float] = time.monotonic,
                 leave: bool = True, estimate: float | None = None, heartbeat: bool = True,
                 **_tqdm_only: Any) -> None:
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                total = None
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.file = file if file is not None else sys.stderr
        self.disable, self.min_interval, self._clock = disable, min_interval, clock
        self.n = 0
        self.postfix = ""
        self.start = clock()
        self._last_line = self.start
        self._printed_n: int | None = None
        self._closed = False
        self._bar = None
        self._lock = threading.RLock()
        self._heart: Heartbeat | None = None
        if not disable and (_isatty(self.file) if tty is None else tty):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.file, leave=leave,
                             dynamic_ncols=True)
        elif self.lines:
            print(self.start_line(estimate), file=self.file, flush=True)
        if not disable and heartbeat and min_interval > 0:
            every = TERMINAL_REFRESH if self._bar is not None else min_interval / CHECKS
            self._heart = Heartbeat(self, Progress._beat, every)

    @property
    def elapsed(self) -> float:
        """Seconds since the stage started."""
        return self._clock() - self.start

    @property
    def lines(self) -> bool:
        """True when progress is shown as plain lines (not a terminal, not disabled)."""
        return not self.disable and self._bar is None

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("this Progress has no iterable; call update() instead")
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        """`n` more units done."""
        with self._lock:
            self.n += n
            if self._bar is not None:
                self._bar.update(n)
            elif self.lines and self._clock() - self._last_line >= self.min_interval:
                self._print_line()

    def _beat(self) -> None:
        """The heartbeat: redraw the bar, or print the line if none for `min_interval`."""
        with self._lock:
            if self._closed:
                return
            if self._bar is not None:
                self._bar.refresh()
            elif self._clock() - self._last_line >= self.min_interval:
                self._print_line()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """Text shown after the counts (e.g. a loss or a throughput)."""
        self.postfix = s
        if self._bar is not None:
            self._bar.set_postfix_str(s, refresh=refresh)

    def set_postfix(self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        """`name value` pairs shown after the counts; floats with 4 significant digits."""
        items = {**(ordered_dict or {}), **kwargs}
        self.set_postfix_str(", ".join(f"{k} {_fmt_value(v)}" for k, v in items.items()),
                             refresh=refresh)

    def close(self) -> None:
        """End the stage: close the bar, or print the last line ("done", or "stopped" short of
        the total) unless the last line printed already said all of it."""
        if self._heart is not None:
            self._heart.stop()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._bar is not None:
                self._bar.close()
            elif self.lines and (self._printed_n != self.n or bool(self.total and
                                                                    self.n < self.total)):
                self._print_line()

    def start_line(self, estimate: float | None = None) -> str:
        """The first line: what the stage does and how much of it (and the caller's estimate)."""
        plural = self.unit if self.unit.endswith("s") else f"{self.unit}s"
        head = f"{self.desc}: {self.total} {plural}, started" if self.total else \
            f"{self.desc}: started"
        return head + (f", about {format_seconds(estimate)}" if estimate else "")

    def format_line(self) -> str:
        """The plain progress line for the current state."""
        elapsed = max(self.elapsed, 0.0)
        plural = self.unit if self.unit.endswith("s") else f"{self.unit}s"
        if self.total:
            parts = [f"{self.desc}: {self.n}/{self.total} {plural} "
                     f"({100 * self.n / self.total:.0f}%)"]
        else:
            parts = [f"{self.desc}: {self.n} {plural}"]
        rate = self.n / elapsed if elapsed > 0 else None
        if rate:
            parts.append(f"{rate:.2f} {plural}/s" if rate >= 1 else
                         f"{1 / rate:.2f} s/{self.unit}")
        parts.append(f"elapsed {format_seconds(elapsed)}")
        if self.total and self.n >= self.total:
            parts.append("done")
        elif self._closed:
            parts.append("stopped")  # early stopping, an error or an interrupt
        elif self.total and rate:
            parts.append(f"left ~{format_seconds((self.total - self.n) / rate)}")
        if self.postfix:
            parts.append(self.postfix)
        return ", ".join(parts)

    def _print_line(self) -> None:
        print(self.format_line(), file=self.file, flush=True)
        self._last_line = self._clock()
        self._printed_n = self.n


class _Working:
    """The lines of `working`: started, still working (each quiet `min_interval`), done."""

    def __init__(self, desc: str, file: IO[str], min_interval: float,
                 clock: Callable[[], float]) -> None:
        self.desc, self.file, self.min_interval, self._clock = desc, file, min_interval, clock
        self.start = self._last = clock()
        self.beats = 0
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        print(f"{self.desc}: {text}, elapsed {format_seconds(self._clock() - self.start)}",
              file=self.file, flush=True)

    def beat(self) -> None:
        with self._lock:
            if self._clock() - self._last >= self.min_interval:
                self.line("working")
                self._last, self.beats = self._clock(), self.beats + 1


@contextlib.contextmanager
def working(desc: str, estimate: float | None = None, *, file: IO[str] | None = None,
            min_interval: float = DEFAULT_INTERVAL, disable: bool = False,
            clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """A stage without units to count (loading, measuring, installing) that says it is alive: a
    line when it starts (with the caller's `estimate` of its seconds), a line each
    `min_interval` seconds while it runs, and, when any was printed, one when it ends ("done",
    or "stopped" on an exception). The lines go to `file` (default sys.stderr), on a terminal
    as in a log; `disable` prints nothing."""
    if disable:
        yield
        return
    state = _Working(desc, file if file is not None else sys.stderr, min_interval, clock)
    print(f"{desc}: started" + (f", about {format_seconds(estimate)}" if estimate else ""),
          file=state.file, flush=True)
    heart = Heartbeat(state, _Working.beat, min_interval / CHECKS) if min_interval > 0 else None
    ok = False
    try:
        yield
        ok = True
    finally:
        if heart is not None:
            heart.stop()
        if state.beats:
            state.line("done" if ok else "stopped")


def format_seconds(seconds: float) -> str:
    """42s, 4m07s, 1h02m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _fmt_value(v: Any) -> str:
    if hasattr(v, "item") and callable(v.item):  # a 0-d tensor or numpy scalar
        v = v.item()
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def lightning_progress(desc: str, metrics: Iterable[str] | None = None, **kwargs: Any):
    """A Lightning callback showing the Trainer's optimizer steps as `progress(desc, unit="step")`
    (total: `max_steps`, else the estimated steps of `max_epochs`) with the latest values of the
    logged `metrics` (all scalars when None; absent ones skipped) as the postfix; keyword
    arguments as `Progress`. Lightning's own bar should be off (`enable_progress_bar=False`)."""
    return _lightning_callback_class()(desc, tuple(metrics) if metrics is not None else None,
                                       kwargs)


@cache
def _lightning_callback_class() -> type:
    import lightning.pytorch as pl

    class LightningProgress(pl.Callback):
        def __init__(self, desc: str, metrics: tuple[str, ...] | None, kwargs: dict) -> None:
            self.desc, self.metrics, self.kwargs = desc, metrics, kwargs
            self.bar: Progress | None = None

        def on_train_start(self, trainer, pl_module) -> None:
            total = trainer.max_steps if trainer.max_steps > 0 else None
            if total is None:
                try:
                    total = int(trainer.estimated_stepping_batches)
                except (TypeError, ValueError, OverflowError):
                    total = None
            self.bar = Progress(total=total, desc=self.desc, unit="step", **self.kwargs)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if self.bar is None:
                return
            logged = trainer.callback_metrics
            names = self.metrics if self.metrics is not None else sorted(logged)
            values = {k: float(logged[k]) for k in names
                      if k in logged and getattr(logged[k], "numel", lambda: 1)() == 1}
            self.bar.set_postfix(values, refresh=False)
            self.bar.update(trainer.global_step - self.bar.n)

        def _close(self) -> None:
            if self.bar is not None:
                self.bar.close()
                self.bar = None

        def on_train_end(self, trainer, pl_module) -> None:
            self._close()

        def on_exception(self, trainer, pl_module, exception) -> None:
            self._close()

    return LightningProgress
