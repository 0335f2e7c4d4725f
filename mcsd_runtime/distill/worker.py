"""Starting the processes that generate distillation data (`python -m
mcsd_runtime.distill.worker_process PLAN PARENT_PID`, see there) and watching the store for their
batches: a job's batch lands in the store as it finishes, which is the parent's progress.

The workers end with the parent. They stay in its process group, so that a terminal's Ctrl-C or
hang-up reaches them too; a SIGTERM or SIGHUP sent to the parent alone makes it stop its workers
and clean up before it exits (`stopping_on_signals`); and a parent killed outright (SIGKILL) is
noticed by each worker within a second (`worker_process.watch_parent`)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from mcsd_runtime.errors import MCSDError

POLL_SECONDS = 1.0
# how long a worker asked to stop (SIGTERM) has before it is killed
STOP_SECONDS = 10.0
# the signals that stop the parent and, through it, its workers
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                     if hasattr(signal, name))


class Stopped(BaseException):
    """A stop signal reached the parent while its workers ran (a BaseException, as
    KeyboardInterrupt is: no `except Exception` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def stopping_on_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """While the block runs, any of `signals` at its default disposition raises `Stopped` in
    it, so that its `finally` clauses run (the workers stopped, the plan and logs removed); the
    block then ends in SystemExit(128 + the signal's number), which unwinds the caller's clean-up
    too (a build's temporary folder). A signal ignored (`nohup`) or handled by the program is
    left as it is, and so is every signal outside the main thread, where handlers cannot be
    set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken = [s for s in signals if signal.getsignal(s) is signal.SIG_DFL]

    def stop(signum: int, frame) -> None:
        for s in taken:  # one stop: a second signal does not cut the clean-up short
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    for s in taken:
        signal.signal(s, stop)
    try:
        yield
    except Stopped as stopped:
        print(f"stopped by {signal.Signals(stopped.signum).name}: the data workers were "
              "stopped", file=sys.stderr, flush=True)
        raise SystemExit(128 + stopped.signum) from None
    finally:
        for s in taken:
            signal.signal(s, signal.SIG_DFL)


def run_workers(jobs: list, recipe, store, target_folder: Path, workers: int, bar=None) -> None:
    """Run `jobs` (data.Job) in `workers` processes until the store has them all."""
    with stopping_on_signals():
        _run_workers(jobs, recipe, store, target_folder, workers, bar)


def _run_workers(jobs: list, recipe, store, target_folder: Path, workers: int, bar) -> None:
    run = secrets.token_hex(4)
    plan = store.folder / f".plan-{run}.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    logs = [store.folder / f".worker-{run}-{i}.log" for i in range(workers)]
    procs = []
    try:
        torch.save({"jobs": jobs, "recipe": recipe, "store": str(store.folder),
                    "target": str(target_folder), "run": run}, plan)
        for log in logs:
            with log.open("w") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "mcsd_runtime.distill.worker_process", str(plan),
                     str(os.getpid())],
                    stdout=out, stderr=subprocess.STDOUT, env=env))
        done: set = set()
        while True:
            finished = [p.poll() is not None for p in procs]
            for job in jobs:
                key = (job.stream, job.batch)
                if key not in done and store.has(*key):
                    done.add(key)
                    if bar is not None:
                        bar.update(len(store.load(*key) or []))
            if all(finished):
                break
            time.sleep(POLL_SECONDS)
        failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode]
        missing = [j for j in jobs if not store.has(j.stream, j.batch)]
        if failed or missing:
            tail = logs[failed[0][0]].read_text()[-2000:] if failed else ""
            raise MCSDError(f"a data worker failed (exit codes {[c for _, c in failed]}, "
                            f"{len(missing)} batches missing); its log ends:\n{tail}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for path in [plan, *logs, *store.folder.glob(f".claim-{run}-*")]:
            path.unlink(missing_ok=True)
