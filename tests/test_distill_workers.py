"""The processes that generate distillation data end with their parent: one stopped with
SIGTERM stops them and cleans up, and they notice one killed outright (SIGKILL) themselves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcsd_runtime.distill import worker

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(),
                                reason="reads process states from /proc (Linux)")

# A parent with far more work than it gets time for (each job scores the same windows), which
# prints each worker's pid as it starts it.
PARENT = """
import sys
import torch
from pathlib import Path
from mcsd_runtime.distill import worker
from mcsd_runtime.distill.data import DataStore, Job
from mcsd_runtime.distill.recipe import get_recipe

popen = worker.subprocess.Popen
def announced(*args, **kwargs):
    proc = popen(*args, **kwargs)
    print(proc.pid, flush=True)
    return proc
worker.subprocess.Popen = announced
windows = torch.zeros(4, 32, dtype=torch.long)
jobs = [Job("text", i, "text", windows=windows) for i in range(100_000)]
worker.run_workers(jobs, get_recipe("tiny"), DataStore(Path(sys.argv[2])), Path(sys.argv[1]), 2)
"""
GONE_WITHIN_S = 15.0  # a second or two on a quiet machine


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by whoever adopted it, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_the_workers_end_with_their_parent(toy_tiny, tmp_path, sig):
    store = tmp_path / "store"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(toy_tiny / "target"),
                               str(store)], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        pids = [int(parent.stdout.readline()) for _ in range(2)]
        assert all(alive(pid) for pid in pids)
        parent.send_signal(sig)
        status = parent.wait(timeout=60)
        deadline = time.monotonic() + GONE_WITHIN_S
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in pids if alive(pid)]
        # SIGTERM: the parent stops its workers, cleans up and exits 128 + 15
        assert status == (128 + sig if sig == signal.SIGTERM else -sig)
        if sig == signal.SIGTERM:
            assert not list(store.glob(".*"))  # no plan, claims or worker logs left behind
    finally:
        for pid in [parent.pid, *pids]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        parent.wait()
        parent.stdout.close()


def test_a_signal_ignored_or_handled_by_the_program_is_left_alone():
    def mine(signum, frame):
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:
        with worker.stopping_on_signals((signal.SIGTERM,)):
            assert signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with worker.stopping_on_signals((signal.SIGTERM,)):
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
